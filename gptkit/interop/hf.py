"""
GPT-2 interop with Hugging Face `transformers` (an optional dependency, imported only here).

Import: load_pretrained('gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl' | a save_pretrained folder).
Export: export.py writes a checkpoint as config.json + model.safetensors for GPT2LMHeadModel.

The parameter names are the same on both sides; HF keeps its linear layers as Conv1D, whose
weights are stored transposed (in, out), and its config calls things by other names.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.base import files
from gptkit.base.errors import UserError, first_line, what_does_not_fit
from gptkit.base.modes import evaluating
from gptkit.base.signals import StopSignals, alive
from model import GPT, GPTConfig

HUB_MODELS = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
BIASES = ("ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias")
# HF activation_function -> our mlp_act; gelu_new (GPT-2's) and its aliases are the tanh approximation
ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_python_tanh": "gelu_tanh", "gelu": "gelu", "gelu_python": "gelu", "relu2": "relu2"}
# a learner's own mlp_act named as one of transformers' activations exports under that name; the export's check of
# the logits tells a function that differs from transformers' by that name
ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu2": "relu2",
             **{name: name for name in ("relu", "silu", "swish", "tanh", "sigmoid", "mish", "relu6", "quick_gelu")}}
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which the model uses; GPT-2's too
HUB_PROBE_TIMEOUT = 10  # seconds to wait for the hub before calling it unreachable


def import_transformers(purpose):
    try:
        import transformers
    except ImportError:
        raise UserError(f"{purpose} needs the `transformers` package: pip install transformers") from None
    if not sys.stderr.isatty():  # as data/prepare.py: progress bars only on a terminal
        transformers.utils.logging.disable_progress_bar()
    return transformers


# ----------------------------------------------------------------------------- import


def load_pretrained(name_or_path, **overrides):
    """A GPT holding GPT-2 weights; overrides: dropout, and block_size to crop the context."""
    unknown = sorted(set(overrides) - {"dropout", "block_size"})
    if unknown:
        raise ValueError(f"load_pretrained can override only dropout and block_size, not {', '.join(unknown)}")
    hf = load_hf_model(name_or_path)
    config = GPTConfig(**config_from_hf(hf.config), dropout=overrides.get("dropout", 0.0))
    state = state_from_hf(hf.state_dict(), config)
    del hf
    model = GPT(config)
    model.load_state_dict(state)
    if overrides.get("block_size", config.block_size) != config.block_size:
        crop_block_size(model, overrides["block_size"])
    return model


def crop_block_size(model, block_size):
    """Shrink the model's context length, e.g. to finetune GPT-2 on shorter windows: the first block_size rows of
    its position table."""
    if block_size > model.config.block_size:
        raise ValueError(f"block_size {block_size} exceeds the model's {model.config.block_size}")
    model.config.block_size = block_size
    if "wpe" in model.transformer:
        model.transformer.wpe.weight = nn.Parameter(model.transformer.wpe.weight[:block_size])


def load_hf_model(name_or_path):
    """GPT2LMHeadModel from a save_pretrained folder, or for a GPT-2 name from the HF cache or hub."""
    name_or_path = str(name_or_path)
    is_dir = os.path.isdir(name_or_path)
    if not is_dir and name_or_path not in HUB_MODELS:
        if os.sep in name_or_path or os.path.exists(name_or_path):
            raise UserError(f"{name_or_path} is not a folder (expected one saved by transformers' save_pretrained)")
        raise UserError(f"unknown model {name_or_path!r}: use {', '.join(HUB_MODELS)} "
                        "or a folder saved by transformers' save_pretrained")
    transformers = import_transformers(f"loading {name_or_path!r}")
    if is_dir:
        try:
            return read_hf_model(transformers, name_or_path, local_only=True)
        except (OSError, ValueError) as e:
            raise UserError(f"could not load {name_or_path} as a transformers GPT-2 folder "
                            f"({first_line(e)})") from None
    repo = HUB_MODELS[name_or_path]
    try:  # already downloaded: no network at all
        return read_hf_model(transformers, repo, local_only=True)
    except (OSError, ValueError):
        pass
    unreachable = UserError(f"could not fetch {name_or_path!r} from the Hugging Face hub (offline?); "
                            "pass a local directory saved with save_pretrained")
    if not hub_reachable(repo):  # one quick request, where transformers would retry for half a minute
        raise unreachable
    try:
        return read_hf_model(transformers, repo, local_only=False)
    except (OSError, ValueError):
        raise unreachable from None


def hub_reachable(repo):
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_hf_file_metadata(hf_hub_url(repo, "config.json"), timeout=HUB_PROBE_TIMEOUT)
    except Exception:  # DNS, connection, proxy, HTTP errors: all mean "cannot fetch"
        return False
    return True


def read_hf_model(transformers, source, local_only):
    config = transformers.AutoConfig.from_pretrained(source, local_files_only=local_only)
    if config.model_type != "gpt2":
        raise UserError(f"{source} holds a {config.model_type!r} model; only GPT-2 models can be loaded")
    config_from_hf(config)  # refuse an unsupported variant before reading the weights
    model = transformers.GPT2LMHeadModel.from_pretrained(source, config=config, local_files_only=local_only)
    return model.float().eval()


def config_from_hf(hf):
    """GPTConfig arguments for an HF GPT2Config, refusing the variants this model cannot run."""
    act = ACT_FROM_HF.get(hf.activation_function)
    refusals = [
        (act is None, f"activation_function={hf.activation_function!r} (supported: {', '.join(ACT_FROM_HF)})"),
        (hf.n_inner not in (None, 4 * hf.n_embd), f"n_inner={hf.n_inner} (the MLP here is 4 * n_embd wide)"),
        (abs(hf.layer_norm_epsilon - LAYER_NORM_EPS) > 1e-12, f"layer_norm_epsilon={hf.layer_norm_epsilon} "
                                                               f"(LayerNorm here uses {LAYER_NORM_EPS})"),
        (not hf.scale_attn_weights, "scale_attn_weights=False"),
        (hf.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx=True"),
        (getattr(hf, "add_cross_attention", False), "add_cross_attention=True"),
    ]
    for refused, what in refusals:
        if refused:
            raise UserError(f"this GPT-2 variant cannot be loaded: {what}")
    return dict(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer, n_head=hf.n_head,
                n_embd=hf.n_embd, bias=True, pos_emb="learned", norm="layernorm", qk_norm=False, mlp_act=act,
                tie_weights=bool(getattr(hf, "tie_word_embeddings", True)), logit_softcap=0.0)


def state_from_hf(hf_state, config):
    """Our state dict from GPT2LMHeadModel's: the same names, Conv1D weights transposed."""
    state = {}
    for key, value in hf_state.items():
        if key.endswith((".attn.bias", ".attn.masked_bias")) and value.dim() > 1:
            continue  # causal-mask buffers of older transformers versions
        state[key] = value.t() if key.endswith(CONV1D_WEIGHTS) else value
    if config.tie_weights or "lm_head.weight" not in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


