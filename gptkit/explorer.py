"""The explorer: a local web page over the runs in a folder, where a learner watches a model write token by token
and sees where every number comes from: the candidates for each token, every head's attention, what each layer
would predict (the logit lens), and how surprised the model is by a text. A FastAPI app; explore.py serves it.

Every number comes from the model's own forward pass (gptkit.inspection) and its own sampler (gptkit.decoding):
the page does no model arithmetic."""

import copy
import json
import math
import mimetypes
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
from pydantic import BaseModel, Field, field_validator

from gptkit.checkpoint import MODEL_KEYS, load_checkpoint, model_config
from gptkit.decoding import StopFilter, decode_steps, lay_out_for_decoding, shaped_probs
from gptkit.errors import UserError
from gptkit.inspection import attention_maps, logit_lens, look_inside, read_out, surprise_bits, token_label
from gptkit.lab import RUNGS
from gptkit.metrics import read_metrics, wall_clock
from gptkit.rundir import RunDir, load_model
from gptkit.runtime import DTYPES
from gptkit.timing import pick_decode_dtype, pick_decode_threads
from gptkit.tokenizer import describe_vocabulary
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


def is_run(folder):
    return any((folder / name).is_file() for name in ("best.pt", "latest.pt", "ckpt.pt"))


def find_runs(root):
    """{name: folder}: the root itself when it is a run (named as its folder), else every run folder directly
    inside it. A folder that is a link leading out of the root is not a run of this root."""
    root = Path(root).resolve()
    if is_run(root):
        return {root.name: root}
    runs = {}
    for child in sorted(root.iterdir()):
        if child.is_dir() and child.resolve().is_relative_to(root) and is_run(child):
            runs[child.name] = child.resolve()
    return runs


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
    error: str = None

    def to_json(self):
        out = {"name": self.name, "error": self.error, "settings": None, "params": None, "iterations": None,
               "final_val_loss": None, "tokenizer": self.tokenizer, "rung": lab_rung(self.folder), "health": None}
        if self.error is None:
            out.update(settings=describe(self.config), params=self.params, **finished(self.folder))
        return out


def finished(folder):
    """The last iteration and the final val loss (the whole-split score, else the last evaluation) a run logged,
    and what its health record said (train.py's overfitting warning), if it wrote one."""
    try:
        records = read_metrics(folder)
    except UserError:
        return {"iterations": None, "final_val_loss": None}
    iters = [r["iter"] for r in records if "iter" in r]
    final = [r["val_loss"] for r in records if r.get("kind") == "final"]
    evals = [r["val_loss"] for r in records if r.get("kind") == "eval"]
    health = [r for r in records if r.get("kind") == "health"]
    return {"iterations": max(iters, default=None), "final_val_loss": (final or evals or [None])[-1],
            "health": health_note(health[-1]) if health else None}


def health_note(record):
    """The health record as the run card's note."""
    return (f"overfitting from iteration {record['iter']:,}: {record['overfitting']}. best.pt keeps iteration "
            f"{record['best_iter']:,} (val loss {record['best_val_loss']:.4f})")


def lab_rung(folder):
    """{'name', 'step', 'adds', 'cheats'} of the attention lab's rung this run folder is (its lab.json names it),
    step counted along the lab's path from the bigram; None for any other run."""
    try:
        name = json.loads((folder / "lab.json").read_text(encoding="utf-8"))["rung"]
        step, rung = next((i, r) for i, r in enumerate(RUNGS) if r.name == name)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None
    return {"name": rung.name, "step": step, "adds": rung.adds, "cheats": rung.cheats}


def summarize(name, folder):
    """A run's summary, or its error as one line: a damaged or foreign checkpoint does not stop the others."""
    try:
        run = RunDir(folder)
        path = run.model_file("best" if (run.best.exists() or run.legacy.exists()) else "latest")
        ckpt = load_checkpoint(path, required=MODEL_KEYS)
        config = model_config(ckpt, path)
        params = sum(t.numel() for k, t in ckpt["model"].items() if k != "transformer.wpe.weight")
        if config.tie_weights:
            params -= ckpt["model"]["lm_head.weight"].numel()
        return Summary(name, folder, path, config, params, describe_vocabulary(ckpt["tokenizer"]))
    except (UserError, ValueError, KeyError, TypeError) as e:
        return Summary(name, folder, error=str(e).splitlines()[0] if str(e) else type(e).__name__)


