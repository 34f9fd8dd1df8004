"""The explorer: a local web page over the runs in a folder, where a learner watches a model write token by token
and sees where every number comes from: the candidates for each token, every head's attention, what each layer
would predict (the logit lens), and how surprised the model is by a text. A FastAPI app; explore.py serves it.

Every number comes from the model's own forward pass (gptkit.inspection) and its own sampler (gptkit.decoding):
the page does no model arithmetic."""

import copy
import ctypes
import json
import math
import mimetypes
import stat
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, Field, field_validator

from gptkit.checkpoint import MODEL_KEYS, load_checkpoint, model_config, model_from_checkpoint
from gptkit.dataset import file_identity
from gptkit.decoding import StopFilter, decode_steps, lay_out_for_decoding, shaped_probs
from gptkit.errors import UserError, first_line
from gptkit.explorer_experiments import (Off, OffRequest, ScoresRequest, head_scores_at, heads_report, lab_curves,
                                         off_of)
from gptkit.explorer_guard import Guard, own_names
from gptkit.inspection import attention_maps, logit_lens, look_inside, read_out, surprise_bits, token_label
from gptkit.lab import RUNGS
from gptkit.metrics import read_metrics, wall_clock
from gptkit.runtime import DTYPES
from gptkit.timing import pick_decode_dtype, pick_decode_threads
from gptkit.tokenizer import describe_vocabulary, tokenizer_from_meta
from model import GPTConfig

STATIC = Path(__file__).resolve().parent / "explorer_static"
MAX_PROMPT_CHARS = 20_000
MAX_NEW_TOKENS = 2_000
LOADED_AT_ONCE = 4  # models kept in memory; the least recently picked one is dropped first
FLUSH_SECONDS = 0.015  # after the first token, tokens are sent in small groups: each write costs more than a step


