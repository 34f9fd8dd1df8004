"""
This machine's wisdom: what a run's start-up choices depend on that belongs to the machine rather than the moment
(each precision's fastest attention path and step time, for one model shape and batch), measured once and kept in a
per-user cache, as FFTW keeps its wisdom and autotuners their tables. A run reads it instead of timing; the first
run of a shape on a machine measures it, and --retime measures it again.

The cache is one JSON file, $GPTKIT_WISDOM_DIR/wisdom.json where that is set (tests, the lab and the benchmarks
point it at a folder of their own), else under $XDG_CACHE_HOME/gptkit, else ~/.cache/gptkit. It is keyed by the
machine (the CPU or GPU, and the threads a run starts on), torch's version and the shape (model.py's code with it: an
edited model steps at a speed of its own); a damaged file, a damaged entry (a hand edit: a wrong type, a missing key, a
step time that is no positive number), or one written by another torch version, is measured afresh, with one note.
"""

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gptkit.base import files
from gptkit.base.errors import UserError
from gptkit.machine.stand_ins import ATTENTION_PATHS, model_code

FORMAT = 1
FILE_NAME = "wisdom.json"


def wisdom_dir():
    if os.environ.get("GPTKIT_WISDOM_DIR"):
        return Path(os.environ["GPTKIT_WISDOM_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptkit"


def cpu_name():
    """The CPU's model name and the instruction sets that decide its speed in each precision."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    fast = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({' '.join(fast) or 'no avx2'})"


def machine_key(device, threads):
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))}"
    return f"{cpu_name()}, {threads} thread{'s' if threads != 1 else ''}"


def shape_key(model_config, batch_size, kernels, compiled, asked=()):
    """What a step's speed depends on besides the machine: the model, the batch, the kernels and compiling; and
    what the run was told rather than left to measure (`asked`: an attention path or a thread count), since an
    entry measured under it holds no choice among the others."""
    text = json.dumps({"model": asdict(model_config), "batch_size": batch_size, "kernels": sorted(kernels),
                       "compile": compiled, "asked": list(asked), "code": model_code()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Wisdom:
    """The measured speeds of this machine (see the module's docstring): entry(key) to read one shape's, keep(key,
    entry) to add to it; `notes` says once why a cache was not read."""

    def __init__(self, device, threads, folder=None):
        self.path = Path(folder or wisdom_dir()) / FILE_NAME
        self.machine, self.threads = machine_key(device, threads), threads
        self.torch = torch.__version__
        self.notes = []
        self.shapes = self.read()

    def read(self):
        """This machine's entries for this torch version; {} (and a note) where the file cannot be used."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            self.notes.append(f"note: the wisdom cache {self.path} cannot be read ({e}): measuring afresh")
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("machines", {}), dict):
                raise ValueError("it is not the JSON object of machines this tool writes")
            mine = data["machines"].get(self.machine, {}) if data.get("format") == FORMAT else None
            if mine is None:
                raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
            if not isinstance(mine, dict) or not isinstance(mine.get("shapes", {}), dict):
                raise ValueError("its entry for this machine is not a table")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            self.notes.append(f"note: the wisdom cache {self.path} is damaged ({e}): measuring afresh")
            return {}
        if mine and mine.get("torch") != self.torch:
            self.notes.append(f"note: this machine's wisdom in {self.path} was measured with torch "
                              f"{mine.get('torch')}, not {self.torch}: measuring afresh")
            return {}
        return mine.get("shapes", {})

    def entry(self, key, problem=None):
        """The entry of one shape, or {} (to be measured afresh) where there is none, or where it is damaged
        (`problem`, entry_problem by default, says what is): then with a note naming what is wrong."""
        found = self.shapes.get(key)
        if found is None:
            return {}
        wrong = problem(found) if problem else entry_problem(found, self.threads)
        if wrong:
            self.notes.append(f"note: this model's entry in the wisdom cache {self.path} is damaged ({wrong}): "
                              "measuring afresh")
            return {}
        return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}

    def keep(self, key, entry):
        """Add an entry to the file, written whole to a temporary file and renamed over it (another run's entries,
        written meanwhile, kept)."""
        self.shapes[key] = entry
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT or not isinstance(data.get("machines"), dict):
                raise ValueError
        except (OSError, ValueError, UnicodeDecodeError, AttributeError, RecursionError):
            data = {"format": FORMAT, "machines": {}}
        mine = data["machines"].get(self.machine)
        if not isinstance(mine, dict) or mine.get("torch") != self.torch or not isinstance(mine.get("shapes"), dict):
            mine = data["machines"][self.machine] = {"torch": self.torch, "shapes": {}}
        mine["shapes"][key] = entry
        try:  # shared: every run on this machine keeps its entries here, and none holds a lock for it
            files.write_whole(self.path, json.dumps(data, indent=1, sort_keys=True), shared=True,
                              failed=lambda path, e: UserError(e.strerror or str(e)))
        except UserError as e:  # a read-only home, a link: the run goes on with what it measured, and says so
            self.notes.append(f"note: could not keep this machine's wisdom in {self.path} ({e}): the next run "
                              "measures again")


def decode_key(model_config, batch_size):
    """A decoding precision's key: the model (model.py's code with it) and the rows decoded at once."""
    return "decode-" + shape_key(model_config, batch_size, [], False)


def decode_problem(entry):
    """What makes a decoding entry unusable, in words, or None."""
    if not isinstance(entry, dict) or entry.get("dtype") not in ("float32", "bfloat16"):
        return "no precision chosen"
    if not positive(entry.get("speedup")) or not isinstance(entry.get("measured"), str):
        return "no measurement it was chosen by"
    return busy_problem(entry)


def busy_problem(entry):
    """What is wrong with an entry's mark of a measurement taken busy (the cores other programs held), or None."""
    if "busy" in entry and not (type(entry["busy"]) in (int, float) and 0 <= entry["busy"] < 4096):
        return f"busy is {entry['busy']!r}, not the cores other programs held"
    return None


def positive(value):
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def entry_problem(entry, most=4096):
    """What makes a shape's entry unusable, in words, or None: every figure of the kind a measurement writes, its
    thread count at most the `most` this machine starts on."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not a table"
    if type(entry.get("params")) is not int or entry["params"] <= 0:
        return f"params is {entry.get('params')!r}, not a count"
    if not isinstance(entry.get("measured"), str):
        return "no date it was measured on"
    if busy := busy_problem(entry):
        return busy
    speeds = {k: v for k, v in entry.items() if k not in ("params", "measured", "busy")}
    if not speeds:
        return "no precision measured"
    for dtype, speed in speeds.items():
        if dtype not in ("float32", "bfloat16", "float16") or not isinstance(speed, dict):
            return f"{dtype!r} is no precision's measurement"
        if speed.get("path") not in ATTENTION_PATHS:
            return f"{dtype}'s path is {speed.get('path')!r}, not one of {', '.join(ATTENTION_PATHS)}"
        for name in ("step", "whole", "forward"):
            if (name == "step" or name in speed) and not positive(speed.get(name)):
                return f"{dtype}'s {name} is {speed.get(name)!r}, not a positive number of seconds"
        if "threads" in speed and (type(speed["threads"]) is not int or not 1 <= speed["threads"] <= most):
            return f"{dtype}'s threads is {speed['threads']!r}, not a count of this machine's {most}"
    return None


def today():
    return time.strftime("%Y-%m-%d")
