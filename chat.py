"""
Talk to a model fine-tuned for chat, and score it on problems it never trained on.

    python chat.py --out_dir=out-chat                          # an interactive chat (Ctrl-D ends it)
    python chat.py --out_dir=out-chat --prompt="123+456"       # answer once
    python chat.py --out_dir=out-chat --eval                   # accuracy on each task's held-out problems
    python chat.py --out_dir=out-chat --eval --samples=64 --json   # and pass@1, pass@8, pass@64, as JSON
    python chat.py --out_dir=out-chat --eval --problems=mine.jsonl # your conversations, each last answer the reference
    python chat.py --report=out,out-chat,out-lora,out-rl       # the report card: one column a stage
"""

import json
import sys
import time
from dataclasses import dataclass

from gptkit.base.errors import UserError, run_main  # first: a Ctrl-C while torch loads is one line too
import torch

from gptkit.base.settings import check_seed, check_threads, comma_items, parse_config, require
from gptkit.chat.answering import check_chat_model, end_id, next_answer_prompt
from gptkit.data.chat_preparing import PREPARE_TASKS
from gptkit.data.conversations import shown
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.machine.threads import pick_decode_threads
from gptkit.run.run_folder import RunDir, check_checkpoint, model_of, refuse_a_file
from gptkit.sampling.decoding import decode_steps, lay_out_for_decoding

MAX_SAMPLES = 1024  # answers per problem: pass@512 is the largest k reported, more only cost time


@dataclass
class ChatConfig:
    out_dir: str = "out-chat"  # the run to talk to or score
    checkpoint: str = "best"  # 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (a snapshot)
    prompt: str = ""  # answer this once and exit ('' = an interactive chat)
    eval: bool = False  # score the run on its dataset's held-out problems (or --problems)
    tasks: str = ""  # with --eval or --report: the tasks to score, comma-separated ('' = all the dataset holds)
    problems: str = ""  # with --eval: a .jsonl of conversations to score; each one's last answer is the reference
    # with --eval or --report: answers sampled per problem for pass@k (1: the greedy answer only; 0: that with
    # --eval, 8 with --report, whose card shows pass@8)
    samples: int = 0
    limit: int = 0  # with --eval or --report: score at most this many problems of each task (0 = all)
    json: bool = False  # with --eval or --report: print JSON instead of a table
    report: str = ""  # run folders, comma-separated: the report card, a column each (e.g. out,out-chat,out-rl)
    max_new_tokens: int = 64  # the longest answer
    temperature: float = 0.8  # 1 = the model's distribution, lower = safer, 0 = greedy (pass@k samples at this)
    top_k: int = 0  # sample only from the k likeliest tokens (0 = off)
    top_p: float = 1.0  # sample only from the smallest set with this total probability (1 = off)
    seed: int = 1337  # the same seed gives the same answers
    device: str = "auto"  # 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
    threads: int = 0  # torch CPU threads (0 = measured: more than 1 only where clearly faster now)

    def __post_init__(self):
        require(self, ["max_new_tokens"], lambda v: v >= 1, "at least 1")
        require(self, ["limit", "temperature", "top_k", "threads"], lambda v: v >= 0, "at least 0")
        require(self, ["samples"], lambda v: 0 <= v <= MAX_SAMPLES, f"from 0 to {MAX_SAMPLES}")
        require(self, ["top_p"], lambda v: 0 < v <= 1, "in (0, 1]")
        check_seed(self.seed)
        check_threads(self.threads)
        check_device_name(self.device)
        check_checkpoint(self.checkpoint)
        if self.prompt.isspace():  # the interactive chat passes a blank line by: there is no question in it
            raise ValueError("prompt holds only whitespace: give the question to answer, or leave --prompt out to talk")
        if self.problems and not (self.eval or self.report):
            raise ValueError("--problems names conversations to score: add --eval")
        if self.problems and self.tasks:
            raise ValueError("--problems scores the conversations of its file, --tasks the dataset's held-out "
                             "problems: give one of them")
        others = [f"--{name}" for name in ("eval", "prompt", "problems") if self.report and getattr(self, name)]
        if others:
            raise ValueError(f"--report scores each stage on its dataset's held-out problems itself: leave out "
                             f"{' and '.join(others)}")
        if self.eval and self.prompt:
            raise ValueError("--prompt answers one question, --eval scores the held-out problems: give one of them")
        scoring = [f"--{name}" for name in ("tasks", "samples", "limit", "json") if getattr(self, name)]
        if scoring and not (self.eval or self.report):
            raise ValueError(f"{' and '.join(scoring)} {'goes' if len(scoring) == 1 else 'go'} with --eval or "
                             "--report, which score a run; a chat or --prompt answers as it samples")
        for name in ("tasks", "report"):
            value = getattr(self, name)
            if value and not comma_items(value):
                raise ValueError(f"{name} names nothing between its commas (got {value!r})")
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(f"samples={self.samples} answers at temperature 0 are the same greedy one each time: "
                             "pass@k needs a temperature above 0 (e.g. --temperature=1.0)")

    def sampled(self):
        """Answers sampled per problem for pass@k: none where the greedy answer is scored alone (samples=1, and 0
        with --eval; the report card samples 8 unless at temperature 0)."""
        samples = self.samples or (8 if self.report and self.temperature > 0 else 1)
        return samples if samples > 1 else 0


