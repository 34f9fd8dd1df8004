"""
Hand a GPT-2-like model to TransformerLens (an optional dependency, imported only here): to_transformer_lens(model).

TransformerLens 4 removed HookedTransformer and HookedTransformerConfig. For a model that is not a Hugging Face one
it builds its own transformer from a TransformerBridgeConfig (TransformerBridge.boot_native) and fills it with
load_state_dict, as its Tracr demo does; boot_transformers would need a transformers model and a Hugging Face
tokenizer, which a char-level run does not have. The bridge's weights are left as they are (no folded norms, no
centring) until the user calls its enable_compatibility_mode().

Its blocks are GPT-2's with q, k and v split into three Linear layers, and a bias everywhere: a model without
biases gets zeros there.
"""

import re
from importlib.metadata import PackageNotFoundError, version

import torch

from gptkit.base.errors import UserError
from gptkit.interop.hf import LAYER_NORM_EPS, gpt2_refusal

ACT_TO_LENS = {"gelu_tanh": "gelu_new", "gelu": "gelu"}  # our mlp_act -> TransformerLens's act_fn
MIN_LENS_VERSION = (3, 9)  # the oldest release the conversion is tested on (requirements-test.txt pins it)


def check_convertible(config):
    """Raise a one-line UserError naming the first option the conversion does not take."""
    refused = gpt2_refusal(config, ACT_TO_LENS)
    if refused:
        raise UserError(f"this model cannot go to TransformerLens: {refused}")


def import_transformer_lens():
    """TransformerBridge and TransformerBridgeConfig, from a TransformerLens recent enough to load a native
    bridge's weights by the names its state_dict() gives."""
    try:
        found = version("transformer-lens")
    except PackageNotFoundError:
        raise UserError("handing a model to TransformerLens needs the `transformer-lens` package: "
                        "pip install transformer-lens") from None
    if tuple(int(part) for part in re.findall(r"\d+", found)[:2]) < MIN_LENS_VERSION:
        raise UserError(f"handing a model to TransformerLens needs transformer-lens "
                        f"{'.'.join(map(str, MIN_LENS_VERSION))} or later (found {found}): "
                        "pip install -U transformer-lens")
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge, TransformerBridgeConfig


def lens_config_args(config):
    """TransformerBridgeConfig arguments for our GPTConfig (check_convertible first)."""
    return dict(d_model=config.n_embd, n_heads=config.n_head, d_head=config.n_embd // config.n_head,
                n_layers=config.n_layer, n_ctx=config.block_size, d_vocab=config.vocab_size,
                d_mlp=4 * config.n_embd, act_fn=ACT_TO_LENS[config.mlp_act], normalization_type="LN",
                eps=LAYER_NORM_EPS, positional_embedding_type="standard", attention_dir="causal",
                init_weights=False)  # every weight is loaded: no random draw to spend


def lens_state(state, config):
    """The bridge's state dict (as its state_dict() names it) from ours: c_attn split into q, k and v; zeros for
    the biases a bias=False model has none of, and for the head's, which GPT-2 never has."""
    C = config.n_embd
    state = {key: value.detach().float() for key, value in state.items()}
    device = state["lm_head.weight"].device

    def bias(name, size):
        return state[name] if name in state else torch.zeros(size, device=device)

    out = {"embed.weight": state["transformer.wte.weight"], "pos_embed.weight": state["transformer.wpe.weight"],
           "ln_final.weight": state["transformer.ln_f.weight"],
           "ln_final.bias": bias("transformer.ln_f.bias", C),
           "unembed.weight": state["lm_head.weight"], "unembed.bias": torch.zeros(config.vocab_size, device=device)}
    for i in range(config.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"blocks.{i}."
        for name, part in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{theirs}{name}.weight"] = state[f"{ours}{part}.weight"]
            out[f"{theirs}{name}.bias"] = bias(f"{ours}{part}.bias", C)
        weights = state[f"{ours}attn.c_attn.weight"].split(C)
        biases = bias(f"{ours}attn.c_attn.bias", 3 * C).split(C)
        for name, weight, b in zip("qkv", weights, biases):
            out[f"{theirs}attn.{name}.weight"], out[f"{theirs}attn.{name}.bias"] = weight, b
        for name, part, size in (("attn.o", "attn.c_proj", C), ("mlp.in", "mlp.c_fc", 4 * C),
                                 ("mlp.out", "mlp.c_proj", C)):
            out[f"{theirs}{name}.weight"] = state[f"{ours}{part}.weight"]
            out[f"{theirs}{name}.bias"] = bias(f"{ours}{part}.bias", size)
    return out


def to_transformer_lens(model):
    """A TransformerLens TransformerBridge computing what model (a GPT) computes, on its device, in float32.
    Feed it token ids from the run's tokenizer; its run_with_cache names follow gptkit/interp/hooks.py's."""
    config = model.config
    check_convertible(config)
    TransformerBridge, TransformerBridgeConfig = import_transformer_lens()
    device = next(model.parameters()).device
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**lens_config_args(config)), device=device,
                                           model_name="gptkit")
    bridge.load_state_dict(lens_state(model.state_dict(), config), strict=True)
    return bridge.eval()
