"""`bench.py prepare`: a JSON Lines corpus of a chosen size made from real text, prepared by data/prepare.py and
then read by train.py, each with the peak resident memory of its whole process tree (the tokenizing workers
included) and its disk use, and beside it nanoGPT's OpenWebText prepare script pointed at the same file."""

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, bench_input, device_name, own_work_dir
from gptkit.base.errors import UserError
from gptkit.base.settings import parse_config, require
from gptkit.data.bpe import check_vocab_size

# what running nanoGPT's data/openwebtext/prepare.py on a local file takes, each edit made exactly once: its
# load_dataset pointed at the JSON Lines file with its cache in the benchmark's folder, num_proc set, the token
# files written to a folder of the benchmark's. The rest runs as nanoGPT wrote it.
NANOGPT_EDITS = [
    ("num_proc = 8\n", "num_proc = int(sys.argv[4])\n"),
    ('load_dataset("openwebtext", num_proc=num_proc_load_dataset)',
     'load_dataset("json", data_files=sys.argv[1], num_proc=num_proc_load_dataset, cache_dir=sys.argv[2])'),
    ("os.path.join(os.path.dirname(__file__), f'{split}.bin')", "os.path.join(sys.argv[3], f'{split}.bin')"),
    # the same ranks under the name whose files an offline tiktoken cache may hold instead (see
    # gptkit/data/tokenizer.py)
    ('tiktoken.get_encoding("gpt2")', 'tiktoken.get_encoding(sys.argv[5])'),
    # a val split of fewer rows than its 1,024 write batches ends in an IndexError (0.0005 of a corpus under
    # 2M documents); later copies of the script stop there, as this does
    ("            batch = dset.shard(", "            if batch_idx >= len(dset): break\n            batch = dset.shard("),
]


@dataclass
class PrepareBenchConfig:
    input: str = ""  # the corpus's text ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    size_gb: float = 1.0  # size of the JSON Lines corpus to make and prepare, in GB (10**9 bytes)
    tokenizer: str = "gpt2"  # the tokenizer both prepares use ('bpe': ours trains one, nanoGPT's cannot)
    vocab_size: int = 0  # with --tokenizer=bpe: the size of the BPE ours trains (data/prepare.py's --vocab_size)
    workers: int = 0  # tokenizing processes, ours and nanoGPT's num_proc (0 = one per core)
    val_fraction: float = 0.0005  # our val split's share of documents (nanoGPT's script takes 0.0005)
    huge_docs: int = 3  # single-line documents of huge_mb each, among the small ones
    huge_mb: float = 8.0  # their size in MB (2**20 bytes): e.g. --huge_docs=1 --huge_mb=200, one book-sized record
    work_dir: str = "out-bench-prepare"  # the corpus, the datasets and nanoGPT's cache go here
    nanogpt_dir: str = ""  # a checkout of nanoGPT, whose OpenWebText prepare runs beside ours ('' = ours only)
    train_iters: int = 20  # train.py iterations reading the prepared shards, memory measured (0 = none)
    keep: bool = False  # keep what was written (removed by default: it is as big as the corpus, twice over)

    def __post_init__(self):
        require(self, ["size_gb"], lambda v: 0 < v <= 10_000, "above 0, at most 10,000")
        require(self, ["workers"], lambda v: 0 <= v <= 512, "0 (one per core) to 512")
        require(self, ["train_iters"], lambda v: v >= 0, "0 or more")
        require(self, ["val_fraction"], lambda v: 0 < v < 1, "between 0 and 1")
        require(self, ["huge_docs", "huge_mb"], lambda v: 0 <= v <= 100_000, "0 to 100,000")
        if self.tokenizer == "bpe":
            check_vocab_size(self.vocab_size)
            if self.nanogpt_dir:
                raise ValueError("nanoGPT's script cannot train a BPE: leave out --nanogpt_dir with --tokenizer=bpe")
        elif self.vocab_size:
            raise ValueError("vocab_size is the size of a trained BPE: give it with --tokenizer=bpe")


