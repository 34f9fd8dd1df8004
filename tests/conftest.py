"""Shared fixtures: the repo on sys.path, wandb kept offline, one tiny prepared corpus and one tiny trained run
per session, script runners, and the check every user-facing failure must pass (one `error:` line)."""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
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
POLL_S = 0.02  # how often a test looks at a background run: often enough, without taking a core from it

_SUBJECTS = ["the old king", "a quiet river", "my brother", "the café owner", "Élodie", "the fox",
             "our neighbour", "the naïve poet", "a tired soldier", "the weaver"]
_VERBS = ["watched", "remembered", "carried", "followed", "sang about", "forgot", "painted", "found"]
_OBJECTS = ["the northern hills", "a broken lantern", "the summer rain", "her résumé", "the silver coin",
            "an empty boat", "the long road home", "seven crows", "the morning bell"]
_TAILS = ["", " at dawn", " — and wept", " without a word", " (twice)", ", slowly", "; nobody knew why",
          " before the storm", "!", "?"]
EXTRA_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"

# the shape of every tiny model trained through the CLI
MODEL = ["--device=cpu", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
         "--batch_size=4"]


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


# ---------------------------------------------------------------------------------------------- tiny models

TINY = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
MODERN = dict(pos_emb="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2", tie_weights=False,
              logit_softcap=15.0, zero_init_proj=False)


def tiny_model(seed=0, sharpen=1.0, attention_weights=0.0, **overrides):
    """A tiny GPT (TINY with overrides) in eval mode. sharpen > 1 scales the head so that sampling is far from
    uniform; attention_weights > 0 redraws attention's weights with that spread, so that its weights are far
    from uniform and every term matters."""
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(**dict(TINY, **overrides))).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
        for name, p in model.named_parameters():
            if attention_weights and ".attn." in name:
                p.normal_(0, attention_weights)
    return model


def random_tokens(shape, vocab=TINY["vocab_size"], seed=1):
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(seed))


def naive_attention(attn, x, rotary=None, qk_norm=None):
    """The oracle every attention path is held to, written as the notes write it: per batch row, head and query
    position, a score against every key it may see (all of them without the causal mask), a softmax, and the
    weighted sum of the values; then the output projection. rotary: (cos, sin) tables; qk_norm: a function."""
    from model import apply_rotary

    B, T, C = x.shape
    H, D = attn.n_head, C // attn.n_head
    proj = x @ attn.c_attn.weight.T + (0 if attn.c_attn.bias is None else attn.c_attn.bias)
    q = k = None
    if attn.kind == "uniform":
        v = proj.reshape(B, T, H, D)
    else:
        q, k, v = (t.reshape(B, T, H, D) for t in proj.split(C, dim=-1))
    if qk_norm:
        q, k = qk_norm(q), qk_norm(k)
    if rotary is not None:
        cos, sin = rotary[0][:, None, :], rotary[1][:, None, :]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = torch.zeros(B, T, H, D)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                seen = range(t + 1) if attn.causal else range(T)
                if attn.kind == "uniform":
                    weights = torch.full((len(seen),), 1 / len(seen))
                elif attn.kind == "additive":
                    weights = torch.stack([(attn.score_v[h] * torch.tanh(q[b, t, h] + k[b, s, h])).sum()
                                           for s in seen]).softmax(0)
                else:
                    scale = math.sqrt(D) if attn.kind == "scaled" else 1.0
                    weights = torch.stack([(q[b, t, h] * k[b, s, h]).sum() / scale for s in seen]).softmax(0)
                out[b, t, h] = sum(w * v[b, s, h] for w, s in zip(weights, seen))
    return out.reshape(B, T, C) @ attn.c_proj.weight.T + (0 if attn.c_proj.bias is None else attn.c_proj.bias)


