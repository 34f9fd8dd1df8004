"""The run's processes and devices (gptkit/machine/runtime.py): compiled blocks keep the plain parameter names and their
dropouts in one graph, and training processes reuse freed memory for big tensors. (Several processes: see
test_ddp.py.)"""

import subprocess
import sys

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
