"""Looking inside a model: the attention weights every layer applies, and tokens as labels to show them by."""

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
        q, k, _ = attn.qkv(block.ln_1(x), rotary)
        T = idx.size(1)
        maps.append(attn.attention_weights(q, k, T, T).expand(idx.size(0), attn.n_head, T, T))
        x = block(x, rotary)
    return maps


def token_label(tok, token):
    text = tok.decode([token])
    shown = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423")  # ␣ marks a space
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
