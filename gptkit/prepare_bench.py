"""
What `bench.py prepare` measures: a JSON Lines corpus of a chosen size made from real text, prepared by
data/prepare.py and then read by train.py, each with the peak resident memory of its whole process tree (the
tokenizing workers included) and its disk use, and beside it nanoGPT's OpenWebText prepare script pointed at
the same file.
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from gptkit.errors import UserError

REPO = Path(__file__).resolve().parent.parent
HUGE_DOCS = 3  # single-line documents of HUGE_BYTES each, among the small ones
HUGE_BYTES = 8 << 20

# what running nanoGPT's data/openwebtext/prepare.py on a local file takes, each edit made exactly once: its
# load_dataset pointed at the JSON Lines file with its cache in the benchmark's folder, num_proc set, the token
# files written to a folder of the benchmark's. The rest runs as nanoGPT wrote it.
NANOGPT_EDITS = [
    ("num_proc = 8\n", "num_proc = int(sys.argv[4])\n"),
    ('load_dataset("openwebtext", num_proc=num_proc_load_dataset)',
     'load_dataset("json", data_files=sys.argv[1], num_proc=num_proc_load_dataset, cache_dir=sys.argv[2])'),
    ("os.path.join(os.path.dirname(__file__), f'{split}.bin')", "os.path.join(sys.argv[3], f'{split}.bin')"),
    # the same ranks under the name whose files an offline tiktoken cache may hold instead (see gptkit/tokenizer.py)
    ('tiktoken.get_encoding("gpt2")', 'tiktoken.get_encoding(sys.argv[5])'),
    # a val split of fewer rows than its 1,024 write batches ends in an IndexError (0.0005 of a corpus under
    # 2M documents); later copies of the script stop there, as this does
    ("            batch = dset.shard(", "            if batch_idx >= len(dset): break\n            batch = dset.shard("),
]


def nanogpt_script(nanogpt_dir):
    """nanoGPT's OpenWebText prepare script from a checkout of nanoGPT, edited to read a local file."""
    path = Path(nanogpt_dir) / "data" / "openwebtext" / "prepare.py"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        raise UserError(f"no nanoGPT OpenWebText prepare script at {path}: pass --nanogpt_dir=PATH to a "
                        "checkout of github.com/karpathy/nanoGPT, or --baseline=False") from None
    for old, new in NANOGPT_EDITS:
        if text.count(old) != 1:
            raise UserError(f"{path} is not the script this benchmark knows how to point at a local file "
                            f"(it lacks {old.strip()!r})")
        text = text.replace(old, new)
    return "import sys\n" + text


def make_corpus(text, path, size_bytes, seed=0):
    """A JSON Lines file of about size_bytes: documents cut from `text` at random places, their lengths spread
    from a line to a chapter (log-uniform, 100 B to 100 KB), and HUGE_DOCS single-line documents of
    HUGE_BYTES each at random places among them."""
    rng = random.Random(seed)
    huge_at = sorted(rng.uniform(0, size_bytes) for _ in range(HUGE_DOCS))
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            if huge_at and written >= huge_at[0]:
                huge_at.pop(0)
                doc = (text * (HUGE_BYTES // len(text) + 1))[:HUGE_BYTES].replace("\n", " ")
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


def run_ours(corpus, data_dir, tokenizer, val_fraction, workers):
    cmd = [sys.executable, "data/prepare.py", f"--input={corpus}", "--name=bench", f"--data_dir={data_dir}",
           f"--tokenizer={tokenizer}", f"--val_fraction={val_fraction}", f"--workers={workers}"]
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
    from gptkit.tokenizer import make_tokenizer

    return make_tokenizer("gpt2").enc.name


def run_nanogpt(corpus, work, nanogpt_dir, workers):
    script, out, cache = work / "nanogpt_prepare.py", work / "nanogpt", work / "hf_cache"
    script.write_text(nanogpt_script(nanogpt_dir), encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script), str(corpus), str(cache), str(out), str(workers), loadable_gpt2()]
    print(f"\n== nanoGPT's data/openwebtext/prepare.py on the same file (num_proc={workers})", flush=True)
    return measured(cmd, [out, cache], env={"HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1"},
                    warm=corpus)
