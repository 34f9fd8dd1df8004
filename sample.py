"""
Sample text from a trained model.

    python sample.py --out_dir=out                    # the best model (best.pt)
    python sample.py --out_dir=out --checkpoint=latest  # where the run is now (latest.pt)
    python sample.py --out_dir=out --start="ROMEO:" --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out --start=FILE:prompt.txt --temperature=0   # greedy
    python sample.py --out_dir=out --stop="\\n\\n" --num_samples=1  # end at the first blank line
    python sample.py --out_dir=out --interactive
"""

import sys
from dataclasses import dataclass
from typing import Literal

from gptkit.base.errors import UserError, run_main  # first: a Ctrl-C while torch loads is one line too
import torch

from gptkit.base.settings import check_seed, check_threads, parse_config, require
from gptkit.data.conversations import shown, typed
from gptkit.machine.precision import DTYPES, pick_decode_dtype, pick_dtype
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.machine.threads import pick_decode_threads
from gptkit.run.run_folder import check_checkpoint, load_model
from gptkit.sampling.decoding import StopFilter, generate_stream, lay_out_for_decoding, why_it_sees_ahead
from gptkit.sampling.prompts import read_prompt, unescape


@dataclass
class SampleConfig:
    out_dir: str = "out"  # the run's folder
    # 'best' (best.pt: lowest val loss), 'latest' (latest.pt) or 'iter:N' (a snapshot)
    checkpoint: str = "best"
    # prompt text (\n, \t typed in a shell are read as newline, tab), or FILE:path to read it from
    start: str = "\n"
    num_samples: int = 10  # samples, generated together as one batch
    max_new_tokens: int = 500  # tokens generated per sample
    temperature: float = 0.8  # 1 = the model's distribution, lower = safer, 0 = greedy
    top_k: int = 200  # sample only from the k likeliest tokens (0 = off)
    top_p: float = 1.0  # sample only from the smallest set with this total probability (1 = off)
    stop: str = ""  # end a sample where this text appears (e.g. "\n\n"); '' = never
    seed: int = 1337  # the same seed gives the same text
    device: str = "auto"  # 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
    # the weights' precision; auto: the faster here
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    kv_cache: bool = True  # False recomputes the whole context every token (for checks)
    interactive: bool = False  # read prompts from the terminal until Ctrl-D
    threads: int = 0  # torch CPU threads (0 = measured: more than 1 only where clearly faster now)

    def __post_init__(self):
        require(self, ["num_samples"], lambda v: v >= 1, "at least 1")
        require(self, ["max_new_tokens", "threads", "temperature", "top_k"],
                lambda v: v >= 0, "at least 0")
        require(self, ["top_p"], lambda v: 0 < v <= 1, "in (0, 1]")
        check_seed(self.seed)
        check_threads(self.threads)
        check_device_name(self.device)
        check_checkpoint(self.checkpoint)


EMPTY_PROMPT = "the prompt is empty: pass some text with --start"


def generate_texts(model, tok, prompt, cfg, stop="", stream=None):
    """Generate num_samples continuations as one batch, each ending where the stop text appears,
    streaming the first as it is sampled; a chat model's markers read and written by their names (<|end|>)."""
    # looked up now: a redirected stdout is honoured
    stream = sys.stdout if stream is None else stream
    show = shown if tok.chat else str
    ids = tok.encode(typed(tok, prompt))
    if not ids:
        raise UserError(EMPTY_PROMPT)
    device = next(model.parameters()).device
    # repeated by torch, not as a Python list: a num_samples no memory holds fails at once, naming
    # its size
    idx = torch.tensor([ids], dtype=torch.long, device=device).repeat(cfg.num_samples, 1)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    decoders = [tok.stream_decoder() for _ in range(cfg.num_samples)]
    filters = [StopFilter(stop) for _ in range(cfg.num_samples)]
    texts = [""] * cfg.num_samples
    stream.write(show(prompt))
    tokens = generate_stream(model, idx, cfg.max_new_tokens, temperature=cfg.temperature,
                             top_k=cfg.top_k, top_p=cfg.top_p, kv_cache=cfg.kv_cache,
                             generator=generator, vocab_size=tok.vocab_size)
    for column in tokens:
        for row, token in enumerate(column[:, 0].tolist()):
            piece = filters[row].feed(decoders[row](token))
            texts[row] += piece
            if row == 0 and piece:
                stream.write(show(piece))
                stream.flush()
        if all(f.done for f in filters):
            break
    for row, f in enumerate(filters):
        tail = f.flush()
        texts[row] += tail
        if row == 0:
            stream.write(show(tail))
    return [show(prompt + t) for t in texts]


def main(argv=None):
    cfg = parse_config(SampleConfig, sys.argv[1:] if argv is None else argv, prog="sample.py")
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.out_dir, device, cfg.checkpoint)
    if device == "cpu":
        lay_out_for_decoding(model)
    prompts = iter(read_interactive, None) if cfg.interactive else [read_prompt(cfg.start)]
    # a prompt the vocabulary cannot encode, or none, and a precision the device lacks fail before any measuring
    if not cfg.interactive and not tok.encode(typed(tok, prompts[0])):
        raise UserError(EMPTY_PROMPT)
    if cfg.dtype != "auto":
        pick_dtype(cfg.dtype, device)
    _, why = pick_decode_threads(cfg.threads, model, device, cfg.num_samples)
    if why and not cfg.threads:
        print(why, file=sys.stderr, flush=True)
    dtype, why = pick_decode_dtype(cfg.dtype, model, device, cfg.num_samples)
    if cfg.dtype == "auto":
        print(why, file=sys.stderr, flush=True)
    model = model.to(DTYPES[dtype])
    # the encoder rung of the attention lab, or a mask taken out by hand: let the learner see what it writes
    if why := why_it_sees_ahead(model):
        print(f"warning: {why}, so it learned to read the next token from its input; generating, it has no next "
              "token to read, and its text is garbage", file=sys.stderr, flush=True)
    stop = typed(tok, unescape(cfg.stop))
    for prompt in prompts:
        try:
            if cfg.interactive:  # a line that is not UTF-8 is a bad prompt too: asked again
                prompt = unescape(prompt, "the prompt") or "\n"
            texts = generate_texts(model, tok, prompt, cfg, stop)
        except UserError as e:
            if not cfg.interactive:
                raise
            print(f"error: {e}", file=sys.stderr, flush=True)  # a bad prompt: ask for another
            continue
        except KeyboardInterrupt:
            if not cfg.interactive:
                raise
            print("\n(interrupted)", flush=True)  # Ctrl-C ends this continuation, not the session
            continue
        print("\n---------------")
        for text in texts[1:]:
            print(text)
            print("---------------")


def read_interactive():
    try:
        return input("\nprompt> ")
    except (EOFError, KeyboardInterrupt):  # Ctrl-D (or Ctrl-C) at the prompt ends the session
        print()
        return None


if __name__ == "__main__":
    run_main(main, memory_settings=("num_samples", "max_new_tokens"))
