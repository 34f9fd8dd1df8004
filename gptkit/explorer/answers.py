"""What the explorer answers: the requests it takes, checked, and the model's own numbers for each: generation as
it streams (for a chat run, an answer to a question), a text read token by token, one position's report, an
attention map, a run's curves."""

import json
import math
import time

import torch
from pydantic import BaseModel, Field, StrictBool, field_validator

from gptkit.base.errors import UserError
from gptkit.data.conversations import NAMES, marker_name, prompt_text, shown, typed
from gptkit.explorer.experiment_answers import MAX_OFF, MAX_TOKENS, Off, OffRequest, Real, Whole
from gptkit.explorer.runs import (NO_METRICS, ApiError, attention_note, final_bits_per_char, number, run_records,
                                  without_paths)
from gptkit.explorer.timeline_answers import AtRequest
from gptkit.interp.experiments import checked_tokens
from gptkit.interp.hooks import attention_maps, logit_lens, look_inside, read_out, surprise_bits, token_label
from gptkit.run.metrics import Records, loss_points, rl_run
from gptkit.sampling.decoding import StopFilter, decode_steps, sees_ahead, shaped_probs

# what an rl.py run's curves say instead of that it has logged no losses yet (plot.py draws its own picture)
RL_NOTE = ("an rl.py run logs a reward a step and its held-out pass@1, not losses: python plot.py loss "
           "--out_dir=RUN_FOLDER draws them")
MAX_PROMPT_CHARS = 20_000
MAX_NEW_TOKENS = 2_000
FLUSH_SECONDS = 0.015  # after the first token, tokens are sent in small groups: each write costs more than a step


# ----------------------------------------------------------------------------- requests


class Knobs(BaseModel):
    """The sampling settings, with sample.py's meanings; ranges a page can ask for without breaking the sampler."""

    temperature: Real = Field(0.8, ge=0, le=10)
    top_k: Whole = Field(200, ge=0, le=1_000_000)
    top_p: Real = Field(1.0, gt=0, le=1)

    @field_validator("temperature")
    @classmethod
    def greedy_or_workable(cls, v):
        if 0 < v < 1e-3:
            raise ValueError("must be 0 (greedy) or at least 0.001")
        return v


class GenerateRequest(Knobs, OffRequest, AtRequest):
    run: str
    prompt: str = Field("\n", min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: Whole = Field(1337, ge=0, lt=2 ** 31)
    max_tokens: Whole = Field(200, ge=1, le=MAX_NEW_TOKENS)
    stop: str = Field("", max_length=200)
    chat: StrictBool = False  # a chat run's question: the model is given prompt_text(prompt), and stops at <|end|>


class ReadRequest(OffRequest, AtRequest):
    run: str
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)


class PositionRequest(Knobs, OffRequest, AtRequest):
    run: str
    ids: list[Whole] = Field(min_length=1, max_length=MAX_TOKENS)
    position: Whole = Field(ge=0, lt=MAX_TOKENS)
    k: Whole = Field(10, ge=1, le=100)


class MapRequest(OffRequest, AtRequest):
    run: str
    ids: list[Whole] = Field(min_length=1, max_length=MAX_TOKENS)
    layer: Whole = Field(ge=0, le=MAX_OFF)
    head: Whole = Field(ge=0, le=MAX_OFF)


def encode(loaded, text):
    try:
        ids = loaded.tok.encode(text)
    except UserError as e:
        raise ApiError(400, str(e)) from None
    if not ids:
        raise ApiError(400, "the text is empty")
    return ids


def checked_ids(loaded, ids):
    """Token ids as a (1, T) tensor, refused as the API refuses them (checked_tokens) when the model cannot read
    them in one window."""
    block = loaded.model.config.block_size
    if len(ids) > block:  # said in the page's words: it sends ids in one window
        raise ApiError(400, f"{len(ids)} tokens is more than the model's context of {block}; send at most {block}")
    try:  # as a list: checked_tokens checks each id before a tensor, which cannot hold every number, is made
        return checked_tokens(loaded.model, [ids], loaded.tok.vocab_size)
    except UserError as e:
        raise ApiError(400, str(e)) from None


def is_chat(tok):
    """Whether tok is a chat run's: it has the chat markers as tokens (char-level or BPE)."""
    return tok.chat is not None


def token_json(tok, token):
    """A token as the page shows it: its id, its own text (a byte-level BPE token holding part of a character's
    bytes decodes to U+FFFD there; a chat marker is its name) and its label, which writes those bytes as ⟨e4⟩."""
    text = tok.decode([token])
    name = marker_name(tok, text)
    return {"id": token, "text": name or text, "label": token_label(tok, token)}


def chat_ids(loaded, question):
    """The tokens that ask a chat run's model a question: prompt_text(question), as chat.py gives it; one line for
    a run that is no chat run, or a question that holds a marker's character."""
    if not is_chat(loaded.tok):
        raise ApiError(400, "this run is not a chat run (its vocabulary has no chat markers <|user|>, "
                            "<|assistant|>, <|end|>): send \"chat\": false")
    if set(question) & set(NAMES):
        raise ApiError(400, "the question holds a character the chat markers use (U+E000-U+E002); write it without")
    return encode(loaded, prompt_text(question))


