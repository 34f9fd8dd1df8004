"""Failures found before they cost anything, each as one line: a checkpoint whose checksum is right but whose
fields are not what this tool writes, a run folder the run could not save to, sizes no memory holds, and a
second Ctrl-C in the middle of a checkpoint write."""

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from conftest import REPO, assert_one_error_line, run_script, train_args, train_cmd
from gptkit import checkpoint
from gptkit.checkpoint import MODEL_KEYS, TRAINING_KEYS, HashingWriter, load_checkpoint, save_checkpoint
from gptkit.errors import RunStopped, UserError, run_main
from gptkit.explorer import summarize


def files(folder):
    """Every file's bytes but run.lock's, which holds the process id of the last run to start there."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "run.lock"}


def train_again(run, data_dir, init_from, max_iters, *extra):
    """train.py on the tiny dataset into the copied run folder, continuing it as init_from says."""
    return run_script("train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}",
                      f"--init_from={init_from}", f"--max_iters={max_iters}", *extra)


# ---------------------------------------------------------------------------------------------- checkpoint fields

DELETE = object()


def rewrite(path, where, value):
    """Rewrite a checkpoint with the field at `where` (keys and list indices, outermost first) set to value, or
    deleted, through save_checkpoint: its checksum is right, only the field is wrong."""
    ckpt = load_checkpoint(path)
    del ckpt["format_version"]
    *outer, last = where
    holder = ckpt
    for key in outer:
        holder = holder[key]
    if value is DELETE:
        del holder[last]
    else:
        holder[last] = value
    save_checkpoint(ckpt, path)


def first_weight(path):
    return next(iter(load_checkpoint(path)["model"]))


# (the field, the value written there, what the error line says of it)
DAMAGE = {
    "best_val_loss a string": (("best_val_loss",), "x", "best_val_loss is 'x', not a number"),
    "best_val_loss NaN": (("best_val_loss",), float("nan"), "best_val_loss is nan, not a number"),
    "best_val_loss a bool": (("best_val_loss",), True, "best_val_loss is True, not a number"),
    "iter_num a float": (("iter_num",), 2.5, "iter_num is 2.5, not a whole number of at least 0"),
    "iter_num negative": (("iter_num",), -1, "iter_num is -1, not a whole number of at least 0"),
    "vocabulary not a string": (("tokenizer", "vocab"), 65, "tokenizer.vocab is 65, not a string"),
    "vocabulary missing": (("tokenizer", "vocab"), DELETE, "tokenizer has no vocab"),
    "tokenizer unknown": (("tokenizer", "tokenizer"), "bpe", "tokenizer.tokenizer is 'bpe', not 'char' or 'tiktoken'"),
    "tokenizer not a dict": (("tokenizer",), "char", "tokenizer is 'char', not a dict"),
    "model_args not a dict": (("model_args",), [1, 2], "model_args is a list, not a dict"),
    "a model setting of another type": (("model_args", "n_layer"), "2",
                                        "model_args.n_layer is '2', not a whole number"),
    "a model flag not a bool": (("model_args", "bias"), 1, "model_args.bias is 1, not True or False"),
    "weights not a dict": (("model",), 3, "model is 3, not a dict"),
    "a weight not a tensor": (("model", "FIRST"), [0.5], "model['FIRST'] is a list, not a tensor"),
    "optimizer not a list": (("optimizer",), {"state": {}}, "optimizer is a dict, not a list"),
    "optimizer state not a dict": (("optimizer", 0, "state"), 5, "optimizer[0].state is 5, not a dict"),
    "scaler not a dict": (("scaler",), None, "scaler is None, not a dict"),
    "config not a dict": (("config",), "x", "config is 'x', not a dict"),
    "rng not a list": (("rng",), 5, "rng is 5, not a list"),
    "python random state": (("rng", 0, "python"), (3, (1, 2), None),
                            "rng[0].python is a tuple, not a Python random state"),
    "numpy random state": (("rng", 0, "numpy"), ["MT19937"], "rng[0].numpy is a list, not a numpy random state"),
    "torch random state": (("rng", 0, "torch"), torch.zeros(3), "rng[0].torch is a tensor, not a torch random state"),
    "sampler state missing": (("rng", 0, "sampler", "generator"), DELETE, "rng[0].sampler has no generator"),
    "seconds_spent a string": (("seconds_spent",), "12", "seconds_spent is '12', not a number"),
    "measured not a dict": (("measured",), "float32", "measured is 'float32', not a dict"),
    "wandb_id a number": (("wandb_id",), 7, "wandb_id is 7, not a string or None"),
}


def damage(path, case):
    """Write one DAMAGE case into the checkpoint at path; the problem its error line names."""
    where, value, problem = DAMAGE[case]
    if "FIRST" in where:
        name = first_weight(path)
        where, problem = tuple(name if k == "FIRST" else k for k in where), problem.replace("FIRST", name)
    rewrite(path, where, value)
    return problem


@pytest.mark.parametrize("case", DAMAGE)
def test_a_field_of_the_wrong_kind_is_named_on_load(run, case):
    """Every field a resume reads, broken in turn, in a file whose checksum is right: refused with one line
    naming the file and the field. Loaded for sampling, the file is refused too where the field is one
    sampling reads, and loads where it is not."""
    path = run / "latest.pt"
    problem = damage(path, case)
    with pytest.raises(UserError) as info:
        load_checkpoint(path, required=TRAINING_KEYS)
    assert str(info.value) == f"{path} is damaged: {problem}"
    if DAMAGE[case][0][0] in MODEL_KEYS:
        with pytest.raises(UserError, match="is damaged: "):
            load_checkpoint(path, required=MODEL_KEYS)
    else:  # a field sample.py never reads does not stop it
        load_checkpoint(path, required=MODEL_KEYS)


def test_every_checkpoint_a_run_writes_passes_its_checks(run):
    for name in ("latest.pt", "latest.prev.pt"):
        load_checkpoint(run / name, required=TRAINING_KEYS)
    load_checkpoint(run / "best.pt", required=MODEL_KEYS)


@pytest.mark.parametrize("case", ["best_val_loss a string", "vocabulary not a string", "a weight not a tensor",
                                  "python random state", "optimizer state not a dict"])
def test_resume_refuses_a_damaged_field_in_one_line(run, data_dir, case):
    """train.py --init_from=resume, with the state before the latest gone: one line names the field, and no
    file changes."""
    (run / "latest.prev.pt").unlink()
    path = run / "latest.pt"
    problem = damage(path, case)
    before = files(run)
    proc = train_again(run, data_dir, "resume", 40)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {path} is damaged: {problem}")
    assert files(run) == before


def test_resume_without_iter_num_is_one_line(run, data_dir):
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("iter_num",), DELETE)
    proc = train_again(run, data_dir, "resume", 40)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} is incomplete: it lacks iter_num")


def test_a_damaged_field_in_latest_falls_back_to_the_state_before(run, data_dir):
    problem = damage(run / "latest.pt", "best_val_loss a string")
    proc = train_again(run, data_dir, "resume", 25)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"note: {run / 'latest.pt'} is damaged: {problem}; resuming from "
                                  f"{run / 'latest.prev.pt'} (iteration 20)\n"), proc.stdout
    assert load_checkpoint(run / "latest.pt", required=TRAINING_KEYS)["iter_num"] == 25


@pytest.mark.parametrize("case", ["vocabulary not a string", "model_args not a dict", "a weight not a tensor",
                                  "a model setting of another type", "tokenizer unknown"])
def test_sample_refuses_a_damaged_field_in_one_line(run, case):
    path = run / "best.pt"
    problem = damage(path, case)
    proc = run_script("sample.py", f"--out_dir={run}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {path} is damaged: {problem}")


# a setting in a checkpoint's saved config that no run saves: (its key, the value written, what the line says)
SAVED_SETTINGS = {
    "a float a string": ("learning_rate", "x", "learning_rate must be float, got 'x'"),
    "an int a string": ("eval_iters", "4", "eval_iters must be int, got '4'"),
    "a flag a number": ("decay_lr", 2, "decay_lr must be bool, got 2"),
    "a choice no run makes": ("optimizer", "sgd", "optimizer must be one of adamw, muon (got 'sgd')"),
}


@pytest.mark.parametrize("case", SAVED_SETTINGS)
def test_resume_refuses_a_saved_setting_of_the_wrong_type_in_one_line(run, data_dir, case):
    """A checksummed file whose saved config holds a value of another type: one line naming the file and the
    setting (it was a TypeError traceback from the config's range checks), and no file changes."""
    key, value, problem = SAVED_SETTINGS[case]
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("config", key), value)
    before = files(run)
    proc = train_again(run, data_dir, "auto", 40)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} is damaged: its saved config: {problem}")
    assert files(run) == before


