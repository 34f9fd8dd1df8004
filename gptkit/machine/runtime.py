"""The run's processes and devices: which device and precision, one process or several (started by torchrun or
by launch_processes), the collectives they agree through, and compiling the model for them."""

import ctypes
import gc
import logging
import os
import re
import signal
import sys
import tempfile
import traceback
import uuid
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gptkit.base.errors import UserError
from gptkit.base.signals import LAUNCHER_PID, stop_with_launcher
from gptkit.machine.precision import autocast_for, pick_dtype


def keep_freed_memory():
    """Have glibc's malloc keep freed memory for the next tensor instead of handing it back to the system.

    By default every allocation over 32 MB is a fresh mmap whose pages fault in, zeroed, one by one when first
    written: an eager CPU step of a model as big as the baby GPT (6 layers, 384 wide, 64 x 256 tokens) spends
    much of its time faulting them in (docs/speed.md#what-was-tried). The price: the process keeps its peak
    memory until it exits. Only glibc has these knobs; elsewhere this does nothing. True when the threshold
    was taken."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h; both take C ints
    libc.mallopt(m_trim_threshold, 2**31 - 1)  # and keep up to 2 GB freed at the heap's top, not trimmed
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30))


def check_device_name(name):
    """The one check of a device's name, for every command and the notebook's calls alike (any value: a name is a
    string)."""
    if not isinstance(name, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:[0-9]+)?", name):
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


def allow_tf32(device):
    """On a CUDA device, float32 matmuls and convolutions run on the TF32 tensor cores (process-wide)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(device, dtype):
    """precision.autocast_for on a device named as the runtime names it ('cuda:1', 'cpu')."""
    return autocast_for(dtype, device.split(":")[0])


def allow_eager_fallback():
    """Process-wide: a block that torch.compile cannot compile (no C++ compiler, an unsupported op)
    runs eagerly instead of failing the run."""
    torch._dynamo.config.suppress_errors = True


def compile_blocks(model):
    """Compile each transformer block in place, a block that cannot be compiled running eagerly, and on a GPU
    the loss too. The blocks share one graph, so this compiles in far less time than the whole model, and
    the steps come out faster too; parameter names stay those of the plain model."""
    allow_eager_fallback()
    # dropout's window offset is a number drawn inside each block: captured, it stays in the block's graph, where
    # a break at every dropout would make dropout cost compiled steps far more (docs/speed.md#what-was-tried)
    torch._dynamo.config.capture_scalar_outputs = True
    for block in model.transformer.h:
        block.compile()
    # on a GPU the loss over GPT-2's 50,304 tokens is memory-bound: compiled, it makes GPT-2's step faster
    # (docs/speed.md#what-was-tried). Eager on a CPU: the presets' loss over 65 characters is a sliver of their
    # step, and a compile there would come out of their time budgets, unmeasured
    if next(model.parameters()).is_cuda:
        model.token_loss.compile()


def launched_rank():
    """This process's rank as torchrun set it (0 without torchrun), known before any process group exists."""
    return int(os.environ.get("RANK", 0))


def trains_here(processes):
    """Whether this process trains (alone, or as one of several that torchrun or launch_processes started),
    rather than starting `processes` processes that do."""
    if "RANK" not in os.environ:
        return processes == 1
    world = int(os.environ.get("WORLD_SIZE", 1))
    if processes not in (1, world):
        raise UserError(f"processes={processes}, but torchrun started {world} processes; under torchrun leave "
                        "out --processes (or run `python train.py ... --processes=N` without torchrun)")
    return True


# the signals the launcher passes on to its processes: torch's launcher's own four, and SIGUSR1 (SLURM's warning
# before a time limit), which would otherwise end the launcher alone and leave its processes running
PASSED_ON = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1")
SHUTDOWN_S = 30  # how long a stopped process has to finish its step and save before the launcher kills it


