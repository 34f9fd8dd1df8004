"""The run's processes and devices: which device and precision, one process or several under torchrun,
and the collectives they agree through."""

import collections
import copy
import functools
import gc
import math
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
def cpu_bf16_speedup():
    """How many times faster bf16 matmuls run than fp32 here (0 without bf16 instructions): some CPUs that
    list the instructions run them slower than fp32 (measured 160 vs 290 GFLOP/s on one 2-core Xeon VM),
    so ask the hardware, with a probe of a few tens of milliseconds."""
    return matmul_seconds(torch.float32) / matmul_seconds(torch.bfloat16) if cpu_has_bf16() else 0.0


@functools.cache
def matmul_peak(dtype, device="cpu", size=2048, repeats=5):
    """FLOP/s of the fastest of a few size x size matmuls in dtype on device: the most a training step's
    matmuls can reach here, measured rather than read off a datasheet."""
    a = torch.randn(size, size, device=device).to(DTYPES[dtype])
    return 2 * size ** 3 / fastest_seconds(lambda: a @ a, repeats, device)


def synchronize(device):
    """Wait for the device's queued work, so that a clock read afterwards has seen it finish."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fastest_seconds(run, repeats, device="cpu"):
    """The fastest of `repeats` timings of run(), after one untimed call that pays for kernel selection."""
    best = math.inf
    for i in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def pick_dtype(name, device):
    if name != "auto":
        if name == "float16" and device == "cpu":
            raise UserError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu" and cpu_bf16_speedup() > 1.2:
        return "bfloat16"
    return "float32"


def pick_decode_dtype(name, model, device, batch_size=1, tokens=16):
    """The weights' precision for decoding: as asked, or for 'auto' the faster of float32 and bfloat16 on
    this machine (bfloat16 reads half the bytes per token, but some CPUs compute it slowly), timed on a
    few tokens of this model; and a line saying why. bfloat16 must win clearly (CPUs with fast bfloat16
    run it about twice as fast, the others slower), so the choice does not flip with a machine's noise
    and one seed keeps giving one text."""
    if name != "auto":
        return pick_dtype(name, device), f"decoding in {name}"
    if device.startswith("cuda"):
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16"), "decoding in half precision on CUDA"
    if device != "cpu" or not cpu_has_bf16():
        return "float32", "decoding in float32"
    seconds = {dtype: decode_seconds(copy.deepcopy(model).to(DTYPES[dtype]), batch_size, tokens)
               for dtype in ("float32", "bfloat16")}
    best = "bfloat16" if seconds["bfloat16"] * 1.25 < seconds["float32"] else "float32"
    return best, (f"decoding in {best}: {seconds['float32'] / seconds['bfloat16']:.2f}x the float32 speed in "
                  "bfloat16, measured on this model")


def decode_seconds(model, batch_size, tokens, repeats=3):
    """The fastest of a few timings of decoding `tokens` tokens."""
    prompt = torch.zeros((batch_size, 1), dtype=torch.long, device=next(model.parameters()).device)
    return fastest_seconds(lambda: collections.deque(model.generate_stream(prompt, tokens), maxlen=0), repeats)


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


def pick_attention_path(model, batch_size, autocast, device):
    """For scaled or dot attention on a CPU: SDPA's fused kernels, or the masked softmax written out, which
    is faster for short contexts on some CPUs. One layer's forward and backward at the training shape, timed
    both ways; (fused, a line saying why)."""
    c = model.config
    if device != "cpu" or c.attention not in ("scaled", "dot") or c.n_layer == 0:
        return True, None
    shape = (batch_size, c.n_head, c.block_size, c.n_embd // c.n_head)
    seconds = {fused: attention_seconds(model.transformer.h[0].attn, shape, autocast, fused) for fused in (True, False)}
    fused = seconds[True] <= seconds[False]
    return fused, (f"attention: {'SDPA fused kernels' if fused else 'written-out softmax'} ({seconds[True] * 1e3:.1f} "
                   f"ms fused, {seconds[False] * 1e3:.1f} ms written out per layer, forward and backward, measured)")


def attention_seconds(attn, shape, autocast, fused, repeats=3):
    """The fastest of a few timings of one attention layer's forward and backward."""
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))

    def forward_backward():
        with autocast:
            y = attn.attend(q, k, v, shape[2])
        y.float().sum().backward()

    was, attn.fused = attn.fused, fused
    best = fastest_seconds(forward_backward, repeats)
    attn.fused = was
    return best


def pick_decode_threads(threads, model, device, batch_size=1, tokens=16):
    """CPU threads for decoding, set here: as asked, or for 0 the faster of 1 and torch's default on this model,
    now; and a line saying why. Decoding runs many small operations, each of which waits for all its threads:
    when another process holds a core, every step stalls (on a 2-core machine with a second busy process,
    2 threads decoded 10-50x slower than 1). So more than one thread must win clearly in the probe."""
    if threads:
        torch.set_num_threads(threads)
        return threads, f"decoding on {threads} thread{'s' if threads > 1 else ''}, as asked"
    most = torch.get_num_threads()
    if device != "cpu" or most == 1:
        return most, ""
    seconds = {}
    for n in (1, most):
        torch.set_num_threads(n)
        seconds[n] = decode_seconds(model, batch_size, tokens)
    best = most if seconds[most] * 1.3 < seconds[1] else 1
    torch.set_num_threads(best)
    return best, (f"decoding on {best} thread{'s' if best > 1 else ''}: {most} threads ran at "
                  f"{seconds[1] / seconds[most]:.2f}x the speed of 1 on this model")


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
        self.device = device
        self.set_dtype(self.broadcast(pick_dtype(dtype, device)))  # rank 0's measurement for all

    def set_dtype(self, dtype):
        """Train in dtype: autocast's precision for the matmuls (weights stay float32)."""
        self.dtype, self.autocast = dtype, autocast(self.device, dtype)

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