@dataclass
class Loaded:
    """A picked run: its model in float32 for analysis, a copy laid out for decoding, and its tokenizer."""

    summary: Summary
    model: torch.nn.Module
    decoder: torch.nn.Module
    tok: object
    decoding: str  # which precision decodes, and why


class Shelf:
    """The runs under the root folder, each loaded when first picked and kept while recently used."""

    def __init__(self, root, device, dtype="auto"):
        self.root, self.device, self.dtype = Path(root), device, dtype
        self.summaries = {name: summarize(name, folder) for name, folder in find_runs(root).items()}
        self.loaded = OrderedDict()
        self.lock = threading.Lock()  # one forward pass at a time: requests share the models and the threads

    def summary(self, name):
        if name not in self.summaries:
            raise ApiError(404, f"no run named {name!r} in {self.root}")
        summary = self.summaries[name]
        if summary.error:
            raise ApiError(409, f"run {name!r} cannot be opened: {summary.error}")
        return summary

    def get(self, name):
        summary = self.summary(name)
        with self.lock:
            if name not in self.loaded:
                self.loaded[name] = self.load(summary)
                while len(self.loaded) > LOADED_AT_ONCE:
                    self.loaded.popitem(last=False)
            self.loaded.move_to_end(name)
            return self.loaded[name]

    def load(self, summary):
        which = "latest" if summary.checkpoint.name == "latest.pt" else "best"
        try:
            model, tok = load_model(summary.folder, self.device, which)
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


class GenerateRequest(Knobs):
    run: str
    prompt: str = Field("\n", min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: int = Field(1337, ge=0, lt=2 ** 31)
    max_tokens: int = Field(200, ge=1, le=MAX_NEW_TOKENS)
    stop: str = Field("", max_length=200)


class ReadRequest(BaseModel):
    run: str
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)


class PositionRequest(Knobs):
    run: str
    ids: list[int] = Field(min_length=1, max_length=100_000)
    position: int = Field(ge=0)
    k: int = Field(10, ge=1, le=100)


class MapRequest(BaseModel):
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


def token_json(tok, token, text=None):
    return {"id": token, "text": tok.decode([token]) if text is None else text, "label": token_label(tok, token)}


def top(tok, probs, k):
    """The k likeliest real tokens of a (V,) distribution (a vocabulary padded for speed has rows no tokenizer
    can decode), each with its probability."""
    values, ids = probs[:tok.vocab_size].float().topk(min(k, tok.vocab_size))
    return [dict(token_json(tok, i), p=round(p, 6)) for i, p in zip(ids.tolist(), values.tolist())]


# ----------------------------------------------------------------------------- generation


def generation_events(shelf, loaded, ids, req):
    """The events of one generation: the prompt's tokens, each new token with the probability the model gave it,
    then the end. Decoding runs step by step under the shelf's lock, and only while the client
    reads: a client that goes away stops the generation at its next step."""
    tok = loaded.tok
    device = next(loaded.decoder.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    prompt_decoder = tok.stream_decoder()
    yield {"type": "prompt", "tokens": [token_json(tok, t, prompt_decoder(t)) for t in ids]}
    generator = torch.Generator(device=device).manual_seed(req.seed)  # as sample.py: one seeded generator
    steps = decode_steps(loaded.decoder, idx, req.max_tokens, temperature=req.temperature, top_k=req.top_k,
                         top_p=req.top_p, generator=generator, vocab_size=tok.vocab_size)
    text_of, stop, text, reason = tok.stream_decoder(), StopFilter(req.stop), "", "max_tokens"
    while True:
        with shelf.lock:
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
        yield dict(token_json(tok, token, piece), type="token", p=round(p, 6), p_shaped=round(p_shaped, 6))
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


def read_text(shelf, loaded, text):
    """Every token of text with its surprise in bits under the model (teacher-forced), and the totals. A text
    longer than the context is read in consecutive windows, as train.py scores the val split: each token is
    scored once, from the tokens before it in its window."""
    ids = encode(loaded, text)
    block, bits = loaded.model.config.block_size, []
    for start in range(0, len(ids) - 1, block):
        targets = checked_ids(loaded, ids[start + 1:start + 1 + block])
        inputs = checked_ids(loaded, ids[start:start + targets.size(1)])
        with shelf.lock:
            bits += surprise_bits(loaded.model, inputs, targets)[0].tolist()
    total = sum(bits)
    return {"tokens": [dict(token_json(loaded.tok, t), surprise_bits=None if i == 0 else round(bits[i - 1], 6))
                       for i, t in enumerate(ids)],
            "total_bits": total, "chars": len(text), "bits_per_char": total / len(text),
            "loss": total * math.log(2) / len(bits) if bits else None}



def position_report(shelf, loaded, req):
    """For token req.position of req.ids: the candidates that predicted it (at temperature 1 and as sampling
    shapes them), how much it attends to every token, and what each layer's residual stream predicts next."""
    if req.position >= len(req.ids):
        raise ApiError(400, f"position {req.position} is past the last of {len(req.ids)} tokens")
    idx, tok, c = checked_ids(loaded, req.ids), loaded.tok, loaded.model.config
    with shelf.lock:
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
            "lens": [{"name": name, "top": top(tok, p, 5)} for name, p in zip(names, lens)]}


