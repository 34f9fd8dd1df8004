"""Write checkpoints atomically and read them back without running any pickled code."""

import errno
import os
import pickle
from pathlib import Path

import torch

from errors import UserError

FORMAT_VERSION = 1


def save_checkpoint(state, path):
    """Write to a temporary file, fsync, then rename: a crash leaves the old file or the new, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(dict(state, format_version=FORMAT_VERSION), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space" in str(e):
            raise UserError(f"disk full while writing {path}; the previous checkpoint is intact") from None
        raise UserError(f"could not write checkpoint {path} ({e}); the previous checkpoint is intact") from None


def load_checkpoint(path, map_location="cpu"):
    path = Path(path)
    if not path.exists():
        raise UserError(f"no checkpoint at {path}; train one first with `python train.py ...`")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported content"
        raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data "
                        f"({first_line})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise UserError(f"{path} is truncated or not a checkpoint ({str(e).splitlines()[0]})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise UserError(f"{path} is not a checkpoint written by this tool")
    if state["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {state['format_version']}, this tool reads {FORMAT_VERSION}")
    return state


def load_model(out_dir, device):
    """The trained model (in eval mode) and its tokenizer, from out_dir/ckpt.pt alone."""
    from model import GPT, GPTConfig
    from tokenizer import tokenizer_from_meta

    ckpt = load_checkpoint(Path(out_dir) / "ckpt.pt")
    model = GPT(GPTConfig.from_dict(ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tokenizer_from_meta(ckpt["tokenizer"])