@pytest.fixture
def tiktoken_cache(monkeypatch):
    """GPT-2's BPE offline, from the shared cache of r50k_base (the same ranks as gpt2): the environment that
    points tiktoken there, also set for this test and the scripts it runs."""
    if not (SHARED_TIKTOKEN / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4").is_file():
        pytest.skip(f"no cached r50k_base encoding at {SHARED_TIKTOKEN} (and no network to fetch it)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))
    return {"TIKTOKEN_CACHE_DIR": str(SHARED_TIKTOKEN)}


@pytest.fixture
def corpus_text():
    return make_text()


@pytest.fixture
def corpus_file(tmp_path, corpus_text):
    path = tmp_path / "input.txt"
    path.write_text(corpus_text, encoding="utf-8")
    return path


def run_script(script, *args, cwd=REPO, env=None, timeout=120):
    """Run `python script args...` (script relative to the repo root) and capture its text output."""
    script = Path(script)
    if not script.is_absolute():
        script = REPO / script
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def check_ok(proc):
    """Assert a finished subprocess exited 0, showing its output if not."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def assert_one_error_line(stderr, expected=None):
    """A user-caused failure prints exactly one line, `error: ...`, and no traceback; returns that line.
    expected: the whole line, or a prefix followed by '*'."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    if expected is not None:
        if expected.endswith("*"):
            assert lines[0].startswith(expected[:-1]), stderr
        else:
            assert lines[0] == expected, stderr
    return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """A folder shared by one test module's tests."""
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The small corpus prepared once per session through the real data/prepare.py CLI (dataset 'tiny').
    Tests read it and never change it."""
    folder = tmp_path_factory.mktemp("corpus")
    text_file = folder / "input.txt"
    text_file.write_text(make_text() + EXTRA_TEXT, encoding="utf-8")
    data = folder / "data"
    check_ok(run_script("data/prepare.py", f"--input={text_file}", "--name=tiny", f"--data_dir={data}"))
    assert (data / "tiny" / "train.bin").exists()
    return data


def train_args(data_dir, out_dir, *extra):
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}", *MODEL, *extra]


TRAINED_RUN = ["--n_layer=2", "--block_size=32", "--batch_size=8", "--pos_emb=rope", "--qk_norm=True",
               "--max_iters=30", "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--warmup_iters=5",
               "--learning_rate=3e-3"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_dir):
    """One 30-step run of a 2-layer rotary model, trained once per session as a user would start it:
    (out_dir, the finished process). Tests read it; one that would change it works on a copy."""
    out = tmp_path_factory.mktemp("trained") / "out"
    proc = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN)))
    return out, proc


@pytest.fixture
def run(trained_run, tmp_path):
    """A copy of the session's trained run, for a test that changes it (latest.pt at 30, latest.prev.pt at 20,
    best.pt)."""
    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    return out


# ---------------------------------------------------------------------------------------------- background runs

class Run:
    """A subprocess in the background (its own process group), its output in files (no pipe to fill up)."""

    def __init__(self, cmd, folder):
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = folder / "stdout.txt", folder / "stderr.txt"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, start_new_session=True)

    @property
    def stdout(self):
        return self.stdout_path.read_text(encoding="utf-8")

    @property
    def stderr(self):
        return self.stderr_path.read_text(encoding="utf-8")

    def wait(self, timeout=120):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(f"still running after {timeout} s\nstderr:\n{self.stderr}") from None

    def kill_group(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def check_ok(self):
        rc = self.wait()
        assert rc == 0, f"exit {rc}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return self


def train_cmd(data_dir, out_dir, *extra, script=REPO / "train.py"):
    return [sys.executable, str(script), *train_args(data_dir, out_dir, *extra)]


def logged(out_dir, kind="train", field="loss"):
    """{iteration: value}, the last value written for each: a resumed run appends to its own log."""
    path = Path(out_dir) / "metrics.jsonl"
    values = {}
    if path.exists():
        text = path.read_text(encoding="utf-8")
        for line in text[:text.rfind("\n") + 1].splitlines():  # whole lines only: the run may be writing
            record = json.loads(line)
            if record["kind"] == kind:
                values[record["iter"]] = record[field]
    return values


def wait_for_iteration(run, out_dir, at_least, timeout=90):
    """Poll metrics.jsonl until a train record at or past `at_least` appears; return the latest iteration."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = logged(out_dir)
        if done and max(done) >= at_least:
            return max(done)
        if run.proc.poll() is not None:
            raise AssertionError(f"run ended (exit {run.proc.returncode}) before iteration {at_least}\n"
                                 f"stderr:\n{run.stderr}")
        time.sleep(POLL_S)
    run.kill_group()
    raise AssertionError(f"no iteration {at_least} within {timeout} s")