def top(tok, probs, k, drawable=False):
    """The k likeliest real tokens of a (V,) distribution (a vocabulary padded for speed has rows no tokenizer
    can decode), each with its probability; drawable: only those it can draw (top-k, top-p and temperature 0
    leave the rest at 0)."""
    values, ids = probs[:tok.vocab_size].float().topk(min(k, tok.vocab_size))
    return [dict(token_json(tok, i), p=round(p, 6)) for i, p in zip(ids.tolist(), values.tolist())
            if p > 0 or not drawable]


# ----------------------------------------------------------------------------- generation


def generation_events(shelf, loaded, ids, req, off=Off()):
    """The events of one generation: the prompt's tokens, each new token with the probability the model gave it,
    then the end. Decoding runs step by step under the shelf's lock, with the parts `off` names switched off for
    that step, and only while the client reads: a client that goes away stops the generation at its next step.
    A chat request's answer ends where the model writes <|end|>, which is not sent: it is no text."""
    tok = loaded.tok
    end = tok.chat["end"] if req.chat else None
    device = next(loaded.decoder.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    yield {"type": "prompt", "tokens": [token_json(tok, t) for t in ids]}
    generator = torch.Generator(device=device).manual_seed(req.seed)  # as sample.py: one seeded generator
    steps = decode_steps(loaded.decoder, idx, req.max_tokens, temperature=req.temperature, top_k=req.top_k,
                         top_p=req.top_p, generator=generator, vocab_size=tok.vocab_size)
    text_of, stop, text, reason = tok.stream_decoder(), StopFilter(typed(tok, req.stop)), "", "max_tokens"
    while True:
        with shelf.lock, off.on(loaded.decoder):
            step = next(steps, None)
        if step is None:
            break
        token, logits, shaped = step[0].item(), step[1][0].float(), step[2]
        if token == end:
            reason = "end"
            break
        p = torch.softmax(logits, -1)[token].item()
        p_shaped = 1.0 if shaped is None else shaped[0, token].item()  # greedy: all of it on this token
        piece = text_of(token)
        text += stop.feed(piece)
        if stop.done:
            reason = "stop"
            break
        # the chip is the token itself; the text, whose characters may span tokens, comes whole at the end
        yield dict(token_json(tok, token), type="token", p=round(p, 6), p_shaped=round(p_shaped, 6))
    text += stop.flush()
    yield {"type": "done", "reason": reason, "text": shown(text) if is_chat(tok) else text}


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
    """Every token of text (a chat model's markers by their names) with its surprise in bits under the model
    (teacher-forced), and the totals. A text longer than the context is read in consecutive windows, as train.py
    scores the val split: each token is scored once, from the tokens before it in its window."""
    ids = encode(loaded, typed(loaded.tok, text))
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
                                                req.top_p)[0], req.k, drawable=True))
    rows = [[[round(w, 6) for w in m[0, h, req.position].tolist()] for h in range(c.n_head)] for m in maps]
    names = ["embeddings", *[f"after layer {i}" for i in range(c.n_layer)]]  # layers count from 0, as L0H3 does
    names[-1] += " (the model's prediction)"
    return {"position": req.position, "token": token_json(tok, req.ids[req.position]), "why": why,
            "attention": {"note": attention_note(loaded.model), "layers": len(maps),
                          "heads": c.n_head if maps else 0, "rows": rows},
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
    number is a gap in its curve. note: what the curves lack, for an rl.py run (RL_NOTE) or one without its
    metrics.jsonl, else None."""
    try:
        records = run_records(summary.folder)
    except UserError as e:
        raise ApiError(409, without_paths(str(e), summary.folder)) from None
    train, evals, final = [], [], None
    for r, t in loss_points(records):
        if r.get("kind") == "train":
            train.append({"iter": r["iter"], "loss": number(r["loss"]), "time": round(t, 3)})
        elif r.get("kind") == "eval":
            evals.append({"iter": r["iter"], "train_loss": number(r.get("train_loss")),
                          "val_loss": number(r["val_loss"]), "time": round(t, 3)})
        elif r.get("kind") == "final":
            final = {"val_loss": number(r.get("val_loss")),
                     "bits_per_char": final_bits_per_char(r, summary.tokenizer_kind)}
    note = RL_NOTE if rl_run(records) else None if isinstance(records, Records) else f"no curves: {NO_METRICS}"
    return {"train": train, "eval": evals, "final": final, "note": note}


def picked(name, loaded):
    c = loaded.model.config
    return {"name": name, "settings": c.describe(), "n_layer": c.n_layer, "n_head": c.n_head,
            "block_size": c.block_size, "attention": c.attention, "causal": not sees_ahead(loaded.model),
            "vocab_size": loaded.tok.vocab_size, "tokenizer": loaded.summary.tokenizer,
            "tokenizer_kind": loaded.tok.kind, "chat": is_chat(loaded.tok),
            "decode": loaded.decoding, "note": attention_note(loaded.model), "mlp": bool(c.mlp),
            "code_note": loaded.code_note, "watch_note": loaded.watch_note}


