"""A run's numbers: one JSON object per line in metrics.jsonl, mirrored to wandb when asked."""

import json
import os
import time
from pathlib import Path

from gptkit.errors import UserError


def process_start_time():
    """When this process started, on the wall clock: from the kernel where it tells (Linux), so that the
    interpreter's and torch's start-up count in a run's elapsed_s; else when this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_START = process_start_time()


class RunLog:
    def __init__(self, out_dir, wandb_args=None):
        self.path = Path(out_dir) / "metrics.jsonl"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # e.g. a file where the folder should be
            reason = "a file of that name is in the way" if isinstance(e, FileExistsError) else e.strerror
            raise UserError(f"cannot use {self.path.parent} as out_dir ({reason})") from None
        self.wandb = None
        if wandb_args is not None:
            try:
                import wandb
            except ImportError:
                raise UserError("wandb_log=True needs the wandb package: pip install wandb") from None
            self.wandb = wandb.init(resume="allow", dir=str(self.path.parent), **wandb_args)

    def write(self, record):
        record = dict(record, elapsed_s=round(time.time() - PROCESS_START, 3))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            kind = record["kind"]
            values = {f"{kind}/{k}": v for k, v in record.items() if k not in ("kind", "iter")}
            self.wandb.log(values, step=record["iter"])

    def close(self):
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(out_dir):
    """Every record of out_dir/metrics.jsonl, in the order written."""
    path = Path(out_dir) / "metrics.jsonl"
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise UserError(f"no metrics.jsonl in {out_dir}; train a model there first with `python train.py ...`") \
            from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} has a line that is not JSON ({e.msg} at line {e.lineno}); "
                        "was it written by train.py?") from None