# ----------------------------------------------------------------------------- export


def check_exportable(config):
    """Raise a one-line UserError naming the first option GPT2LMHeadModel cannot represent."""
    refused = gpt2_refusal(config, ACT_TO_HF)
    if refused:
        raise UserError(f"this model cannot be exported as GPT-2: {refused}")


def gpt2_refusal(config, activations):
    """The first option of config outside GPT-2's layout, with the MLP activations in `activations` allowed,
    as `name=value (why)`; None when there is none."""
    refusals = [
        (config.pos_emb != "learned", f"pos_emb={config.pos_emb!r} (GPT-2 has learned positions only)"),
        (config.norm != "layernorm", f"norm={config.norm!r} (GPT-2 has LayerNorm only)"),
        (config.qk_norm, "qk_norm=True (GPT-2 has no query/key normalisation)"),
        (config.mlp_act not in activations, f"mlp_act={config.mlp_act!r} (supported: {', '.join(activations)})"),
        (config.logit_softcap > 0, f"logit_softcap={config.logit_softcap} (GPT-2 has no logit soft-capping)"),
        (config.attention != "scaled", f"attention={config.attention!r} (GPT-2 scores q.k/sqrt(d))"),
        (not config.causal, "causal=False (GPT-2 is a decoder: it masks the future)"),
        (not config.mlp, "mlp=False (every GPT-2 block has an MLP)"),
        (config.token_shift, "token_shift=True (GPT-2's blocks read only their own position's stream)"),
        (config.lora_rank > 0, f"lora_rank={config.lora_rank} (adapters its LoRALinear.forward folds into no matrix)"),
    ]
    return next((what for refused, what in refusals if refused), None)