def test_a_saved_setting_of_the_wrong_type_falls_back_to_the_state_before(run, data_dir):
    rewrite(run / "latest.pt", ("config", "learning_rate"), "x")
    proc = train_again(run, data_dir, "auto", 25)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"note: {run / 'latest.pt'} is damaged: its saved config: learning_rate must be "
                                  f"float, got 'x'; resuming from {run / 'latest.prev.pt'} (iteration 20)\n")


def test_a_saved_setting_out_of_range_is_named_and_can_be_given_again(run, data_dir):
    """A saved value of the right type but out of range: one line says it comes from the checkpoint; the same
    setting given again replaces it and the run goes on."""
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("config", "learning_rate"), -1.0)
    args = [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}", "--init_from=auto", "--max_iters=32"]
    proc = run_script("train.py", *args)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: learning_rate must be at least 0 (got -1.0), with the settings saved "
                                       f"in {run / 'latest.pt'} (give one again to replace its saved value)")
    proc = run_script("train.py", *args, "--learning_rate=1e-3")
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(run / "latest.pt")["config"]["learning_rate"] == 1e-3


def test_a_model_setting_no_model_takes_is_one_line_naming_the_file_to_every_reader(run):
    """A model setting of the right type but among no choice of its own (the schema checks types): sample.py,
    and the explorer's list of runs, each say it in one line naming the file."""
    path = run / "best.pt"
    rewrite(path, ("model_args", "pos_emb"), "bogus")
    line = (f"{path} was written with model settings this version cannot build (pos_emb must be one of learned, "
            "rope, none (got 'bogus'))")
    proc = run_script("sample.py", f"--out_dir={run}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {line}")
    assert summarize("run", run).error == line


