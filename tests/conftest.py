"""Shared fixtures: the repo on sys.path, wandb kept offline, one tiny prepared corpus and one tiny trained run
per session, script runners, train.py with faults injected, and the check every user-facing failure must pass
(one `error:` line).

Tests marked `slow` are left out of the quick loop, `python -m pytest -q -n 2 -m "not slow" tests`: those that start
train.py, data/prepare.py, lab.py, explore.py or torchrun, or train for more than a second or two. Every test that
uses the session's prepared corpus or trained run (the data_dir, trained_run and run fixtures) is marked slow here,
as building them starts data/prepare.py and train.py."""

import dataclasses
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
# this machine's wisdom (gptkit/machine/wisdom.py) in a folder of the session's own, inherited by every script it
# starts:
# measured once per shape for the whole session, and never the user's cache
if "GPTKIT_WISDOM_DIR" not in os.environ:
    import tempfile
    os.environ["GPTKIT_WISDOM_DIR"] = tempfile.mkdtemp(prefix="gptkit-wisdom-")

# two test workers share two cores, so every measurement would be taken beside a busy one and kept by no run: the
# tests take them as idle (tests/test_idle.py checks the check itself)
os.environ["GPTKIT_ASSUME_IDLE"] = "1"

# the fixtures that build the session's corpus and trained run through data/prepare.py and train.py
SLOW_FIXTURES = {"data_dir", "trained_run", "run", "bpe_trained_run", "chat_data", "chat_run"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts a script (train.py, data/prepare.py, lab.py, explore.py, "
                                       "torchrun) or trains for more than a second or two; the quick loop, "
                                       "`python -m pytest -q -n 2 -m \"not slow\" tests`, leaves these out")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test that uses the session's corpus or trained run is slow, whether it says so or not."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


SHARED_TIKTOKEN = REPO.parent / "shared" / "data" / "tiktoken"
R50K_BASE = "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"  # tiktoken's cache file name for r50k_base (gpt2's ranks)
POLL_S = 0.02  # how often a test looks at a background run: often enough, without taking a core from it

_SUBJECTS = ["the old king", "a quiet river", "my brother", "the café owner", "Élodie", "the fox",
             "our neighbour", "the naïve poet", "a tired soldier", "the weaver"]
_VERBS = ["watched", "remembered", "carried", "followed", "sang about", "forgot", "painted", "found"]
_OBJECTS = ["the northern hills", "a broken lantern", "the summer rain", "her résumé", "the silver coin",
            "an empty boat", "the long road home", "seven crows", "the morning bell"]
_TAILS = ["", " at dawn", " — and wept", " without a word", " (twice)", ", slowly", "; nobody knew why",
          " before the storm", "!", "?"]
EXTRA_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"

# sentences in five scripts: a byte-level BPE of a few hundred tokens trained on them keeps some characters (the
# Chinese, the emoji: 3 and 4 bytes of UTF-8) cut between tokens
MIXED_LINES = ["The fox watched the summer rain.", "Ο γέρος βασιλιάς είδε τη βροχή.", "Лиса нашла серебряную монету.",
               "狐狸看着北方的山丘。", "The crow found a coin 🪙 and sang 🎶.", "日本語も少し書きます。",
               "🙂 👩‍👩‍👧 🇬🇷🇺🇦 naïve café — 42 ½"]
BPE_VOCAB = 300

# the shape of every tiny model trained through the CLI
MODEL = ["--device=cpu", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
         "--batch_size=4"]


def copied_again(path, data):
    """path written anew with data, a second later than it was: a file copied over it (cp keeps no time)."""
    later = path.stat().st_mtime_ns + 10 ** 9
    path.write_bytes(data)
    os.utime(path, ns=(later, later))


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


def partial_tokens(tok, ids):
    """The ids among ids whose token holds part of a character: its bytes alone are not UTF-8 text."""
    def whole(token):
        try:
            tok.enc.decode_single_token_bytes(token).decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    return [t for t in ids if not whole(t)]


# ---------------------------------------------------------------------------------------------- tiny models

TINY = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
MODERN = dict(pos_emb="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2", tie_weights=False,
              logit_softcap=15.0, zero_init_proj=False)


def mixed_script_text(n_bytes=6000, seed=0):
    """Text mixing English with Greek, Cyrillic, Chinese, Japanese and emoji (a family joined by zero-width
    joiners, flags): MIXED_LINES and make_text's lines, so that a byte-level BPE learns tokens that hold part of
    a character."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_bytes:
        part = rng.choice(MIXED_LINES) if rng.random() < 0.6 else make_text(200, seed=rng.randrange(1000))
        parts.append(part)
        size += len(part.encode("utf-8")) + 1
    return "\n".join(parts)


def tiny_model(seed=0, sharpen=1.0, attention_weights=0.0, config=None, **overrides):
    """A tiny GPT (TINY with overrides, or the GPTConfig `config` with overrides) in eval mode. sharpen > 1 scales
    the head so that sampling is far from uniform; attention_weights > 0 redraws attention's weights with that
    spread, so that its weights are far from uniform and every term matters."""
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    settings = dataclasses.asdict(config) if config is not None else TINY
    model = GPT(GPTConfig(**dict(settings, **overrides))).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
        for name, p in model.named_parameters():
            if attention_weights and ".attn." in name:
                p.normal_(0, attention_weights)
    return model


# a tiny run's settings, flat as its command line gives them (the model's among them)
TINY_RUN = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, bias=False, dropout=0.0)


def train_config(**values):
    """A TrainConfig from flat keys, as the command line gives them: TINY_RUN's, and values over them."""
    from gptkit.base.settings import build
    from gptkit.training.train_config import TrainConfig

    return build(TrainConfig, dict(TINY_RUN, **values))


def sum_tolerance(reference, terms):
    """assert_close's rtol and atol for a result made of sums of `terms` products in reference's dtype: rounding
    grows with the square root of the terms, and a CPU's vector width changes the order of the sums (an AVX-512
    CPU's float32 attention differs from the same sum in a naive loop by up to about 10 eps per sqrt-term of the
    largest value). Far below what a wrong mask or scale moves."""
    rtol = 32 * torch.finfo(reference.dtype).eps * math.sqrt(terms)
    return dict(rtol=rtol, atol=rtol * max(1.0, reference.abs().max().item()))


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
    """GPT-2's BPE offline, from a cache of r50k_base (the same ranks as gpt2): the user's TIKTOKEN_CACHE_DIR where
    it holds them, else the shared one beside this project; the environment that points tiktoken there, also set
    for this test and the scripts it runs."""
    folders = [Path(os.environ["TIKTOKEN_CACHE_DIR"])] if os.environ.get("TIKTOKEN_CACHE_DIR") else []
    found = next((f for f in [*folders, SHARED_TIKTOKEN] if (f / R50K_BASE).is_file()), None)
    if found is None:
        pytest.skip(f"no cached r50k_base encoding in {' or '.join(map(str, [*folders, SHARED_TIKTOKEN]))} "
                    "(and no network to fetch it)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(found))
    return {"TIKTOKEN_CACHE_DIR": str(found)}


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


def run_here(script, *args):
    """`python script args...` as run_script runs it, but in this process, without the second or two of a new
    interpreter importing torch: the script's `if __name__ == "__main__"` block under its sys.argv, in the repo
    root, its exit status, stdout and stderr (warnings shown there each time, as a new process shows them), and a
    traceback for anything uncaught. For every case but one of a table whose one case run_script runs as a user
    would."""
    import contextlib
    import io
    import runpy
    import traceback
    import warnings

    path, out, err = REPO / script, io.StringIO(), io.StringIO()
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = [str(path), *map(str, args)]
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            try:
                runpy.run_path(str(path), run_name="__main__")
                code = 0
            except SystemExit as e:  # as the interpreter exits: None is 0, a message is printed and is 1
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())


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


@pytest.fixture
def outside(tmp_path):
    """A file of the user's, outside any run folder, that a link in one points at."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("precious\n")
    return target


@pytest.fixture(scope="session", autouse=True)
def every_record():
    """Runs trained in this process record at every step that calls for a record: how many a run affords
    (gptkit/training/records.py's RECORD_SHARE of its time) hangs on the machine's load, which no test may.
    tests/test_timeline.py puts the share back where it tests the pacing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gptkit.training.records.RECORD_SHARE", math.inf)
        yield


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


@pytest.fixture(scope="session")
def bpe_data(tmp_path_factory):
    """mixed_script_text() prepared once per session with a byte-level BPE of BPE_VOCAB tokens trained on it (dataset
    'tiny_bpe', by data/prepare.py's own prepare(), in this process: a fraction of a second): (data_dir, its
    metadata as load_meta reads it, the tokenizer in it). Tests read it and never change it."""
    from gptkit.data.dataset import load_meta
    from gptkit.data.preparing import PrepareConfig, prepare
    from gptkit.data.tokenizer import tokenizer_from_meta

    folder = tmp_path_factory.mktemp("bpe_corpus")
    (folder / "input.txt").write_text(mixed_script_text(), encoding="utf-8")
    data = folder / "data"
    prepare(PrepareConfig(input=str(folder / "input.txt"), name="tiny_bpe", tokenizer="bpe", vocab_size=BPE_VOCAB,
                          data_dir=str(data), workers=1))
    _, meta = load_meta(str(data), "tiny_bpe")
    return data, meta, tokenizer_from_meta(meta)


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


@pytest.fixture(scope="session")
def bpe_trained_run(tmp_path_factory, bpe_data):
    """A 10-step run of a tiny model on bpe_data's dataset, in this process; tests that change it copy it."""
    import train

    out = tmp_path_factory.mktemp("bpe_trained") / "out"
    train.main([f"--data_dir={bpe_data[0]}", "--dataset=tiny_bpe", f"--out_dir={out}", *MODEL, "--max_iters=10",
                "--eval_interval=5", "--eval_iters=1", "--log_interval=5"])
    return out


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


def torchrun(script, *args):
    """The command line of `script args...` in two processes under torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]


# ---------------------------------------------------------------------------------------------- faults

FAULTY_TRAIN = '''
import io, os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
sys.argv[0] = os.path.join({repo!r}, "train.py")
import train
from gptkit.base import files
from gptkit.base.errors import run_main
from gptkit.training import records

records.RECORD_SHARE = float("inf")  # every record, as in the tests' own process (conftest's every_record)
FAULTS = {faults!r}
saves = 0


class Faulty(io.FileIO):
    """A checkpoint file past whose first 4 KiB the process dies (SIGKILL), the disk fills, or Ctrl-C is pressed
    twice."""
    written = 0

    def write(self, data):
        if self.written + len(data) > 4096:
            if "kill" in FAULTS:
                os.kill(os.getpid(), signal.SIGKILL)
            elif "ctrl_c" in FAULTS:
                signal.raise_signal(signal.SIGINT)  # the first: stop after this step, saved
                signal.raise_signal(signal.SIGINT)  # the second: stop now
            else:
                raise OSError(28, os.strerror(28))  # ENOSPC
        self.written += len(data)
        return super().write(data)


def faulty_open(path, mode="r", *args, **kwargs):
    global saves
    name, nth = FAULTS.get("kill") or FAULTS.get("ctrl_c") or FAULTS["enospc"]  # the file whose nth write fails
    if Path(path).name == name + ".tmp":
        saves += 1
        if saves == nth:
            return Faulty(path, "wb")
    return open(path, mode, *args, **kwargs)


if "kill" in FAULTS or "enospc" in FAULTS or "ctrl_c" in FAULTS:
    files.open = faulty_open  # every whole write opens its file there (checkpoints among them)
if "nan" in FAULTS:  # the training loss of forward pass NTH becomes NaN
    import model
    real_forward, real_train = model.GPT.forward, train.train
    calls, looping = 0, False

    def counted_train(*args, **kwargs):  # the loop's forward passes only: not start-up's measuring
        global looping
        looping = True
        return real_train(*args, **kwargs)

    def forward(self, *args, **kwargs):
        global calls
        logits, loss = real_forward(self, *args, **kwargs)
        if self.training and loss is not None and looping:
            calls += 1
            if calls == FAULTS["nan"]:
                loss = loss * float("nan")
        return logits, loss

    model.GPT.forward, train.train = forward, counted_train
if "signal" in FAULTS or "rank1" in FAULTS:
    import torch.distributed as dist
    from gptkit.base.errors import UserError
    real_step = train.step_optimizers
    steps = 0  # optimizer steps taken: the runs these faults go into start from scratch

    def step_optimizers(*args):
        global steps
        rank = dist.get_rank() if dist.is_initialized() else 0
        if "rank1" in FAULTS and rank == 1 and steps == FAULTS["rank1"]:
            raise UserError("rank 1 failed on purpose")  # on its own, after DDP is up
        real_step(*args)
        steps += 1
        if "signal" in FAULTS:  # arrives during step N: the run must stop right after it
            name, iteration, ranks = FAULTS["signal"]
            if steps == iteration and rank in ranks:
                os.kill(os.getpid(), getattr(signal, name))

    train.step_optimizers = step_optimizers
if "eval_signal" in FAULTS:  # arrives while the first evaluation or the final score runs
    name, when = FAULTS["eval_signal"]
    target = {{"first": "evaluate", "final": "evaluate_split"}}[when]
    real_eval = getattr(train, target)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, name))
        return real_eval(*args, **kwargs)

    setattr(train, target, interrupted)
run_main(train.main)
'''


def faulty_train(folder, **faults):
    """A test-only script that runs train.py with faults injected (the product code has no hooks for them), written
    into folder. kill/enospc/ctrl_c=(the file name, which save of it): SIGKILL, a full disk, or Ctrl-C pressed twice
    once 4 KiB of that save are written; nan=which forward pass's loss; signal=(name, iteration, ranks) during that
    optimizer step; rank1=the step at which rank 1 alone fails; eval_signal=(name, 'first' evaluation or 'final'
    score)."""
    path = Path(folder) / f"train_{'_'.join(faults)}.py"
    path.write_text(FAULTY_TRAIN.format(repo=str(REPO), faults=faults), encoding="utf-8")
    return path


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


CHAT_SFT = ["--dataset=tasks", "--max_iters=6", "--eval_interval=3", "--eval_iters=1", "--log_interval=3",
            "--batch_size=8", "--block_size=32", "--learning_rate=3e-3", "--device=cpu", "--dtype=float32",
            "--timeline=False"]


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory, data_dir):
    """A small tasks dataset (addition and reverse, 20 held-out problems each) with the session corpus's text
    mixed in, prepared once per session: its data_dir."""
    from gptkit.data.preparing import PrepareConfig, prepare

    folder = tmp_path_factory.mktemp("chat_data")
    text = folder / "text.txt"
    text.write_text(make_text() + EXTRA_TEXT, encoding="utf-8")
    prepare(PrepareConfig(synthetic="tasks", tasks="addition,reverse", problems=400, heldout=20, mix=str(text),
                          data_dir=str(folder / "data"), workers=1))
    return folder / "data"


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory, trained_run, chat_data):
    """The session's trained run fine-tuned for 6 steps on chat_data (train.py in this process): its out_dir."""
    import train

    out = tmp_path_factory.mktemp("chat") / "out-chat"
    train.main([f"--init_from={trained_run[0]}", f"--out_dir={out}", f"--data_dir={chat_data}", *CHAT_SFT])
    return out
