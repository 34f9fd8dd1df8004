"""Shared fixtures: the repo on sys.path, wandb kept offline, a tiny prepared corpus, a script runner."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
# the models here are tiny: one thread is fastest, and keeps a shared 2-core machine from thrashing
# (inherited by every subprocess the tests start)
os.environ.setdefault("OMP_NUM_THREADS", "1")

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

SHARED_TIKTOKEN = REPO.parent / "shared" / "data" / "tiktoken"

_SUBJECTS = ["the old king", "a quiet river", "my brother", "the café owner", "Élodie", "the fox",
             "our neighbour", "the naïve poet", "a tired soldier", "the weaver"]
_VERBS = ["watched", "remembered", "carried", "followed", "sang about", "forgot", "painted", "found"]
_OBJECTS = ["the northern hills", "a broken lantern", "the summer rain", "her résumé", "the silver coin",
            "an empty boat", "the long road home", "seven crows", "the morning bell"]
_TAILS = ["", " at dawn", " — and wept", " without a word", " (twice)", ", slowly", "; nobody knew why",
          " before the storm", "!", "?"]


def make_text(n_bytes=6000, seed=0):
    """Deterministic, varied English-like text with a few non-ASCII characters ('é', 'ï', '—', 'É')."""
    rng = random.Random(seed)
    lines = []
    size = 0
    while size < n_bytes:
        speaker = rng.choice(["ROMEO", "JULIET", "NURSE", "CHORUS"])
        sentence = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
                    f"{rng.choice(_TAILS)}").capitalize()
        line = f"{speaker}:\n{sentence}. {rng.randint(0, 99)} times.\n\n"
        lines.append(line)
        size += len(line.encode("utf-8"))
    return "".join(lines)


@pytest.fixture
def corpus_text():
    return make_text()


@pytest.fixture
def corpus_file(tmp_path, corpus_text):
    path = tmp_path / "input.txt"
    path.write_text(corpus_text, encoding="utf-8")
    return path


@pytest.fixture
def prepared(tmp_path, corpus_file):
    """A char-level dataset 'tiny' under tmp_path/data; returns (data_dir, out_dir, meta)."""
    from corpus import PrepareConfig, prepare

    data_dir = tmp_path / "data"
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(data_dir)))
    return data_dir, out_dir, meta


def run_script(script, *args, cwd=REPO, env=None, timeout=120):
    """Run `python script args...` (script relative to the repo root) and capture its text output."""
    script = Path(script)
    if not script.is_absolute():
        script = REPO / script
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_scripts(*calls, cwd=REPO, timeout=120):
    """Run several (script, *args) calls at once (they must be independent); CompletedProcess for each."""
    procs = []
    for script, *args in calls:
        script = Path(script) if Path(script).is_absolute() else REPO / script
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=cwd, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def check_ok(proc):
    """Assert a finished subprocess exited 0, showing its output if not."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """A folder shared by one test module's tests."""
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="module")
def data_dir(workdir):
    """The small corpus prepared once per module through the real data/prepare.py CLI (dataset 'tiny')."""
    text_file = workdir / "input.txt"
    text_file.write_text(make_text(), encoding="utf-8")
    data = workdir / "data"
    check_ok(run_script("data/prepare.py", f"--input={text_file}", "--name=tiny", f"--data_dir={data}"))
    assert (data / "tiny" / "train.bin").exists()
    return data