# ---------------------------------------------------------------------------------------------- a folder to save in

@pytest.fixture
def immutable(tmp_path):
    """chattr +i, undone after the test. For root, chmod leaves every file writable, so it cannot make a folder
    read-only; the immutable attribute stops root's writes too, and os.access reports it. Skipped where the
    filesystem or the user cannot set it (the chmod test below runs there instead)."""
    made = []

    def make(path):
        if not shutil.which("chattr"):
            pytest.skip("no chattr here")
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("cannot set the immutable attribute here (a filesystem without it, or not root)")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("what", ["the folder", "metrics.jsonl", "best.pt", "run.lock"])
def test_a_run_folder_that_cannot_be_written_is_refused_before_any_work(run, data_dir, immutable, what):
    """A run resumed into a folder (or onto a file) it cannot write stops at start-up with one line, rather
    than train to its first save and fail there; nothing in the folder changes."""
    target = run if what == "the folder" else run / what
    before = files(run)
    immutable(target)
    proc = train_again(run, data_dir, "auto", 40, "--eval_interval=5")
    assert proc.returncode == 1 and "iter " not in proc.stdout, proc.stdout
    expected = (f"error: cannot write to out_dir {run} (a run saves its state there); make it writable or pick "
                "another --out_dir" if what == "the folder" else
                f"error: cannot write {target}, which a run writes; make it writable or pick another --out_dir")
    assert_one_error_line(proc.stderr, expected)
    assert files(run) == before