def evaluate(cfg, model, tok, ckpt):
    """Score the run: each task's held-out problems (or the --problems file), and its loss on the plain val text
    its dataset mixed in; a table, or JSON."""
    # scoring reads datasets and tasks: imported where it runs, so that a chat's first token waits for none of it
    from gptkit.base.progress import progress
    from gptkit.chat.report import chat_sets
    from gptkit.chat.scoring import answers_to_write, file_problems, ks_for, score, scoring_threads, text_loss

    problems, text = chat_sets(ckpt, cfg.tasks, file_problems(cfg.problems, tok) if cfg.problems else None)
    if not problems:
        raise UserError(f"{cfg.out_dir}'s dataset holds no held-out problems: score conversations of your own "
                        "with --problems=FILE.jsonl")
    if cfg.limit:
        problems = {name: items[:cfg.limit] for name, items in problems.items()}
    say_threads(cfg, scoring_threads(cfg.threads, model, problems, cfg.sampled())[1])
    say = None if cfg.json else lambda name, r: bar.write(line_of(name, r), file=sys.stdout)
    with progress(total=answers_to_write(problems, cfg.sampled()), desc="answering", unit="answer", leave=False) as bar:
        if say:
            ks = ks_for(cfg.sampled()) if cfg.sampled() else []
            bar.write(f"| task | problems | accuracy{''.join(f' | pass@{k}' for k in ks)} |\n"
                      f"|---|---|---{'|---' * len(ks)}|", file=sys.stdout)
        results = score(model, tok, problems, cfg.sampled(), cfg.temperature, cfg.max_new_tokens, cfg.seed, say,
                        bar.update)
    loss = text_loss(model, tok, text) if text else None
    if cfg.json:
        print(json.dumps({"tasks": {name: {**r, "pass_at": r.get("pass_at", {})} for name, r in results.items()},
                          "text_val_loss": loss}))
    elif loss is not None:
        print(f"plain text val loss: {loss:.4f}")


def say_threads(cfg, why):
    """The line saying why the threads picked for decoding are that many, unless they were given."""
    if why and not cfg.threads:
        print(why, file=sys.stderr, flush=True)


def line_of(name, result):
    passes = "".join(f" | {100 * v:.1f}%" for v in result.get("pass_at", {}).values())
    return f"| {name} | {result['n']:,} | {100 * result['accuracy']:.1f}%{passes} |"


def talk(cfg, model, tok, text, history, lead=""):
    """Answer `text`, the user's next turn after `history` (the conversation so far), streaming the answer as
    it is sampled after `lead`; the conversation with both turns."""
    messages = history + [{"role": "user", "content": text}]
    # a question the vocabulary cannot spell stops here, before any answer begins
    ids, cut = next_answer_prompt(tok, messages, model.config.block_size)
    if cut:
        print(cut, file=sys.stderr, flush=True)
    sys.stdout.write(lead)
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    generator = torch.Generator(device=idx.device).manual_seed(cfg.seed)
    decode, answer = tok.stream_decoder(), []
    for column, _, _ in decode_steps(model, idx, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                                     generator=generator, vocab_size=tok.vocab_size):
        token = int(column[0, 0])
        if token == end_id(tok):
            break
        answer.append(token)
        sys.stdout.write(shown(decode(token)))
        sys.stdout.flush()
    print()
    return messages + [{"role": "assistant", "content": tok.decode(answer) or " "}]


def converse(cfg, model, tok):
    """The interactive chat: one question a line until Ctrl-D; a question the vocabulary cannot spell is said
    and another asked."""
    history, first = [], True
    while True:
        try:
            text = input("you> ").removesuffix("\r")  # a line piped from a Windows file
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if first:  # a file saved by Windows' Notepad opens with a byte-order mark, no character of the question
            text, first = text.removeprefix("\ufeff"), False
        if not text.strip():
            continue
        if any("\udc80" <= c <= "\udcff" for c in text):  # bytes stdin could not decode, kept as surrogates
            print("error: the question is not UTF-8 text", file=sys.stderr, flush=True)
            continue
        try:
            history = talk(cfg, model, tok, text, history, lead="model> ")
        except UserError as e:
            print(f"\nerror: {e}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print("\n(interrupted)", flush=True)


def main(argv=None):
    started = time.time()
    cfg = parse_config(ChatConfig, sys.argv[1:] if argv is None else argv, prog="chat.py")
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if cfg.report:
        from gptkit.chat.report import card_json, card_table, report_card

        columns = report_card(cfg, device)
        print(card_json(columns) if cfg.json else card_table(columns, cfg.sampled()))
        return
    run = RunDir(cfg.out_dir)
    refuse_a_file(cfg.out_dir, "out_dir", "checkpoint")
    if run.shown() is None and not cfg.checkpoint.startswith("iter:"):
        raise UserError(f"{cfg.out_dir} holds no run: fine-tune one for chat there first, e.g. `{PREPARE_TASKS}` "
                        f"then `python train.py config/chat_sft.py --out_dir={cfg.out_dir}`")
    model, tok, ckpt = model_of(cfg.out_dir, cfg.checkpoint, device)
    check_chat_model(tok, cfg.out_dir)
    if device == "cpu":
        lay_out_for_decoding(model)
    if cfg.eval:
        evaluate(cfg, model, tok, ckpt)
        return
    if cfg.prompt:  # a question the vocabulary cannot spell is the one line, before the threads are measured
        next_answer_prompt(tok, [{"role": "user", "content": cfg.prompt}], model.config.block_size)
    say_threads(cfg, pick_decode_threads(cfg.threads, model, device, 1)[1])
    if cfg.prompt:
        talk(cfg, model, tok, cfg.prompt, [])
    else:
        print(f"{cfg.out_dir}: a chat model ({time.time() - started:.1f} s to load); ask it something, Ctrl-D "
              "ends", flush=True)
        converse(cfg, model, tok)


if __name__ == "__main__":
    run_main(main, memory_settings=("samples", "max_new_tokens"))