def hf_config_args(config, eos_token_id=None, n_inner=None):
    """GPT2Config arguments for our GPTConfig (check_exportable first); n_inner: the MLP's hidden width, where it
    is not GPT-2's 4 x n_embd."""
    return dict(vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
                n_layer=config.n_layer, n_head=config.n_head, n_inner=n_inner,
                activation_function=ACT_TO_HF[config.mlp_act], layer_norm_epsilon=LAYER_NORM_EPS,
                resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
                tie_word_embeddings=config.tie_weights, bos_token_id=eos_token_id, eos_token_id=eos_token_id)


def mlp_width(state, config):
    """The MLP's hidden width where the weights (a learner's option, say) make it other than GPT-2's 4 x n_embd,
    which GPT-2 writes as n_inner; else None."""
    c_fc = state.get("transformer.h.0.mlp.c_fc.weight")
    width = c_fc.shape[0] if c_fc is not None and c_fc.ndim == 2 else None
    return width if width != 4 * config.n_embd else None


def state_to_hf(state, config):
    """GPT2LMHeadModel's state dict from ours: Conv1D weights transposed, zero biases where bias=False."""
    out = {key: (value.t() if key.endswith(CONV1D_WEIGHTS) else value).detach().float().contiguous()
           for key, value in state.items()}
    if not config.bias:  # a zero bias is no bias
        names = [f"transformer.h.{i}.{b}" for i in range(config.n_layer) for b in BIASES] + ["transformer.ln_f.bias"]
        for name in names:
            weight = state[name.removesuffix("bias") + "weight"]  # (out, in) for Linear, (C,) for LayerNorm
            out[name] = torch.zeros(weight.shape[0])
    return out


@torch.no_grad()
def check_same_logits(model, hf):
    """GPT-2 built from model's weights must compute model's logits: an edit to model.py, or an option of its
    own, that GPT-2 has no place for would otherwise be written as another model. One line, before any file. Over
    the whole context: an edit may change only what the far positions see (a window on attention, say)."""
    config = model.config
    idx = torch.randint(config.vocab_size, (1, config.block_size), generator=torch.Generator().manual_seed(0))
    with evaluating(model):
        ours = model(idx, idx)[0].float()
    gap = (hf(idx).logits.float() - ours).abs().max().item()
    if not gap <= 1e-4 * max(1.0, ours.abs().max().item()):  # float32's rounding, not another function
        raise UserError(f"GPT-2 built from this model's weights computes other logits (up to {gap:.3g} apart): its "
                        "model.py computes something GPT-2's layout has no place for (an edit, or an option of its "
                        "own); nothing was written")


def clear_killed_exports(hf_dir):
    """Remove the aside folders that exports killed outright (kill -9, a power cut) left in hf_dir, each named for
    its export's process: a folder of a process still running is another export's, under way."""
    for aside in hf_dir.glob(".export-*"):
        pid = aside.name.split("-")[1]
        if aside.is_dir() and not aside.is_symlink() and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(aside)


EXPORT_FILES = ("config.json", "model.safetensors", "generation_config.json")  # what save_pretrained writes
# written into each export's config.json, which transformers keeps as an attribute: a folder whose config lacks it
# holds a model of the learner's (a GPT-2 saved or downloaded there), which an export must not replace
EXPORT_MARK, EXPORTED_BY = "exported_by", "nanogpt-cli export.py"
# a run's folder holds one of these (gptkit/run/run_folder.py names them; this layer sits below it)
RUN_FILES = ("best.pt", "latest.pt", "metrics.jsonl", "ckpt.pt")
DATASET_FILES = ("meta.json", "train.bin")  # and a dataset's, which data/prepare.py would then read as text