def attention_map(shelf, loaded, req):
    idx, c = checked_ids(loaded, req.ids), loaded.model.config
    if not req.layer < c.n_layer or not req.head < c.n_head:
        raise ApiError(400, f"no head {req.head} in layer {req.layer}: the model has {c.n_layer} layers of "
                            f"{c.n_head} heads")
    with shelf.lock:
        weights = attention_maps(loaded.model, idx)[req.layer][0, req.head]
    return {"weights": [[round(w, 6) for w in row] for row in weights.tolist()],
            "labels": [token_label(loaded.tok, t) for t in req.ids]}


# ----------------------------------------------------------------------------- the app


def run_metrics(summary):
    """A run's train and eval records for its loss curves, times on one wall clock."""
    try:
        records = read_metrics(summary.folder)
    except UserError as e:
        raise ApiError(409, str(e)) from None
    train, evals = [], []
    for r, t in zip(records, wall_clock(records)):
        if r.get("kind") == "train":
            train.append({"iter": r["iter"], "loss": r["loss"], "time": round(t, 3)})
        elif r.get("kind") == "eval":
            evals.append({"iter": r["iter"], "train_loss": r.get("train_loss"), "val_loss": r["val_loss"],
                          "time": round(t, 3)})
    return {"train": train, "eval": evals}


def picked(name, loaded):
    c = loaded.model.config
    return {"name": name, "settings": describe(c), "n_layer": c.n_layer, "n_head": c.n_head,
            "block_size": c.block_size, "attention": c.attention, "causal": c.causal,
            "vocab_size": loaded.tok.vocab_size, "tokenizer": loaded.summary.tokenizer,
            "decode": loaded.decoding, "note": attention_note(c)}


def make_app(shelf):
    """The explorer's FastAPI app over a Shelf of runs."""
    app = FastAPI(title="gptkit explorer", docs_url=None, redoc_url=None, openapi_url=None)
    mimetypes.add_type("text/javascript", ".js")  # modules run only if served so; Windows may map .js otherwise
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ApiError)
    def refused(request: Request, e: ApiError):
        return JSONResponse({"error": str(e)}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body") or "the request"
        return JSONResponse({"error": f"{where}: {first['msg']}"}, status_code=422)

    @app.get("/")
    def index():
        return FileResponse(STATIC / "index.html")

    @app.get("/api/runs")
    def runs():
        listed = [s.to_json() for s in shelf.summaries.values()]
        # the lab's rungs in the order of its path, as its table lists them; other runs by name, after them
        listed.sort(key=lambda r: (r["rung"] is None, r["rung"]["step"] if r["rung"] else 0, r["name"]))
        return {"root": str(shelf.root), "runs": listed}

    @app.get("/api/runs/{name:path}/metrics")
    def metrics(name: str):
        return run_metrics(shelf.summary(name))

    @app.get("/api/runs/{name:path}")
    def pick(name: str):
        return picked(name, shelf.get(name))

    @app.post("/api/generate")
    def generate(req: GenerateRequest):
        loaded = shelf.get(req.run)
        ids = encode(loaded, req.prompt)
        return StreamingResponse(sse(generation_events(shelf, loaded, ids, req)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/api/read")
    def read(req: ReadRequest):
        return read_text(shelf, shelf.get(req.run), req.text)

    @app.post("/api/position")
    def position(req: PositionRequest):
        return position_report(shelf, shelf.get(req.run), req)

    @app.post("/api/attention_map")
    def head_map(req: MapRequest):
        return attention_map(shelf, shelf.get(req.run), req)

    return app
