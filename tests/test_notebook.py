"""notebooks/inside_your_model.ipynb: committed without outputs, and executed from top to bottom on a trained run,
its folder given as the notebook's parameter, as papermill would give it.

The kernel is ipykernel's own python3 kernel spec, built in memory by jupyter_client with no kernel spec folder
searched: it starts this interpreter (sys.executable), whatever kernels the machine has installed, or none."""

import shutil
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from conftest import REPO, check_ok, run_here

NOTEBOOK = REPO / "notebooks" / "inside_your_model.ipynb"
WATCH = REPO / "notebooks" / "watch_it_learn.ipynb"


def parameters_cell(nb):
    """The one cell tagged `parameters`, where papermill (or a test) puts its own values."""
    found = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(found) == 1, "one cell tagged parameters"
    return found[0]


def this_interpreter():
    """A kernel manager for ipykernel's python3 kernel spec as ipykernel itself writes it, with no kernel spec
    folder searched (an installed spec could name another Python): its command starts sys.executable."""
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))


def executed(out_dir, kernel, notebook=NOTEBOOK):
    """The notebook run in kernel, started in notebooks/ as Jupyter starts it, with out_dir as its run."""
    nb = nbformat.read(notebook, as_version=4)
    parameters_cell(nb).source = f"out_dir = {str(out_dir)!r}"
    NotebookClient(nb, km=kernel, timeout=120, resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def text_of(cell):
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


@pytest.mark.parametrize("notebook, out_dir", [(NOTEBOOK, "out"), (WATCH, "out-induction")])
def test_the_notebooks_are_committed_without_outputs_and_take_the_run_folder_as_a_parameter(notebook, out_dir):
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert parameters_cell(nb).source == f'out_dir = "{out_dir}"'
    assert nb.metadata.kernelspec.name == "python3"


def with_small_sae(run, folder):
    """A copy of the run with a small SAE on its last layer, trained by analyze.py in a few seconds: the notebook
    reads it rather than train the default one."""
    shutil.copytree(run, folder)
    check_ok(run_here("analyze.py", "features", folder, "--tokens=4096", "--batch=256", "--features=64", "--k=4",
                      "--eval_tokens=256"))
    return folder


@pytest.mark.slow
def test_the_notebook_runs_on_a_trained_run(trained_run, tmp_path):
    out, kernel = with_small_sae(trained_run[0], tmp_path / "run"), this_interpreter()
    assert kernel.kernel_spec.argv[0] == sys.executable
    nb = executed(out, kernel)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)
    printed = "\n".join(map(text_of, code))
    assert f"{out}: 2 layers of 2 heads" in printed  # the run it was given, not ./out
    # a line from each step; the notebook asserts its own checks (by hand = hooked, the ablation's two ways
    # agreeing, patching the differing position restoring the clean run, the parts summing to the logit)
    for line in ("hook_q is after qk_norm", "largest difference from blocks.1.attn.hook_pattern", "with L0H0 off",
                 "the strongest induction head", "layer 0's stream patched at position 0", "parts sum to",
                 "64 features at blocks.1.hook_resid_post", "off: val loss"):
        assert line in printed, line
    assert sum(output.output_type == "display_data" for cell in code for output in cell.outputs) == 2  # 2 pictures


@pytest.mark.slow
def test_the_notebook_runs_on_a_bpe_run(bpe_trained_run, tmp_path):
    """On a run with a BPE vocabulary, whose tokens are not characters: the patching step still finds two
    prompts of one length in tokens."""
    nb = executed(with_small_sae(bpe_trained_run, tmp_path / "run"), this_interpreter())
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)
    assert "layer 0's stream patched at position 0" in "\n".join(map(text_of, code))


@pytest.mark.slow
def test_watch_it_learn_runs_on_a_run_trained_on_lines_written_twice(tmp_path):
    """A tiny two-layer attention-only model trained a few steps on random letter strings each written twice,
    keeping its timeline and snapshots: every step of the lesson runs on it."""
    import train
    from gptkit.data.preparing import PrepareConfig, prepare
    from gptkit.data.synthetic import repeats_text

    (tmp_path / "repeats.txt").write_text(repeats_text(3000), encoding="utf-8")
    prepare(PrepareConfig(input=str(tmp_path / "repeats.txt"), name="repeats", data_dir=str(tmp_path / "data")))
    out = tmp_path / "out-induction"
    train.main([f"--data_dir={tmp_path / 'data'}", "--dataset=repeats", f"--out_dir={out}", "--device=cpu",
                "--dtype=float32", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=64", "--mlp=False",
                "--token_shift=False", "--batch_size=8", "--max_iters=40", "--eval_interval=10", "--eval_iters=2",
                "--snapshots=3", "--max_time=0"])
    nb = executed(out, this_interpreter(), WATCH)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)
    printed = "\n".join(map(text_of, code))
    for line in ("2 layers of 2 heads, mlp=False, token_shift=False", "the strongest induction head is",
                 "layer 0's strongest previous-token head", "with the previous-token head", "loss on the first copies",
                 "snapshots at steps [0,"):
        assert line in printed, line