class ApiError(Exception):
    """A request the explorer refuses: an HTTP status and one line."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------- runs


CHECKPOINTS = ("best.pt", "ckpt.pt", "latest.pt")  # the first there is what the explorer opens


def checkpoint_of(folder):
    """The checkpoint the explorer opens of a run folder: best.pt (or an earlier version's ckpt.pt), else latest.pt
    (a run that has not finished an evaluation yet); None when there is none. An error reading the folder other
    than 'not there' (no permission) is raised: the folder may hold a run."""
    for name in CHECKPOINTS:
        try:
            if stat.S_ISREG((folder / name).stat().st_mode):
                return folder / name
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def child_run(root, child):
    """The resolved folder of root's child when it is a run of root (a link leading out of root is not), the
    child itself when it cannot be read (its summary says why), else None."""
    try:
        if not child.is_dir() or not child.resolve().is_relative_to(root):
            return None
        return child.resolve() if checkpoint_of(child) else None
    except OSError:
        return child


def find_runs(root):
    """{name: folder} as the root is now: the root itself when it is a run (named as its folder), else every run
    folder directly inside it. Raises OSError when the root cannot be read."""
    root = Path(root).resolve()
    if checkpoint_of(root):
        return {root.name: root}
    found = {child.name: child_run(root, child) for child in sorted(root.iterdir())}
    return {name: folder for name, folder in found.items() if folder is not None}


def find_run(root, name):
    """The folder of the run named name as the root is now, or None: one name, never a path."""
    root = Path(root).resolve()
    if checkpoint_of(root):
        return root if name == root.name else None
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return None
    return child_run(root, root / name)


def inside(path, folder):
    """path, refused in one line when it is a link leading out of folder: a run's files are read from its own."""
    if not path.resolve().is_relative_to(Path(folder).resolve()):
        raise UserError(f"{path.name} is a link leading out of the run's folder; the explorer reads only the files "
                        "inside it")
    return path


def shown(name):
    """A folder's name as the page shows it: a name that is not UTF-8 text (Linux allows any bytes) with its
    bad bytes replaced, which JSON and URLs can carry."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def number(value):
    """A finite number, else None: a hand-edited metrics.jsonl may hold NaN, Infinity or text where one goes."""
    return value if type(value) in (int, float) and math.isfinite(value) else None


def describe(c):
    """A model's settings in words, e.g. '4 layers, 4 heads, width 128, scaled dot-product attention, ...'."""
    if c.n_layer == 0:
        return f"a bigram table: no attention, width {c.n_embd}"
    kinds = {"scaled": "scaled dot-product attention", "dot": "dot-product attention without the 1/√d scale",
             "uniform": "uniform attention (an average of the past)", "additive": "additive (Bahdanau) attention"}
    positions = {"learned": "learned positions", "rope": "rotary positions", "none": "no positions"}
    words = [f"{c.n_layer} layer{'s' * (c.n_layer > 1)}", f"{c.n_head} head{'s' * (c.n_head > 1)}",
             f"width {c.n_embd}", kinds[c.attention], "causal (a decoder)" if c.causal else "not causal (an encoder)",
             positions[c.pos_emb], f"context {c.block_size}"]
    if not c.mlp:
        words.append("no MLP")
    return ", ".join(words)


def attention_note(c):
    if c.n_layer == 0:
        return "a bigram model has no attention: each prediction comes from the current token alone"
    if not c.causal:
        return ("this model was trained without the causal mask: each token also attends to the tokens after it, "
                "the very ones it must predict, so it learned to copy the answer; that is cheating, and it fails "
                "when the model writes, where no later token exists yet")
    if c.attention == "uniform":
        return "uniform attention: every token a position can see gets the same weight, 1 / (how many it sees)"
    return None


@dataclass
class Summary:
    """What the runs list shows of a run, read from its checkpoint and metrics.jsonl."""

    name: str
    folder: Path
    checkpoint: Path = None
    config: GPTConfig = None
    params: int = 0
    tokenizer: str = ""
    tokenizer_kind: str = ""  # 'char', 'bpe' or 'tiktoken'
    error: str = None
    identity: tuple = None  # the checkpoint file's identity when read: another one is read again

    def to_json(self):
        out = {"name": shown(self.name), "error": self.error, "settings": None, "params": None, "iterations": None,
               "final_val_loss": None, "bits_per_char": None, "tokenizer": self.tokenizer,
               "tokenizer_kind": self.tokenizer_kind, "rung": lab_rung(self.folder), "health": None,
               "checkpoint": None, "metrics_error": None}
        if self.error is None:
            out.update(settings=describe(self.config), params=self.params, checkpoint=self.checkpoint.name,
                       **finished(self.folder, self.tokenizer_kind))
        return out


def finished(folder, tokenizer_kind):
    """The last iteration and the final val loss (the whole-split score, else the last evaluation) a run logged,
    its final score in bits per character, what its health record said (train.py's overfitting warning), if it
    wrote one, and why its metrics.jsonl cannot be read, if it cannot: the run still opens."""
    try:
        records = run_records(folder)
    except UserError as e:
        return {"metrics_error": first_line(e)}
    iters = [r["iter"] for r in records if type(r.get("iter")) is int]
    losses = {kind: [v for r in records if r.get("kind") == kind and (v := number(r.get("val_loss"))) is not None]
              for kind in ("final", "eval")}
    health = [r for r in records if r.get("kind") == "health"]
    finals = [r for r in records if r.get("kind") == "final"]
    return {"iterations": max(iters, default=None),
            "final_val_loss": (losses["final"] or losses["eval"] or [None])[-1],
            "bits_per_char": final_bits_per_char(finals[-1], tokenizer_kind) if finals else None,
            "health": health_note(health[-1]) if health else None}


def final_bits_per_char(record, tokenizer_kind):
    """A final score in bits per character: what train.py logged beside it (gptkit.dataset.bits_per_char, from
    the dataset's characters), or for a char-level run from before it logged that, the loss over ln 2 (a token
    is a character); None where the run's dataset did not count its characters."""
    logged, loss = number(record.get("bits_per_char")), number(record.get("val_loss"))
    if logged is None and tokenizer_kind == "char" and loss is not None:
        return loss / math.log(2)
    return logged


def run_records(folder):
    """The records of a run's metrics.jsonl, none when it has none; one line when they cannot be read."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    inside(path, folder)
    return read_metrics(folder)


def health_note(record):
    """The health record as the run card's note; None for one not of the shape train.py writes."""
    it, best_iter, best_loss, why = (record.get(k) for k in ("iter", "best_iter", "best_val_loss", "overfitting"))
    if type(it) is not int or type(best_iter) is not int or number(best_loss) is None or not isinstance(why, str):
        return None
    return f"overfitting from iteration {it:,}: {why}. best.pt keeps iteration {best_iter:,} (val loss {best_loss:.4f})"


def lab_rung(folder):
    """{'name', 'step', 'adds', 'cheats'} of the attention lab's rung this run folder is (its lab.json names it),
    step counted along the lab's path from the bigram; None for any other run."""
    try:
        name = json.loads(inside(folder / "lab.json", folder).read_text(encoding="utf-8"))["rung"]
        step, rung = next((i, r) for i, r in enumerate(RUNGS) if r.name == name)
    except (OSError, UserError, ValueError, KeyError, TypeError, StopIteration, RecursionError):
        return None
    return {"name": rung.name, "step": step, "adds": rung.adds, "cheats": rung.cheats}


def identity_of(folder):
    """(path, file identity) of the checkpoint a run opens, or None when it cannot be told."""
    try:
        path = checkpoint_of(folder)
        return (path, file_identity(path.stat())) if path else None
    except OSError:
        return None


def summarize(name, folder):
    """A run's summary, or its error as one line: a damaged, foreign or unreadable run does not stop the others."""
    identity = None
    try:
        if shown(name) != name:
            raise UserError("its folder's name is not UTF-8 text, which the page cannot ask for; rename the folder")
        path = checkpoint_of(folder)
        if path is None:
            raise UserError(f"no checkpoint in {folder} any more")
        inside(path, folder)
        identity = identity_of(folder)
        ckpt = load_checkpoint(path, required=MODEL_KEYS)
        config = model_config(ckpt, path)
        params = sum(t.numel() for k, t in ckpt["model"].items() if k != "transformer.wpe.weight")
        if config.tie_weights:
            params -= ckpt["model"]["lm_head.weight"].numel()
        return Summary(name, folder, path, config, params, describe_vocabulary(ckpt["tokenizer"]),
                       ckpt["tokenizer"]["tokenizer"], identity=identity)
    except OSError as e:
        return Summary(name, folder, error=f"cannot read {e.filename or folder} ({e.strerror or e})")
    except (UserError, ValueError, KeyError, TypeError) as e:
        return Summary(name, folder, error=str(e).splitlines()[0] if str(e) else type(e).__name__, identity=identity)


def glibc():
    """The C library when it is glibc (Linux), whose malloc_trim and mallopt the shelf uses; else None."""
    try:
        libc = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


GLIBC = glibc()
M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def bound_freed_memory():
    """Keep the memory glibc holds freed but not given back bounded. It gives each thread that allocates an arena
    of its own, which keeps what was freed there, and the server's worker threads (dozens, under load) take turns
    on the models (the shelf's lock): two arenas serve them as well."""
    if GLIBC is not None:
        GLIBC.mallopt(M_ARENA_MAX, 2)


def give_back_memory():
    """Hand the memory of a model just dropped back to the system: glibc would keep it for reuse, and each load
    of another run would leave megabytes behind (bench.py explore measures the server's memory under load)."""
    if GLIBC is not None:
        GLIBC.malloc_trim(0)


@dataclass
class Loaded:
    """A picked run: its model in float32 for analysis, a copy laid out for decoding, and its tokenizer."""

    summary: Summary
    model: torch.nn.Module
    decoder: torch.nn.Module
    tok: object
    decoding: str  # which precision decodes, and why


class Shelf:
    """The runs under the root folder as they are now (a run trained after start-up is there, a checkpoint
    replaced is read again), each loaded when first picked and kept while recently used."""

    def __init__(self, root, device, dtype="auto"):
        self.root, self.device, self.dtype = Path(root), device, dtype
        self.known = {}  # name -> its Summary, kept while its checkpoint file is the same file
        self.known_lock = threading.Lock()
        self.loaded = OrderedDict()
        self.lock = threading.Lock()  # one forward pass at a time: requests share the models and the threads
        bound_freed_memory()

    def current(self, name, folder):
        """The run's summary, read again only when its checkpoint is another file (or the same rewritten)."""
        with self.known_lock:
            old = self.known.get(name)
        identity = identity_of(folder)
        if old is None or old.folder != folder or identity is None or old.identity != identity:
            old = summarize(name, folder)
            with self.known_lock:
                self.known[name] = old
        return old

    def summaries(self):
        """Every run under the root, as it is now."""
        runs = self.scan(find_runs, self.root)
        with self.known_lock:  # runs gone are forgotten
            self.known = {name: s for name, s in self.known.items() if name in runs}
        return [self.current(name, folder) for name, folder in runs.items()]

    def scan(self, how, *args):
        try:
            return how(*args)
        except OSError as e:
            raise ApiError(409, f"cannot read {e.filename or self.root} ({e.strerror or e})") from None

    def summary(self, name):
        folder = self.scan(find_run, self.root, name)
        if folder is None:
            raise ApiError(404, f"no run named {name!r} in {self.root}")
        summary = self.current(name, folder)
        if summary.error:
            raise ApiError(409, f"run {name!r} cannot be opened: {summary.error}")
        return summary

    def get(self, name):
        summary = self.summary(name)
        with self.lock:
            if name not in self.loaded or self.loaded[name].summary is not summary:
                replaced = name in self.loaded
                self.loaded[name] = self.load(summary)
                while len(self.loaded) > LOADED_AT_ONCE:
                    self.loaded.popitem(last=False)
                    replaced = True
                if replaced:
                    give_back_memory()
            self.loaded.move_to_end(name)
            return self.loaded[name]

    def load(self, summary):
        """The model and tokenizer of the very checkpoint the summary read."""
        try:
            ckpt = load_checkpoint(summary.checkpoint, required=MODEL_KEYS)
            model = model_from_checkpoint(ckpt, summary.checkpoint).to(self.device).eval()
            tok = tokenizer_from_meta(ckpt["tokenizer"])
        except UserError as e:
            raise ApiError(409, f"run {summary.name!r} cannot be opened: {e}") from None
        decoder = copy.deepcopy(model)
        if self.device == "cpu":
            lay_out_for_decoding(decoder)
        _, threads = pick_decode_threads(0, decoder, self.device)  # as sample.py: one thread unless clearly faster
        dtype, why = pick_decode_dtype(self.dtype, decoder, self.device)
        return Loaded(summary, model, decoder.to(DTYPES[dtype]), tok, "; ".join(w for w in (why, threads) if w))


# ----------------------------------------------------------------------------- requests


class Knobs(BaseModel):
    """The sampling settings, with sample.py's meanings; ranges a page can ask for without breaking the sampler."""

    temperature: float = Field(0.8, ge=0, le=10)
    top_k: int = Field(200, ge=0, le=1_000_000)
    top_p: float = Field(1.0, gt=0, le=1)

    @field_validator("temperature")
    @classmethod
    def greedy_or_workable(cls, v):
        if 0 < v < 1e-3:
            raise ValueError("must be 0 (greedy) or at least 0.001")
        return v


class GenerateRequest(Knobs, OffRequest):
    run: str
    prompt: str = Field("\n", min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: int = Field(1337, ge=0, lt=2 ** 31)
    max_tokens: int = Field(200, ge=1, le=MAX_NEW_TOKENS)
    stop: str = Field("", max_length=200)


class ReadRequest(OffRequest):
    run: str
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)


class PositionRequest(Knobs, OffRequest):
    run: str
    ids: list[int] = Field(min_length=1, max_length=100_000)
    position: int = Field(ge=0)
    k: int = Field(10, ge=1, le=100)


class MapRequest(OffRequest):
    run: str
    ids: list[int] = Field(min_length=1, max_length=100_000)
    layer: int = Field(ge=0)
    head: int = Field(ge=0)


def encode(loaded, text):
    try:
        ids = loaded.tok.encode(text)
    except UserError as e:
        raise ApiError(400, str(e)) from None
    if not ids:
        raise ApiError(400, "the text is empty")
    return ids


def checked_ids(loaded, ids):
    """Token ids as a (1, T) tensor, refused when the model cannot read them in one window."""
    block, vocab = loaded.model.config.block_size, loaded.tok.vocab_size
    if len(ids) > block:
        raise ApiError(400, f"{len(ids)} tokens is more than the model's context of {block}; send at most {block}")
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the vocabulary (0 to {vocab - 1})")
    return torch.tensor([ids], dtype=torch.long, device=next(loaded.model.parameters()).device)


def token_json(tok, token):
    """A token as the page shows it: its id, its own text (a byte-level BPE token holding part of a character's
    bytes decodes to U+FFFD there) and its label, which writes those bytes as ⟨e4⟩."""
    return {"id": token, "text": tok.decode([token]), "label": token_label(tok, token)}


def top(tok, probs, k):
    """The k likeliest real tokens of a (V,) distribution (a vocabulary padded for speed has rows no tokenizer
    can decode), each with its probability."""
    values, ids = probs[:tok.vocab_size].float().topk(min(k, tok.vocab_size))
    return [dict(token_json(tok, i), p=round(p, 6)) for i, p in zip(ids.tolist(), values.tolist())]


# ----------------------------------------------------------------------------- generation


def generation_events(shelf, loaded, ids, req, off=Off()):
    """The events of one generation: the prompt's tokens, each new token with the probability the model gave it,
    then the end. Decoding runs step by step under the shelf's lock, with the parts `off` names switched off for
    that step, and only while the client reads: a client that goes away stops the generation at its next step."""
    tok = loaded.tok
    device = next(loaded.decoder.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    yield {"type": "prompt", "tokens": [token_json(tok, t) for t in ids]}
    generator = torch.Generator(device=device).manual_seed(req.seed)  # as sample.py: one seeded generator
    steps = decode_steps(loaded.decoder, idx, req.max_tokens, temperature=req.temperature, top_k=req.top_k,
                         top_p=req.top_p, generator=generator, vocab_size=tok.vocab_size)
    text_of, stop, text, reason = tok.stream_decoder(), StopFilter(req.stop), "", "max_tokens"
    while True:
        with shelf.lock, off.on(loaded.decoder):
            step = next(steps, None)
        if step is None:
            break
        token, logits, shaped = step[0].item(), step[1][0].float(), step[2]
        p = torch.softmax(logits, -1)[token].item()
        p_shaped = 1.0 if shaped is None else shaped[0, token].item()  # greedy: all of it on this token
        piece = text_of(token)
        text += stop.feed(piece)
        if stop.done:
            reason = "stop"
            break
        # the chip is the token itself; the text, whose characters may span tokens, comes whole at the end
        yield dict(token_json(tok, token), type="token", p=round(p, 6), p_shaped=round(p_shaped, 6))
    yield {"type": "done", "reason": reason, "text": text + stop.flush()}


def sse(events):
    """Server-sent events, flushed as soon as the first token is out and then every FLUSH_SECONDS."""
    pending, last, tokens = [], 0.0, 0
    for event in events:
        pending.append(f"data: {json.dumps(event)}\n\n")
        tokens += event["type"] == "token"
        now = time.perf_counter()
        if event["type"] != "token" or tokens == 1 or now - last >= FLUSH_SECONDS:
            yield "".join(pending)
            pending, last = [], now
    if pending:
        yield "".join(pending)


# ----------------------------------------------------------------------------- analysis


def read_text(shelf, loaded, text, off=Off()):
    """Every token of text with its surprise in bits under the model (teacher-forced), and the totals. A text
    longer than the context is read in consecutive windows, as train.py scores the val split: each token is
    scored once, from the tokens before it in its window."""
    ids = encode(loaded, text)
    block, bits = loaded.model.config.block_size, []
    for start in range(0, len(ids) - 1, block):
        targets = checked_ids(loaded, ids[start + 1:start + 1 + block])
        inputs = checked_ids(loaded, ids[start:start + targets.size(1)])
        with shelf.lock, off.on(loaded.model):
            bits += surprise_bits(loaded.model, inputs, targets)[0].tolist()
    total = sum(bits)
    # per character of the text the model predicted: the first token's characters have no prediction, and a
    # BPE token may hold several (or part of one: a character counts where its first byte is)
    predicted = loaded.tok.chars_spelled(ids[1:])
    return {"tokens": [dict(token_json(loaded.tok, t), surprise_bits=None if i == 0 else round(bits[i - 1], 6))
                       for i, t in enumerate(ids)],
            "total_bits": total, "chars": len(text), "predicted_chars": predicted,
            "bits_per_char": total / predicted if predicted else None,
            "loss": total * math.log(2) / len(bits) if bits else None, "tokenizer_kind": loaded.tok.kind,
            "off": off.to_json()}


def position_report(shelf, loaded, req, off=Off()):
    """For token req.position of req.ids: the candidates that predicted it (at temperature 1 and as sampling
    shapes them), how much it attends to every token, and what each layer's residual stream predicts next."""
    if req.position >= len(req.ids):
        raise ApiError(400, f"position {req.position} is past the last of {len(req.ids)} tokens")
    idx, tok, c = checked_ids(loaded, req.ids), loaded.tok, loaded.model.config
    with shelf.lock, off.on(loaded.model):
        streams, maps = look_inside(loaded.model, idx)  # one pass for the candidates, the attention and the lens
        logits = read_out(loaded.model, streams[-1])
        lens = logit_lens(loaded.model, streams, req.position)
    why = {"note": None, "surprise_bits": None, "raw": [], "shaped": []}
    if req.position == 0:
        why["note"] = "the first token has no prediction: nothing comes before it"
    else:
        before = logits[0, req.position - 1].float()
        probs = torch.softmax(before, -1)
        why.update(surprise_bits=-torch.log2(probs[req.ids[req.position]]).item(), raw=top(tok, probs, req.k),
                   shaped=top(tok, shaped_probs(before[None, :tok.vocab_size], req.temperature, req.top_k,
                                                req.top_p)[0], req.k))
    rows = [[[round(w, 6) for w in m[0, h, req.position].tolist()] for h in range(c.n_head)] for m in maps]
    names = ["embeddings", *[f"after layer {i}" for i in range(c.n_layer)]]  # layers count from 0, as L0H3 does
    names[-1] += " (the model's prediction)"
    return {"position": req.position, "token": token_json(tok, req.ids[req.position]), "why": why,
            "attention": {"note": attention_note(c), "layers": len(maps), "heads": c.n_head if maps else 0,
                          "rows": rows},
            "lens": [{"name": name, "top": top(tok, p, 5)} for name, p in zip(names, lens)], "off": off.to_json()}


def attention_map(shelf, loaded, req, off=Off()):
    idx, c = checked_ids(loaded, req.ids), loaded.model.config
    if not req.layer < c.n_layer or not req.head < c.n_head:
        raise ApiError(400, f"no head {req.head} in layer {req.layer}: the model has {c.n_layer} layers of "
                            f"{c.n_head} heads")
    with shelf.lock, off.on(loaded.model):
        weights = attention_maps(loaded.model, idx)[req.layer][0, req.head]
    return {"weights": [[round(w, 6) for w in row] for row in weights.tolist()],
            "labels": [token_label(loaded.tok, t) for t in req.ids], "off": off.to_json()}


# ----------------------------------------------------------------------------- the app


def run_metrics(summary):
    """A run's train and eval records for its loss curves, times on one wall clock; a value that is not a finite
    number is a gap in its curve."""
    try:
        records = run_records(summary.folder)
    except UserError as e:
        raise ApiError(409, str(e)) from None
    train, evals, final = [], [], None
    for r, t in zip(records, wall_clock(records)):
        if r.get("kind") == "train":
            train.append({"iter": r["iter"], "loss": number(r["loss"]), "time": round(t, 3)})
        elif r.get("kind") == "eval":
            evals.append({"iter": r["iter"], "train_loss": number(r.get("train_loss")),
                          "val_loss": number(r["val_loss"]), "time": round(t, 3)})
        elif r.get("kind") == "final":
            final = {"val_loss": number(r.get("val_loss")),
                     "bits_per_char": final_bits_per_char(r, summary.tokenizer_kind)}
    return {"train": train, "eval": evals, "final": final}


def picked(name, loaded):
    c = loaded.model.config
    return {"name": name, "settings": describe(c), "n_layer": c.n_layer, "n_head": c.n_head,
            "block_size": c.block_size, "attention": c.attention, "causal": c.causal,
            "vocab_size": loaded.tok.vocab_size, "tokenizer": loaded.summary.tokenizer,
            "tokenizer_kind": loaded.tok.kind,
            "decode": loaded.decoding, "note": attention_note(c), "mlp": bool(c.mlp)}


def body_refused(e):
    """The one line for a request body FastAPI could not parse (it raises HTTPException from the cause)."""
    cause = e.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not UTF-8 text ({cause.reason} at byte {cause.start}); send JSON"
    if isinstance(cause, RecursionError):
        return "the request body is nested too deeply to read; send the JSON the page sends"
    return f"the request body could not be read ({first_line(cause)}); send JSON" if cause else str(e.detail)


def make_app(shelf, host="127.0.0.1", port=8000, bound=None):
    """The explorer's FastAPI app over a Shelf of runs, answering at port on the names of host, the address it is
    bound to (bound, default host) and this machine's loopback (see gptkit/explorer_guard.py)."""
    app = FastAPI(title="gptkit explorer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, names=own_names(host, bound or host), port=port)
    mimetypes.add_type("text/javascript", ".js")  # modules run only if served so; Windows may map .js otherwise
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    add_error_handlers(app)

    @app.get("/")
    def index():
        return FileResponse(STATIC / "index.html")

    @app.get("/api/runs")
    def runs():
        found = [s.to_json() for s in shelf.summaries()]
        # the lab's rungs in the order of its path, as its table lists them; other runs by name, after them
        found.sort(key=lambda r: (r["rung"] is None, r["rung"]["step"] if r["rung"] else 0, r["name"]))
        return {"root": shown(str(shelf.root)), "runs": found}

    # a run's name is one folder's name, never a path: any character but '/' (a newline too) reaches it
    @app.get("/api/runs/{name}/metrics")
    def metrics(name: str):
        return run_metrics(shelf.summary(name))

    @app.get("/api/runs/{name}")
    def pick(name: str):
        return picked(name, shelf.get(name))

    @app.post("/api/generate")
    def generate(req: GenerateRequest):
        loaded = shelf.get(req.run)
        ids, off = encode(loaded, req.prompt), off_of(loaded.model, req.off)
        return StreamingResponse(sse(generation_events(shelf, loaded, ids, req, off)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/api/read")
    def read(req: ReadRequest):
        loaded = shelf.get(req.run)
        off = off_of(loaded.model, req.off)
        answer = read_text(shelf, loaded, req.text, off)
        if off.names:  # and the intact model's reading, for the difference token by token
            answer["intact"] = read_text(shelf, loaded, req.text)
        return answer

    @app.post("/api/position")
    def position(req: PositionRequest):
        loaded = shelf.get(req.run)
        return position_report(shelf, loaded, req, off_of(loaded.model, req.off))

    @app.post("/api/attention_map")
    def head_map(req: MapRequest):
        loaded = shelf.get(req.run)
        return attention_map(shelf, loaded, req, off_of(loaded.model, req.off))

    add_experiment_routes(app, shelf)
    return app


def add_experiment_routes(app, shelf):
    """The experiments' own routes (gptkit/explorer_experiments.py): heads' labels, one head's scores, the lab."""

    @app.get("/api/runs/{name}/heads")
    def labels(name: str):
        loaded = shelf.get(name)
        with shelf.lock:
            return heads_report(loaded.model, loaded.tok, lambda: load_checkpoint(loaded.summary.checkpoint))

    @app.post("/api/scores")
    def scores(req: ScoresRequest):
        loaded = shelf.get(req.run)
        idx, off = checked_ids(loaded, req.ids), off_of(loaded.model, req.off)
        with shelf.lock, off.on(loaded.model):
            return dict(head_scores_at(loaded.model, idx, req.layer, req.head, req.position), off=off.to_json())

    @app.get("/api/lab")
    def lab():
        def metrics(summary):
            try:
                return run_metrics(summary)
            except ApiError as e:
                return str(e)
        rungs = [(s, lab_rung(s.folder)) for s in shelf.summaries() if not s.error]
        return {"runs": lab_curves([(shown(s.name), rung, metrics(s)) for s, rung in rungs if rung])}


def add_error_handlers(app):
    """Every refusal as the page reads it: a 4xx and {"error": "one line"}, never FastAPI's {"detail": ...}."""

    @app.exception_handler(ApiError)
    def refused(request: Request, e: ApiError):
        return JSONResponse({"error": str(e)}, status_code=e.status)

    @app.exception_handler(UserError)
    def user_error(request: Request, e: UserError):  # what the model refuses to do (a head it lacks): one line
        return JSONResponse({"error": first_line(e)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            return JSONResponse({"error": f"the request body is not JSON ({first['ctx']['error']} at character "
                                          f"{first['loc'][-1]})"}, status_code=400)
        where = ".".join(str(part) for part in first["loc"] if part != "body") or "the request body"
        return JSONResponse({"error": f"{where}: {first['msg']}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            line = f"nothing at {request.url.path}"
        elif e.status_code == 405:
            line = f"{request.url.path} does not take {request.method} requests"
        else:
            line = body_refused(e) if e.status_code == 400 else str(e.detail)
        return JSONResponse({"error": line}, status_code=e.status_code, headers=e.headers)
