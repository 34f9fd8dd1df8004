"""The run's processes and devices: which device and precision, one process or several under torchrun,
and the collectives they agree through."""

import functools
import gc
import os
import re
import signal
import sys
import time
import traceback
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gptkit.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_device_name(name):
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ValueError(f"device must be auto, cpu, mps, cuda or cuda:N (got {name!r})")


def pick_device(name):
    """'auto' means cuda, then mps, then cpu; an explicit choice must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but this torch build sees no CUDA GPU; use --device=cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("device 'mps' asked for, but MPS is not available here; use --device=cpu")
    return name


def cpu_has_bf16():
    """AVX-512 BF16 or AMX in the CPU flags: bf16 matmul instructions exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def matmul_seconds(dtype, size=768, repeats=3):
    a = torch.randn(size, size).to(dtype)
    a @ a  # the first call pays for kernel selection
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return time.perf_counter() - start


@functools.cache
def cpu_bf16_pays():
    """Whether bf16 matmuls actually beat fp32 here: some CPUs that list the bf16 instructions
    run them slower than fp32 (measured 160 vs 290 GFLOP/s on one 2-core Xeon VM), so ask the
    hardware with a probe of a few tens of milliseconds."""
    return cpu_has_bf16() and matmul_seconds(torch.bfloat16) * 1.2 < matmul_seconds(torch.float32)


def pick_dtype(name, device):
    if name != "auto":
        if name == "float16" and device == "cpu":
            raise UserError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu" and cpu_bf16_pays():
        return "bfloat16"
    return "float32"


def autocast(device, dtype):
    """Mixed precision: weights stay fp32, matmuls run in dtype."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=DTYPES[dtype])


def peak_flops(device, dtype):
    """The device's dense peak FLOP/s for dtype, or None where it is not known."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    # dense bf16/fp16 tensor-core peaks from the vendors' datasheets; the first key found in the name wins
    table = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
             "A10": 125e12, "4090": 165e12}
    for key, flops in table.items():
        if key in name:
            return flops if dtype != "float32" else flops / 2  # TF32 runs at half the bf16 rate
    return None


def decode_threads(threads, device):
    """CPU threads for decoding (0 = leave torch's choice). Decoding runs many small operations, each of
    which waits for all its threads: when another process holds a core, every step stalls. Measured on a
    2-core machine: with a second busy process, 2 threads decode 10-50x slower than 1; on an idle machine
    they are about 1.5x faster. One thread is the safe default; --threads=2 where the machine is yours."""
    if threads:
        return threads
    return 1 if device == "cpu" else 0


def allow_eager_fallback():
    """Process-wide: a block that torch.compile cannot compile (no C++ compiler, an unsupported op)
    runs eagerly instead of failing the run."""
    torch._dynamo.config.suppress_errors = True


def compile_blocks(model):
    """Compile each transformer block in place. The blocks share one graph, so this compiles
    in about half the time of the whole model (16 s against 29 s cold on 2 CPU cores) and the
    steps come out faster too; parameter names stay those of the plain model."""
    for block in model.transformer.h:
        block.compile()


def launched_rank():
    """This process's rank as torchrun set it (0 without torchrun), known before any process group exists."""
    return int(os.environ.get("RANK", 0))


class Runtime:
    """One process of the run, or one of several under torchrun (a single process is rank 0 of 1):
    its device, precision and autocast context, and the collectives all processes agree through.

    As a context manager it tears the process group down on the way out."""

    def __init__(self, device="auto", dtype="auto", backend="auto", threads=0):
        self.distributed = int(os.environ.get("RANK", -1)) != -1
        self.rank = launched_rank()
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.master = self.rank == 0
        if threads:
            torch.set_num_threads(threads)
        device = pick_device(device)
        if self.distributed:
            if device.startswith("cuda"):
                device = f"cuda:{self.local_rank}"
                torch.cuda.set_device(device)
            dist.init_process_group(backend=backend if backend != "auto" else
                                    "nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.device, self.dtype = device, pick_dtype(dtype, device)
        self.autocast = autocast(device, self.dtype)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.distributed:
            return
        if exc is None:  # ranks leave together: tearing down gloo while a peer still talks aborts it
            dist.barrier()
        else:  # the failed frames hold the DDP wrapper, which holds the process group
            traceback.clear_frames(tb)
        gc.collect()  # free DDP's reducer now, not during interpreter shutdown (which can abort the process)
        dist.destroy_process_group()

    def wrap(self, model):
        """The module to train through: the model itself, or DDP around it when there are several processes."""
        if not self.distributed:
            return model
        return DDP(model, device_ids=[self.local_rank] if self.device.startswith("cuda") else None)

    def no_sync(self, model, sync):
        """Skip DDP's gradient all-reduce on all but the last micro-batch of a step."""
        return model.no_sync() if self.distributed and not sync else nullcontext()

    def mean(self, value):
        """The mean of a number over all processes."""
        if self.distributed:
            t = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            value = t.item() / self.world
        return value

    def max(self, value):
        """The largest of a number over all processes."""
        if self.distributed:
            t = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            value = t.item()
        return value

    def any(self, flag):
        """Whether flag is set on any process (every process must ask, or the others wait)."""
        return bool(self.max(float(flag)))

    def gather(self, obj):
        """Every process's obj, in rank order."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's obj, on every process."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


class StopSignals:
    """Ctrl-C (SIGINT), a scheduler's stop (SIGTERM) and SLURM's warning before its time limit (SIGUSR1)
    become a request the training loop sees after its step, so the step finishes and is saved; `signum`
    is the first one received (0 for none). A second Ctrl-C stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum = 0

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        return self

    def handle(self, signum, frame):
        if signum == signal.SIGINT and self.signum:
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