def main(argv):
    """A JSON Lines corpus prepared by data/prepare.py (and read by train.py), beside nanoGPT's script."""
    from gptkit.data.preparing import cores

    cfg = parse_config(PrepareBenchConfig, argv, prog="bench.py prepare")
    workers = cfg.workers or cores()
    if cfg.nanogpt_dir:
        nanogpt_script(cfg.nanogpt_dir)  # a wrong checkout fails now, not after our run
    work = own_work_dir(cfg)
    corpus = corpus_file(cfg, work, cfg.size_gb, cfg.huge_docs, cfg.huge_mb)
    print(f"machine: {device_name('cpu')}")
    results = {"ours": run_ours(corpus, work / "data", cfg.tokenizer, cfg.val_fraction, workers, cfg.vocab_size)}
    if results["ours"][0]:
        raise UserError("data/prepare.py failed on the benchmark's corpus (its error is above)")
    if cfg.train_iters:
        results["training reads ours"] = run_training_read(work / "data", work / "train", cfg.train_iters)
    if cfg.nanogpt_dir:
        results["nanoGPT"] = run_nanogpt(corpus, work, cfg.nanogpt_dir, workers)
    print_prepare_table(results, corpus.stat().st_size)
    if not cfg.keep:
        for name in ("data", "train", "nanogpt", "hf_cache"):
            shutil.rmtree(work / name, ignore_errors=True)


def print_prepare_table(results, corpus_bytes):
    """Each command's exit status, seconds, speed, peak memory and peak disk; then ours against nanoGPT's."""
    gb = 1e9
    print(f"\ncorpus: {corpus_bytes / gb:.2f} GB of JSON Lines")
    print(f"{'':<22}{'exit':>6}{'seconds':>10}{'MB/s':>9}{'peak RSS':>11}{'peak disk':>11}")
    for name, (status, seconds, rss, disk) in results.items():
        speed = f"{corpus_bytes / 1e6 / seconds:.1f}" if not name.startswith("training") else "-"
        print(f"{name:<22}{status:>6}{seconds:>10.1f}{speed:>9}{rss / gb:>9.2f}GB{disk / gb:>9.2f}GB")
    if "nanoGPT" in results and results["nanoGPT"][0] == 0:
        ours, theirs = results["ours"], results["nanoGPT"]
        print(f"ours against nanoGPT's: {theirs[1] / ours[1]:.2f}x the speed, {ours[2] / theirs[2]:.2f} of its peak "
              f"memory, {ours[3] / theirs[3]:.2f} of its peak disk use")


def nanogpt_script(nanogpt_dir):
    """nanoGPT's OpenWebText prepare script from a checkout of nanoGPT, edited to read a local file."""
    path = Path(nanogpt_dir) / "data" / "openwebtext" / "prepare.py"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        raise UserError(f"no nanoGPT OpenWebText prepare script at {path}: pass --nanogpt_dir=PATH to a "
                        "checkout of github.com/karpathy/nanoGPT, or leave it out to time ours alone") from None
    for old, new in NANOGPT_EDITS:
        if text.count(old) != 1:
            raise UserError(f"{path} is not the script this benchmark knows how to point at a local file "
                            f"(it lacks {old.strip()!r})")
        text = text.replace(old, new)
    return "import sys\n" + text


def corpus_file(cfg, work, size_gb, huge_docs=3, huge_mb=8.0):
    """The benchmark corpus of size_gb in work, made from cfg's text (bench_input) unless a file of that size is
    there already; named for its size (and its huge documents, where not the default's), so that another
    benchmark asking for the same corpus finds it."""
    work.mkdir(parents=True, exist_ok=True)
    huge = "" if (huge_docs, huge_mb) == (3, 8) else f"-{huge_docs}x{huge_mb:g}MB"
    corpus = work / f"corpus-{size_gb:g}GB{huge}.jsonl"
    huge_bytes = int(huge_mb * (1 << 20))
    if not corpus.exists() or abs(corpus.stat().st_size - size_gb * 1e9) > 1e7 + huge_bytes:
        print(f"making {corpus} ({size_gb:g} GB of JSON Lines)", flush=True)
        make_corpus(Path(bench_input(cfg)).read_text(encoding="utf-8"), corpus, int(size_gb * 1e9), huge_docs,
                    huge_bytes)
    return corpus