def test_a_folder_this_user_may_not_write_is_refused_before_any_work(run, data_dir, monkeypatch):
    """What a user who is not root sees of a folder they made read-only (chmod a-w), with os.access answering
    as it would for them: root's os.access says yes to any mode, so here it is made to say no. Tested through
    train.main, so no work starts and the file system is untouched."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != run and real_access(path, mode, **kw))
    before = files(run)
    with pytest.raises(UserError) as info:
        train.main(train_args(data_dir, run, "--init_from=auto", "--max_iters=40"))
    assert str(info.value) == f"cannot write to out_dir {run} (a run saves its state there); make it writable " \
                              "or pick another --out_dir"
    assert files(run) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: chmod cannot test this")
def test_a_read_only_folder_is_refused_before_any_work(run, data_dir):
    run.chmod(0o555)
    try:
        proc = run_script("train.py", *train_args(data_dir, run, "--init_from=auto", "--max_iters=40"))
    finally:
        run.chmod(0o755)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: cannot write to out_dir {run}*")


# ---------------------------------------------------------------------------------------------- memory

# runs a script with its address space capped at 8 GiB: should a change make the first allocation a small one,
# the test fails on its size instead of filling this machine's memory
LIMITED = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


TRAIN_SIZES = "(batch_size, block_size, n_embd, n_layer, n_head, eval_iters)"


@pytest.mark.parametrize("script,args,settings", [
    ("train.py", ["--n_embd=2**44", "--n_head=1"], TRAIN_SIZES),
    ("sample.py", ["--num_samples=10**15"], "(num_samples, max_new_tokens)"),
    ("bench.py", ["sample", "--vocab_size=10**15"], "(batch_size, block_size, n_embd, n_layer, vocab_size, "
                                                   "max_new_tokens)"),
])
def test_a_size_no_memory_holds_is_one_line_naming_the_settings(trained_run, data_dir, tmp_path, script, args,
                                                                 settings):
    """Sizes of petabytes: the first tensor they shape fails at once, before anything else is allocated (so the
    test itself takes no memory), and the line names the settings that size this command's memory."""
    args = [a.replace("10**15", str(10 ** 15)).replace("2**44", str(2 ** 44)) for a in args]
    if script == "train.py":
        args = train_args(data_dir, tmp_path / "out", "--max_iters=2", *args)
    elif script == "sample.py":
        # measured choices off: on a CPU with nothing to time, sample.py prints its choice before decoding fails
        args = [f"--out_dir={trained_run[0]}", "--device=cpu", "--dtype=float32", "--threads=1", *args]
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(REPO / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr)
    assert re.fullmatch(r"error: out of memory: tried to allocate [0-9.,]+ [PE]iB; lower the sizes of this run "
                        + re.escape(settings), line), line


@pytest.mark.parametrize("error,expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
                            "79.11 GiB of which 3.50 GiB is free."),
     "error: out of memory: tried to allocate 20.0 GiB; lower the sizes of this run (batch_size)"),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GiB, other allocations: 2.00 MiB, max allowed: "
                  "9.07 GiB). Tried to allocate 256.00 MiB on private pool."),
     "error: out of memory: tried to allocate 256.0 MiB; lower the sizes of this run (batch_size)"),
    (MemoryError(), "error: out of memory; lower the sizes of this run (batch_size)"),
    (RuntimeError("std::bad_alloc"), "error: out of memory; lower the sizes of this run (batch_size)"),
    (RuntimeError("Storage size calculation overflowed with sizes=[1000000000000000, 1000000000000000]"),
     "error: out of memory; lower the sizes of this run (batch_size)"),
])
def test_every_allocator_s_failure_is_the_same_one_line(capsys, error, expected):
    """CUDA's, MPS's and Python's ways of running out, which this CPU machine cannot produce, and a size whose
    byte count overflows 64 bits (its end-to-end case is in test_errors' table)."""
    def main():
        raise error

    with pytest.raises(SystemExit) as info:
        run_main(main, memory_settings=("batch_size",))
    assert info.value.code == 1
    assert_one_error_line(capsys.readouterr().err, expected)