def check_hf_dir(hf_dir):
    """Before anything is read or written: one line where hf_dir is a run's folder, or holds a file at a name the
    export writes that no earlier export wrote (a GPT-2 model saved or downloaded there, a config.json of another
    kind, or weights without one), which the export would replace; an earlier export's files are replaced, which
    save_hf says."""
    hf_dir = Path(hf_dir)
    for kind, names in (("a run's", RUN_FILES), ("a dataset's", DATASET_FILES)):
        held = [name for name in names if (hf_dir / name).exists()]
        if held:
            raise UserError(f"{hf_dir} is {kind} folder (it holds {held[0]}); export to a folder of its own, e.g. "
                            "--hf_dir=hf")
    there = [name for name in EXPORT_FILES if (hf_dir / name).is_file()]
    config = config_json(hf_dir / "config.json")
    if there and config.get(EXPORT_MARK) != EXPORTED_BY:
        what = ("a GPT-2 model that export.py did not write (saved or downloaded there)" if
                config.get("model_type") == "gpt2" else f"{', '.join(there)} of no earlier export")
        raise UserError(f"{hf_dir} holds {what}, which the export would replace; move them, or export to another "
                        "--hf_dir")


def config_json(path):
    """A config.json's object, or {} where it is missing, unreadable, not JSON or not an object."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}


def save_hf(model, hf_dir, eos_token_id=None):
    """Write model (a GPT) to hf_dir as config.json + model.safetensors for GPT2LMHeadModel: the names of the
    files there it replaced."""
    config = model.config
    check_exportable(config)
    transformers = import_transformers("exporting to Hugging Face format")
    state = model.state_dict()
    hf_config = transformers.GPT2Config(**hf_config_args(config, eos_token_id, mlp_width(state, config)),
                                        **{EXPORT_MARK: EXPORTED_BY})
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    try:
        hf.load_state_dict(state_to_hf(state, config))
    except (RuntimeError, KeyError) as e:  # model.py, as edited, has a weight GPT-2 has no place for, or lacks one
        found = f"it has no {e.args[0]}" if isinstance(e, KeyError) else what_does_not_fit(e, width=120)
        raise UserError(f"GPT-2 has no place for this model's weights ({found}): its model.py builds something "
                        "GPT-2's layout does not hold (an edit, or an option of its own); nothing was written") \
            from None
    check_same_logits(model, hf)
    hf_dir = Path(hf_dir)
    try:
        hf_dir.mkdir(parents=True, exist_ok=True)
        # saved aside (transformers writes a folder) in hf_dir, then its files renamed in; every link or folder in
        # the way is refused before any file moves, so that a refusal leaves none of the new files. A stop signal
        # before the renames leaves hf_dir as it was, in one line, its aside folder removed on the way out
        clear_killed_exports(hf_dir)
        with StopSignals() as stop, tempfile.TemporaryDirectory(dir=hf_dir, prefix=f".export-{os.getpid()}-") as aside:
            stop.doing = f"exporting; {hf_dir} is as it was"
            hf.save_pretrained(aside)
            written = sorted(Path(aside).iterdir())
            for f in written:
                files.refuse_link(hf_dir / f.name)
                if (hf_dir / f.name).is_dir():
                    raise UserError(f"{hf_dir / f.name} is a folder, where the export writes its {f.name}; move it "
                                    "out of the way, or export to another --hf_dir")
                with open(f, "rb") as saved:
                    os.fsync(saved.fileno())
            replaced = [f.name for f in written if (hf_dir / f.name).exists()]
            with stop.deferred():  # all or none: a stop between two renames would leave the config of one model
                for f in written:  # beside the weights of another, an export that loads as neither
                    os.replace(f, hf_dir / f.name)
    except OSError as e:  # the folder is named: a user reads it as the export's, whichever file failed
        raise UserError(f"could not write {hf_dir} ({e.strerror or e})") from None
    return replaced
