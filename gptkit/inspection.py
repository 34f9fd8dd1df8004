"""Looking inside a model: the attention weights every layer applies, the residual stream after each layer and
what it would predict (the logit lens), how surprised the model is by each token, and tokens as labels."""

import math

import torch

from gptkit.errors import UserError


@torch.no_grad()
def attention_maps(model, idx):
    """Every layer's attention weights for idx, a list of (B, H, T, T) tensors: the weights the forward pass
    applies to the values (SDPA's kernels never materialise them), from the model's own attention modules."""
    x, rotary = model.embed(idx)
    maps = []
    for block in model.transformer.h:
        attn = block.attn
        q, k, _ = attn.qkv(block.attention_input(x), rotary)
        T = idx.size(1)
        maps.append(attn.attention_weights(q, k, T, T).expand(idx.size(0), attn.n_head, T, T))
        x = block(x, rotary)
    return maps


@torch.no_grad()
def residual_streams(model, idx):
    """The residual stream after the embeddings and after each block: n_layer + 1 tensors of (B, T, C)."""
    x, rotary = model.embed(idx)
    streams = [x]
    for block in model.transformer.h:
        x = block(x, rotary)
        streams.append(x)
    return streams


@torch.no_grad()
def read_out(model, x):
    """What residual-stream vectors x predict next: logits through the final norm and the head."""
    return model.head(model.transformer.ln_f(x))


@torch.no_grad()
def logits_everywhere(model, idx):
    """(B, T, V) logits at every position, as the forward pass computes them with targets."""
    return read_out(model, residual_streams(model, idx)[-1])


@torch.no_grad()
def surprise_bits(model, idx, targets):
    """(B, T) surprise of each target, in bits: -log2 of the probability the model gave it after reading idx up
    to its position (targets is idx shifted by one). Their mean, in nats, is the model's loss on them."""
    logp = torch.log_softmax(logits_everywhere(model, idx).float(), dim=-1)
    return -logp.gather(-1, targets[..., None])[..., 0] / math.log(2)


@torch.no_grad()
def logit_lens(model, streams, position):
    """What each residual stream (from residual_streams) at `position` of the first row would predict next:
    n_layer + 1 distributions, each through the final norm and the head; the last is the model's own prediction."""
    return [torch.softmax(read_out(model, s[0, position]).float(), dim=-1) for s in streams]


VISIBLE = {"\n": "\u21b5", "\t": "\u21e5", " ": "\u2423"}  # ↵ newline, ⇥ tab, ␣ space: blanks cannot be read


def token_label(tok, token):
    """A token as a short label a person can read, whitespace shown as symbols."""
    shown = "".join(VISIBLE.get(ch, ch) for ch in tok.decode([token]))
    return shown if len(shown) <= 12 else shown[:11] + "\u2026"


def attention_of(model, tok, prompt):
    """Every layer's attention weights for prompt, as numpy (H, T, T) arrays, and a label per token."""
    if model.config.n_layer == 0:
        raise UserError("this model has no attention layers (n_layer=0, a bigram model): there is nothing to draw")
    ids = tok.encode(prompt)
    if not ids:
        raise UserError("the prompt is empty: pass some text with --start")
    if len(ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the model's block_size "
                        f"{model.config.block_size}")
    device = next(model.parameters()).device
    maps = attention_maps(model, torch.tensor([ids], dtype=torch.long, device=device))
    return [m[0].float().cpu().numpy() for m in maps], [token_label(tok, t) for t in ids]
