"""The run's processes and devices (gptkit/machine/runtime.py): compiled blocks keep the plain parameter names and their
dropouts in one graph, training processes reuse freed memory for big tensors, and a process that train.py's launcher
started stops when the launcher is gone. (Several processes: see test_ddp.py.)"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, tiny_model, train_config
from gptkit.machine.runtime import compile_blocks
from gptkit.machine.stand_ins import by_rule, install


def test_compiled_blocks_keep_the_plain_parameter_names():
    model = tiny_model(config=train_config().model, vocab_size=20)
    names = list(model.state_dict())
    compile_blocks(model)  # compiles lazily, at the first call: nothing is compiled here
    assert list(model.state_dict()) == names and not any("_orig_mod" in n for n in names)
    assert all(block._compiled_call_impl is not None for block in model.transformer.h)


def test_a_compiled_block_keeps_its_dropouts_in_one_graph():
    """Dropout draws its mask's offset as a number inside the block; compiled blocks capture it rather than
    breaking the graph at every dropout, which cost compiled steps with dropout 0.1 about 5% more."""
    model = tiny_model(config=train_config(dropout=0.1).model, vocab_size=20).train()
    install(model, by_rule("cpu"))  # dropout's masks from the table, as a CPU run draws them
    compile_blocks(model)
    block, x = model.transformer.h[0], torch.randn(4, 16, 32)
    type(block).forward(block, x)  # eagerly, as a run's start-up probes do: builds the table of masks
    explained = torch._dynamo.explain(type(block).forward)(block, x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


FAULTS_OF_BIG_TENSORS = """
import resource, sys, torch
from gptkit.machine.runtime import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
for _ in range(20):  # until the heap holds free blocks that fit (allocations are aligned)
    torch.ones(16 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(16 << 20)  # 64 MB, over glibc's largest default mmap threshold (32 MB)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "gnu_get_libc_version"), reason="glibc only")
def test_training_processes_reuse_freed_memory_for_big_tensors():
    """A big activation freed and allocated again each step must not fault its pages in afresh: by default glibc
    maps every allocation over 32 MB anew, which cost the baby GPT's eager CPU step nearly half its time."""
    faults = {}
    for mode in ("default", "kept"):
        run = subprocess.run([sys.executable, "-c", FAULTS_OF_BIG_TENSORS, mode], capture_output=True, text=True,
                             check=True, cwd=REPO)
        faults[mode] = int(run.stdout)
    if faults["default"] < 10 * 16_000:  # 16,384 pages of 4 KB each time, unless huge pages back them
        pytest.skip(f"big allocations fault in {faults['default']:,} pages here, not page by page")
    assert faults["kept"] < faults["default"] / 20


# a process as train.py's launcher starts it (the launcher's id in its environment: its parent's, unless given),
# watching for the launcher to go; on SIGTERM it dies (default), ignores it, or writes the signal's name to a file
WATCHING = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from gptkit.base.signals import LAUNCHER_PID, stop_with_launcher
launcher, sleep, on_sigterm = sys.argv[2:]
os.environ[LAUNCHER_PID] = launcher or str(os.getppid())
if on_sigterm == "ignore":  # as a process stuck where no handler runs: the stop never takes effect
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif on_sigterm != "default":
    def stop(signum, frame):
        open(on_sigterm, "w").write(signal.Signals(signum).name)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
stop_with_launcher(grace_s=0.5)
print(os.getpid(), flush=True)
time.sleep(float(sleep))
"""


def watching(launcher="", sleep=20, on_sigterm="default"):
    return [sys.executable, "-c", WATCHING, str(REPO), str(launcher), str(sleep), str(on_sigterm)]


def gone_process():
    """The id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("launcher, on_sigterm, status", [
    ("gone", "default", -signal.SIGTERM),  # gone before the process looked: the parent it has is not the launcher
    ("gone", "ignore", -signal.SIGKILL),  # then killed grace_s later, where the stop does not take effect
    ("here", "default", 0)])  # this test, its parent, is there all along: it runs to its end
def test_a_process_stops_when_the_launcher_that_started_it_is_gone(launcher, on_sigterm, status):
    launcher, start = gone_process() if launcher == "gone" else os.getpid(), time.time()
    proc = subprocess.run(watching(launcher, sleep=1 if status == 0 else 20, on_sigterm=on_sigterm),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == status, proc.stderr
    assert time.time() - start < 5


def test_a_process_stops_when_its_launcher_is_killed_with_sigkill(tmp_path):
    """kill -9 of the launcher passes nothing on: the process sees its parent gone, and stops as SIGTERM stops it
    (a training process finishes its step and saves). train.py itself: test_ddp.py."""
    stopped = tmp_path / "stopped.txt"
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
                                 *watching(on_sigterm=stopped)], stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())  # watching now
    launcher.kill()
    launcher.wait()
    try:
        deadline = time.time() + 5
        while not (stopped.exists() and stopped.read_text()) and time.time() < deadline:  # written whole
            time.sleep(0.05)
        assert stopped.exists() and stopped.read_text() == "SIGTERM"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)  # the process, should it still be there
        except ProcessLookupError:
            pass