def make_corpus(text, path, size_bytes, huge_docs=3, huge_bytes=8 << 20, seed=0):
    """A JSON Lines file of about size_bytes: documents cut from `text` at random places, their lengths spread
    from a line to a chapter (log-uniform, 100 B to 100 KB), and huge_docs single-line documents of
    huge_bytes each at random places among them."""
    rng = random.Random(seed)
    huge_at = sorted(rng.uniform(0, size_bytes) for _ in range(huge_docs))
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            if huge_at and written >= huge_at[0]:
                huge_at.pop(0)
                doc = (text * (huge_bytes // len(text) + 1))[:huge_bytes].replace("\n", " ")
            else:
                n = int(10 ** rng.uniform(2, 5))
                start = rng.randrange(len(text) - n)
                doc = text[start:start + n]
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
    return written


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def tree_rss(pid):
    """Resident memory of a process and all its descendants, in bytes (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status", encoding="ascii") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:  # it ended meanwhile
            pass
    return total


def read_through(path):
    """Read a file once, so that the command timed next finds it in the page cache as the one before did (the
    first would otherwise pay the disk alone)."""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def measured(cmd, disk_folders, env=None, warm=None):
    """Run cmd to its end, sampling its process tree's resident memory and the disk use of disk_folders, after
    reading `warm` through: (exit status, seconds, peak RSS bytes, peak disk bytes)."""
    if not os.path.isdir("/proc"):
        raise UserError("bench.py prepare reads resident memory from /proc: it runs on Linux")
    if warm:
        read_through(warm)
    peaks = {"rss": 0, "disk": 0}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **(env or {})))

    def sample():
        ticks = 0
        while proc.poll() is None:
            peaks["rss"] = max(peaks["rss"], tree_rss(proc.pid))
            if ticks % 10 == 0:
                peaks["disk"] = max(peaks["disk"], sum(folder_bytes(f) for f in disk_folders))
            ticks += 1
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    status = proc.wait()
    seconds = time.perf_counter() - start
    watcher.join()
    peaks["disk"] = max(peaks["disk"], sum(folder_bytes(f) for f in disk_folders))
    return status, seconds, peaks["rss"], peaks["disk"]


def run_ours(corpus, data_dir, tokenizer, val_fraction, workers, vocab_size=0):
    cmd = [sys.executable, "data/prepare.py", f"--input={corpus}", "--name=bench", f"--data_dir={data_dir}",
           f"--tokenizer={tokenizer}", f"--val_fraction={val_fraction}", f"--workers={workers}",
           *([f"--vocab_size={vocab_size}"] if vocab_size else []),
           "--start_over=True"]  # the benchmark's own folder: a dataset left by its last run, of other settings, goes
    print(f"\n== ours: {' '.join(cmd[1:])}", flush=True)
    return measured(cmd, [data_dir], warm=corpus)


def run_training_read(data_dir, out_dir, iters):
    """train.py on the prepared shards for `iters` iterations of a tiny model: what it costs to open (every shard
    checked) and read them, more than to train."""
    cmd = [sys.executable, "train.py", f"--data_dir={data_dir}", "--dataset=bench", f"--out_dir={out_dir}",
           "--start_over=True", f"--max_iters={iters}", "--n_layer=1", "--n_head=2", "--n_embd=32",
           "--block_size=128", "--batch_size=4", f"--eval_interval={iters}", "--eval_iters=1", "--max_time=0",
           "--final_eval_tokens=4096", "--compile=False", "--threads=1"]
    print(f"\n== training reads it: {' '.join(cmd[1:])}", flush=True)
    return measured(cmd, [])


def loadable_gpt2():
    """'gpt2', or 'r50k_base' (the same encoding) where only its files are at hand offline."""
    from gptkit.data.tokenizer import make_tokenizer

    return make_tokenizer("gpt2").enc.name


def run_nanogpt(corpus, work, nanogpt_dir, workers):
    script, out, cache = work / "nanogpt_prepare.py", work / "nanogpt", work / "hf_cache"
    script.write_text(nanogpt_script(nanogpt_dir), encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script), str(corpus), str(cache), str(out), str(workers), loadable_gpt2()]
    print(f"\n== nanoGPT's data/openwebtext/prepare.py on the same file (num_proc={workers})", flush=True)
    return measured(cmd, [out, cache], env={"HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1"},
                    warm=corpus)