def test_another_runtime_error_is_not_called_out_of_memory():
    def main():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run_main(main, memory_settings=("batch_size",))


# ---------------------------------------------------------------------------------------------- Ctrl-C in a save

class InterruptedFile(io.FileIO):
    """A checkpoint file whose writes past its first 4 KiB raise `stop`, as a signal handler does."""
    stop = KeyboardInterrupt()

    def write(self, data):
        if self.tell() + len(data) > 4096:
            raise self.stop
        return super().write(data)


@pytest.fixture
def saved(tmp_path):
    """A folder with a saved latest.pt, and the state of a larger one to save over it."""
    path = tmp_path / "latest.pt"
    save_checkpoint({"w": torch.zeros(4)}, path)
    return path, {f"w{i}": torch.randn(1000) for i in range(8)}


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), RunStopped("stopped by SIGTERM while saving", signal.SIGTERM)])
def test_an_interrupt_inside_a_checkpoint_write_is_raised_as_itself(saved, monkeypatch, stop):
    """A signal handler's exception raised by the file's write: torch's zip writer turns it into a RuntimeError,
    which must not be reported as a failed write. The previous checkpoint is kept and the .tmp removed."""
    path, state = saved
    before = path.read_bytes()
    monkeypatch.setattr(InterruptedFile, "stop", stop)
    monkeypatch.setattr(checkpoint, "open", lambda p, mode, **kw: InterruptedFile(p, mode), raising=False)
    with pytest.raises(type(stop)):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


def test_an_interrupt_as_a_write_begins_is_raised_as_itself(saved, monkeypatch):
    """Where a signal comes while torch's own code runs, Python raises its handler's exception as the next write
    is entered, before the writer's code runs: still an interrupt, not a failed write."""
    path, state = saved
    before = path.read_bytes()
    real_write, calls = HashingWriter.write, []

    def write(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_write(self, data)

    monkeypatch.setattr(HashingWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


def test_an_interrupt_after_the_writes_removes_the_tmp(saved, monkeypatch):
    """Ctrl-C while the file is flushed to disk, outside torch's writer: raised as itself, nothing left behind."""
    path, state = saved
    before = path.read_bytes()

    def fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


WRAPPER = '''
import io, os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
sys.argv[0] = os.path.join({repo!r}, "train.py")
import train
from gptkit import checkpoint
from gptkit.errors import run_main

saves = 0


class Interrupted(io.FileIO):
    """latest.pt.tmp of the second save: past its first 4 KiB, Ctrl-C is pressed twice."""

    def write(self, data):
        if self.tell() + len(data) > 4096:
            signal.raise_signal(signal.SIGINT)  # the first: stop after this step, saved
            signal.raise_signal(signal.SIGINT)  # the second: stop now
        return super().write(data)


def interrupting_open(path, mode="r", *args, **kwargs):
    global saves
    if Path(path).name == "latest.pt.tmp":
        saves += 1
        if saves == 2:
            return Interrupted(path, "wb")
    return open(path, mode, *args, **kwargs)


checkpoint.open = interrupting_open
run_main(train.main)
'''


def test_a_second_ctrl_c_during_a_save_exits_as_an_interrupt(tmp_path, data_dir):
    """Through the CLI: the documented exit of a second Ctrl-C (130, `error: interrupted`), the state saved
    before it (iteration 5) intact as latest.pt, and no .tmp left behind."""
    script = tmp_path / "train_ctrl_c.py"
    script.write_text(WRAPPER.format(repo=str(REPO)), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run(train_cmd(data_dir, out, "--max_iters=20", "--eval_interval=5", "--eval_iters=2",
                                    script=script), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert_one_error_line(proc.stderr, "error: interrupted")
    assert load_checkpoint(out / "latest.pt", required=TRAINING_KEYS)["iter_num"] == 5
    assert not (out / "latest.pt.tmp").exists() and not (out / "latest.prev.pt").exists()