def launch_processes(processes, script, argv):
    """Run `python script argv` as `processes` processes on this machine, started as `torchrun --standalone`
    starts them (torch's launcher, run in this process), and end as they ended, in one line: a stop signal is
    passed on to them and ends this process with 128 + its number, a failed process with that process's status.
    Their stdout is shown as they print it; their stderr when they end, rank 0's and any other rank's that says
    something else, so that the line every rank prints when stopped is shown once."""
    if not dist.is_available():
        raise UserError("this torch build has no torch.distributed, so it cannot train in several processes; "
                        "leave out --processes")
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.Logger.manager.loggerDict):  # its multi-line logs would repeat our one line
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # each process its share of the cores (torchrun gives each one thread), unless the user said otherwise
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in PASSED_ON}
    with tempfile.TemporaryDirectory(prefix="gptkit-processes-") as logs:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                              signals_to_handle=",".join(PASSED_ON), shutdown_timeout=SHUTDOWN_S,
                              logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.ERR))
        ranks, status, line = range(processes), 0, None
        os.environ[LAUNCHER_PID] = str(os.getpid())  # they stop when this process is gone (stop_with_launcher)
        try:
            elastic_launch(config, sys.executable)("-u", os.path.abspath(script), *argv)
        except SignalException as e:
            status = 128 + e.sigval
            line = (f"stopped by {e.sigval.name}; the training processes ended without saying what they saved "
                    f"(each has {SHUTDOWN_S} s to finish its step and save); continue from the latest state saved "
                    "with --init_from=auto")
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()  # the first to fail: the others were stopped because it failed
            ranks, killed = [rank], failure.exitcode < 0
            status = 128 - failure.exitcode if killed else failure.exitcode
            line = f"training process {rank} of {processes} " + \
                (f"was killed by {failure.signal_name()}" if killed else f"failed with exit status {status}")
        finally:
            for name, handler in handlers.items():  # torch's handlers would raise its exception from here on
                signal.signal(getattr(signal, name), handler)
            del os.environ[LAUNCHER_PID]
        said = show_stderr(logs, ranks)
    if status:
        if not said:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(status)  # its line is said, by a process or just above


def show_stderr(logs, ranks):
    """Print what the processes of these ranks wrote to stderr (under the launcher's log folder), a text
    several wrote alike once; whether any of it was an `error: ...` line."""
    shown = []
    for rank in ranks:
        path = next(iter(sorted(Path(logs).glob(f"*/attempt_*/{rank}/stderr.log"))), None)
        text = path.read_text(encoding="utf-8", errors="replace") if path else ""
        if text.strip() and text not in shown:
            sys.stderr.write(text)
            shown.append(text)
    sys.stderr.flush()
    return any(line.startswith("error: ") for text in shown for line in text.splitlines())


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
        keep_freed_memory()
        if threads:
            torch.set_num_threads(threads)
        device = pick_device(device)
        # from before the rendezvous, whose store our launcher holds; the lab's one process too
        stop_with_launcher(SHUTDOWN_S)
        if self.distributed:
            if device.startswith("cuda"):
                device = f"cuda:{self.local_rank}"
                torch.cuda.set_device(device)
            backend = backend if backend != "auto" else "nccl" if device.startswith("cuda") else "gloo"
            if backend == "nccl" and not (device.startswith("cuda") and dist.is_nccl_available()):
                raise UserError(f"backend nccl needs CUDA GPUs and a torch built with NCCL (device here: {device}); "
                                "use --backend=gloo, or auto")
            dist.init_process_group(backend=backend)
        allow_tf32(device)
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
            # a node that went away makes torchrun's launcher stop this process too, at once: that is not the news.
            # Ignored, not blocked: a blocked signal still reaches the handler through another thread
            for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                signal.signal(stop, signal.SIG_IGN)
            traceback.clear_frames(tb)
        lost = lost_peer(exc) if exc is not None else None
        gc.collect()  # free DDP's reducer now, not during interpreter shutdown (which can abort the process)
        dist.destroy_process_group()
        if lost:
            raise UserError(lost) from None


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


# how gloo says a peer went away: "[.../gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:21935: Connection
# reset by peer. ..." or "[...pair.cc:553] Connection closed by peer [10.0.0.2]:21641. ..."
GLOO_LOST = re.compile(r"gloo/transport/\S+\] ([^\[]*?)\s*\[([^\]]+)\]:(\d+)(?::\s*([^.]+))?")


def lost_peer(exc):
    """One line for a collective that failed because another process of the run went away (its node died, or
    its process was killed), naming its address; None for any other failure. The failure may be the context of
    the exception at hand: the launcher's stop signal, raised while the failure was on its way out."""
    while exc is not None and not (isinstance(exc, RuntimeError) and GLOO_LOST.search(str(exc))
                                   or isinstance(exc, getattr(dist, "DistNetworkError", ()))):
        exc = exc.__context__
    if exc is None:
        return None
    found = GLOO_LOST.search(str(exc))
    where = f"the process at {found[2]} (port {found[3]}): {(found[4] or found[1]).lower()}" if found else \
        f"another process: {str(exc).splitlines()[0]}"
    return (f"lost the connection to {where}; that process or its node stopped, so this one stops too. latest.pt "
            "keeps the last state saved: when every node is back, run the same command on each to continue it "
            "(--init_from=auto)")
