"""`bench.py tokenizers`: characters against byte-level BPEs trained on the same text, at equal training time,
in bits per character of held-out text (compare); and what training and encoding such a BPE costs (speed).

compare: the text is cut once, by characters, before any tokenizing: its first 1 - val_fraction is the train text,
on which data/prepare.py trains each BPE and which it tokenizes for each run; its last val_fraction is held out,
seen by no tokenizer and no model. Every run trains with one recipe (config/shakespeare_char.py) for the same
max_time at one fixed shape (min_tokens_per_param=0: no smaller model where the machine is slow), its block_size
in tokens covering about char_block characters. Each run's best.pt then reads the held-out text in consecutive
windows, as train.py's final score reads its val split, and bits per character = total nats / (ln 2 x
characters), a figure that does not depend on how the text was cut into tokens.

speed: a BPE of speed_vocab tokens trained on the JSON Lines corpus bench.py prepare makes, read as data/prepare.py
reads it, in a process of its own (its time, and the peak memory of its process tree); then that tokenizer's
encoding speed on one thread through tiktoken (as this project encodes) and through Hugging Face's own encoder,
beside tiktoken's GPT-2, taking turns on the same text.
"""

import json
import math
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.common import REPO, bench_input, device_name, own_work_dir, train_run
from benchmarks.prepare_cost import PrepareBenchConfig, corpus_file, measured
from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items, parse_config, require
from gptkit.data.bpe import SMALLEST, byte_chars, check_vocab_size
from gptkit.data.dataset import load_meta
from gptkit.data.preparing import PrepareConfig, corpus_texts
from gptkit.data.sources import source_files
from gptkit.data.tokenizer import TrainedBPE, make_tokenizer, ranks_of
from gptkit.interp.experiments import open_run
from gptkit.machine.runtime import check_device_name
from gptkit.run.metrics import read_metrics
from gptkit.training.evaluation import evaluate_split

PARTS = ("compare", "speed")
# train.py settings the comparison sets itself, the same for every run or chosen per tokenizer
SET_HERE = ("block_size", "max_time", "min_tokens_per_param", "dataset", "data_dir", "out_dir", "device")
SCORE_BATCH = 32  # windows scored at once: only the speed of the scoring depends on it
# the targets for a 4,096-token BPE trained on the 1 GB corpus on 2 cores: at most 2 minutes, at most
# 1 GB of resident memory; and the trained tokenizer encoding at least as fast per core as GPT-2's
MOST_SECONDS, MOST_RSS, LEAST_RATIO = 120.0, 1e9, 1.0
# the process that trains: gptkit.data.preparing and what it loads, as data/prepare.py's does, without the torch this
# benchmark's own process holds (its memory would count in the peak); it writes the tokenizer for the encoding
TRAIN_CHILD = """
import sys
from pathlib import Path
from gptkit.data.bpe import save_tokenizer
from gptkit.data.preparing import PrepareConfig, corpus_bpe
from gptkit.data.sources import kind_of, source_files
cfg = PrepareConfig(input=sys.argv[1], tokenizer="bpe", vocab_size=int(sys.argv[2]))
files = source_files(cfg.input)
save_tokenizer(Path(sys.argv[3]), corpus_bpe(cfg, files, any(kind_of(f) != "text" for f in files)))
"""


@dataclass
class TokenizersBenchConfig:
    parts: str = "compare,speed"  # compare (bits per character), speed (a BPE's training, encoding), comma-separated
    input: str = ""  # the text compared on, and the speed corpus is made of ('' = data/shakespeare_char/input.txt)
    vocab_sizes: str = "257,512,1024,4096"  # compare: BPE sizes beside characters (257: the bytes and <|endoftext|>)
    config: str = "config/shakespeare_char.py"  # compare: the recipe every run trains with
    max_time: float = 150.0  # compare: seconds each run trains (train.py's max_time: start-up, final score included)
    char_block: int = 128  # compare: characters of context; each BPE run's block_size covers about as many
    val_fraction: float = 0.1  # compare: the share of the text's characters, at its end, held out and scored
    device: str = "cpu"  # compare: the device every run trains on
    args: str = ""  # compare: more train.py options for every run, space-separated
    work_dir: str = "out-bench-tokenizers"  # the split text, the datasets, the runs and the speed part's tokenizer
    corpus: str = ""  # speed: the corpus to train on ('' = bench.py prepare's corpus of size_gb, made there if missing)
    size_gb: float = 1.0  # speed: the size of that corpus, in GB (10**9 bytes)
    speed_vocab: int = 4096  # speed: the tokens of the BPE trained on it, <|endoftext|> included
    encode_mb: float = 64.0  # speed: MB (10**6 bytes) of the corpus's text each encoder encodes in a turn
    rounds: int = 3  # speed: the turns each encoder takes; each keeps its fastest

    def __post_init__(self):
        if not self.part_list() or set(self.part_list()) - set(PARTS):
            raise ValueError(f"parts must name one or more of {', '.join(PARTS)}, comma-separated (got {self.parts!r})")
        self.vocab_list()
        require(self, ["max_time", "encode_mb"], lambda v: v > 0, "above 0")
        require(self, ["char_block"], lambda v: 8 <= v <= 65_536, "8 to 65,536")
        require(self, ["val_fraction"], lambda v: 0 < v < 1, "between 0 and 1")
        require(self, ["size_gb"], lambda v: 0 < v <= 10_000, "above 0, at most 10,000")
        require(self, ["speed_vocab"], lambda v: SMALLEST <= v <= 2 ** 32 - 1, f"{SMALLEST} to 2**32 - 1")
        require(self, ["rounds"], lambda v: 1 <= v <= 100, "1 to 100")
        check_device_name(self.device)
        for arg in self.args.split():
            if arg.startswith("--") and arg[2:].partition("=")[0] in SET_HERE:
                raise ValueError(f"args must not set {arg.partition('=')[0]}: the benchmark sets {', '.join(SET_HERE)} "
                                 "(use its own options: max_time, char_block, device)")

    def part_list(self):
        return comma_items(self.parts)

    def vocab_list(self):
        try:
            sizes = [int(v) for v in comma_items(self.vocab_sizes)]
        except ValueError:
            raise ValueError(f"vocab_sizes must be whole numbers, comma-separated (got {self.vocab_sizes!r})") from None
        for size in sizes:
            check_vocab_size(size)
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"vocab_sizes names a size twice (got {self.vocab_sizes!r})")
        return sizes


def main(argv):
    """The parts asked for, compare first."""
    cfg = parse_config(TokenizersBenchConfig, argv, prog="bench.py tokenizers")
    work = own_work_dir(cfg)
    if "compare" in cfg.part_list():
        compare(cfg, work)
    if "speed" in cfg.part_list():
        speed(cfg, work)


# ---------------------------------------------------------------------------------------------- compare


def compare(cfg, work):
    """Characters and each BPE: prepared from the train text, trained for max_time, scored on the held-out text."""
    train_file, val_text = split_text(Path(bench_input(cfg)).read_text(encoding="utf-8"), cfg.val_fraction, work)
    print(f"machine: {device_name(cfg.device)}, torch {torch.__version__}")
    rows = [compare_one(cfg, work, train_file, val_text, size) for size in [None, *cfg.vocab_list()]]
    print_compare_table(rows, cfg, len(val_text))


def split_text(text, val_fraction, work):
    """The text cut once, by characters: its first 1 - val_fraction written to work/train.txt, the text every
    tokenizer and model learns from, the rest held out (work/val.txt). Characters of the held-out text that the
    train text never has are left out of it, for every tokenizer alike: a char-level model has no token for them."""
    cut = round(len(text) * (1 - val_fraction))
    train, val = text[:cut], text[cut:]
    print(f"text: {len(text):,} characters, cut once: the train text is the first {len(train):,} "
          f"({work / 'train.txt'}), the held-out text the last {len(val):,} ({work / 'val.txt'})")
    missing = sorted(set(val) - set(train))
    if missing:
        val = "".join(c for c in val if c not in set(missing))
        print(f"note: {', '.join(map(repr, missing[:10]))}{' ...' if len(missing) > 10 else ''} in the held-out text "
              f"never occur in the train text: left out of it for every tokenizer ({len(val):,} characters remain)")
    work.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.txt", train), ("val.txt", val)):
        (work / name).write_text(part, encoding="utf-8", newline="")
    return work / "train.txt", val


def block_for(char_block, chars_per_token):
    """The block_size in tokens that covers about char_block characters: char_block / characters per token,
    rounded to a multiple of 8 (at least 8)."""
    return max(8, 8 * round(char_block / chars_per_token / 8))


def compare_one(cfg, work, train_file, val_text, vocab_size):
    """One tokenizer (None: characters): data/prepare.py on the train text, as a user runs it; train.py for
    max_time at the block that covers char_block characters; its best.pt scored on the held-out text."""
    name = f"bpe{vocab_size}" if vocab_size else "chars"
    how = ["--tokenizer=bpe", f"--vocab_size={vocab_size}"] if vocab_size else ["--tokenizer=char"]
    cmd = [sys.executable, "data/prepare.py", f"--input={train_file}", f"--name={name}",
           f"--data_dir={work / 'data'}", *how, "--start_over=True"]  # train.txt is written anew each run
    print(f"\n== {name}: {' '.join(map(str, cmd[1:]))}", flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode:
        raise UserError(f"preparing the {name} dataset failed (its error is above)")
    _, meta = load_meta(str(work / "data"), name)
    # the whole train text's characters per token, both of the dataset's splits
    train_per_token = (meta["train_chars"] + meta["val_chars"]) / (meta["train_tokens"] + meta["val_tokens"])
    block = block_for(cfg.char_block, train_per_token)
    out_dir = work / f"out-{name}"
    args = [cfg.config, *cfg.args.split(), f"--device={cfg.device}", f"--max_time={cfg.max_time:g}",
            "--min_tokens_per_param=0", f"--block_size={block}"]
    summary = train_run(name, args, work, out_dir, [], dataset=name)
    run = open_run(out_dir)
    nats, tokens, chars = val_score(run.model, run.tok, val_text)
    tokens_per_step = next(r for r in read_metrics(out_dir) if r["kind"] == "run")["tokens_per_iter"]
    return {"name": name, "vocab": meta["vocab_size"], "train_per_token": train_per_token,
            "val_per_token": chars / tokens, "block": block, "tokens_per_step": tokens_per_step,
            "params": run.model.num_params(), "steps": summary["iters"], "wall_s": summary["wall_s"],
            "bits_per_char": nats / (math.log(2) * chars), "nats_per_token": nats / tokens}


class TokenStream:
    """A text's token ids as gptkit.training.evaluation.evaluate_split reads a split: windows of block_size + 1
    tokens."""

    def __init__(self, ids, block_size):
        self.ids, self.block_size, self.length = torch.tensor(ids, dtype=torch.long), block_size, len(ids)

    def batch(self, offsets, device):
        rows = self.ids[offsets[:, None] + torch.arange(self.block_size + 1)]
        return rows[:, :-1].to(device), rows[:, 1:].to(device)


def val_score(model, tok, text):
    """(total nats, tokens scored, characters they spell) of text under the model, read as train.py's final score
    reads the val split (gptkit.training.evaluation.evaluate_split): in consecutive block_size windows, each token
    scored once
    from those before it in its window. The first token, which nothing comes before, is not scored, and its
    characters are not counted."""
    ids, block = tok.encode(text), model.config.block_size
    if len(ids) < block + 1:
        raise UserError(f"the held-out text is {len(ids):,} tokens, fewer than block_size + 1 = {block + 1}: give "
                        "a longer text (--input) or a larger --val_fraction")
    loss, scored = evaluate_split(model, TokenStream(ids, block), nullcontext(), SCORE_BATCH)
    model.eval()  # evaluate_split leaves it training
    return loss * scored, scored, len(text) - tok.chars_spelled(ids[:1])


def print_compare_table(rows, cfg, val_chars):
    extra = f", {cfg.args}" if cfg.args else ""
    print(f"\nheld-out text: the last {cfg.val_fraction:.0%} of the text, {val_chars:,} characters, which no "
          f"tokenizer and no model saw; every run: {cfg.config}, {cfg.max_time:g} s, one fixed shape "
          f"(--min_tokens_per_param=0){extra}")
    print(f"block = {cfg.char_block} characters / characters per token of the train text, to a multiple of 8: each "
          "run reads about the same stretch of text; the batch is the recipe's, so a step's tokens differ and its "
          "characters are about the same")
    print(f"\n{'tokenizer':<10}{'vocab':>7}{'chars/token':>13}{'block':>7}{'tokens/step':>12}{'parameters':>12}"
          f"{'steps':>7}{'val bits/char':>15}{'val nats/token':>16}")
    print(f"{'':<17}{'train   val':>13}")
    for r in rows:
        print(f"{r['name']:<10}{r['vocab']:>7,}{r['train_per_token']:>7.2f}{r['val_per_token']:>6.2f}{r['block']:>7}"
              f"{r['tokens_per_step']:>12,}{r['params']:>12,}{r['steps']:>7,}{r['bits_per_char']:>15.4f}"
              f"{r['nats_per_token']:>16.4f}")
    best = min(rows, key=lambda r: r["bits_per_char"])
    print(f"\nlowest bits per character: {best['name']} ({best['bits_per_char']:.4f}); bits per character = total "
          "nats / (ln 2 × characters scored) = nats per token / (ln 2 × characters per token)")
    slow = [f"{r['name']} {r['wall_s']:.0f} s" for r in rows if r["wall_s"] > 1.1 * cfg.max_time + 15]
    if slow:
        print(f"note: some runs took well over max_time ({', '.join(slow)}): start-up or the final score ran long")


# ---------------------------------------------------------------------------------------------- speed


def speed(cfg, work):
    """A BPE trained on the corpus in a process of its own, timed and measured; then encoding speeds."""
    if cfg.corpus:
        corpus = Path(cfg.corpus)
        if not corpus.is_file():
            raise UserError(f"no corpus at {corpus}: give a JSON Lines file, or leave --corpus out to use bench.py "
                            "prepare's")
    else:
        corpus = corpus_file(cfg, Path(PrepareBenchConfig.work_dir), cfg.size_gb)
    print(f"machine: {device_name('cpu')}")
    seconds, rss, tok = train_speed(cfg, corpus, work)
    size = corpus.stat().st_size
    print(f"\ntrained a {cfg.speed_vocab:,}-token BPE on {size / 1e9:.2f} GB in {seconds:.1f} s "
          f"({size / 1e6 / seconds:.1f} MB/s), peak resident memory {rss / 1e9:.2f} GB (its whole process tree)")
    print(f"  at most {MOST_SECONDS:g} s: {'PASS' if seconds <= MOST_SECONDS else 'FAIL'}; at most "
          f"{MOST_RSS / 1e9:g} GB: {'PASS' if rss <= MOST_RSS else 'FAIL'} (the targets for 4,096 tokens on 1 GB)")
    encode_speed(cfg, corpus, tok)


def train_speed(cfg, corpus, work):
    """(seconds, peak RSS bytes, the TrainedBPE) of training a speed_vocab BPE on the corpus in a process of its own,
    after the corpus is read through once (so it is timed from the page cache, as bench.py prepare times)."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "speed-tokenizer.json"
    cmd = [sys.executable, "-c", TRAIN_CHILD, str(corpus), str(cfg.speed_vocab), str(out)]
    print(f"\n== training a {cfg.speed_vocab:,}-token BPE on {corpus}, read as data/prepare.py reads it "
          "(its train split's documents), in a process of its own", flush=True)
    status, seconds, rss, _ = measured(cmd, [], warm=corpus)
    if status:
        raise UserError("training the BPE failed (its error is above)")
    return seconds, rss, TrainedBPE(json.loads(out.read_text(encoding="utf-8")), str(out))


def corpus_sample(corpus, megabytes):
    """The first documents' text of the corpus, in the pieces data/prepare.py reads it in, until megabytes of it."""
    cfg, texts, size = PrepareConfig(input=str(corpus)), [], 0
    with tqdm(disable=True) as bar:
        for text in corpus_texts(cfg, source_files(cfg.input), bar):
            texts.append(text)
            size += len(text.encode("utf-8"))
            if size >= megabytes * 1e6:
                break
    return texts, size


def hugging_face_encoder(tok):
    """The trained BPE as a Hugging Face tokenizer: its ranks and merges in the ByteLevel characters Hugging Face
    writes bytes as, cut into words by the same GPT-2 pattern (ByteLevel's regex, no space put in front)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = byte_chars()

    def shown(data):
        return "".join(chars[b] for b in data)

    _, ranks = ranks_of(tok.content["merges"])
    token_bytes = {rank: data for data, rank in ranks.items()}
    merges = [(shown(token_bytes[a]), shown(token_bytes[b])) for a, b, _ in tok.merges]
    hf = Tokenizer(models.BPE({shown(data): rank for data, rank in ranks.items()}, merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return hf


def timed_on_one_core(fn, cores, name):
    """fn, noting the cores it kept busy (process CPU seconds / wall seconds) under name."""
    def run():
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        cores[name] = max(cores.get(name, 0.0), (time.process_time() - cpu) / (time.perf_counter() - wall))
    return run


def encode_speed(cfg, corpus, tok):
    """MB/s on one thread of the trained BPE through tiktoken and through Hugging Face's encoder, and of GPT-2's
    through tiktoken, on the same text, taking turns; the trained tokenizer's ratio to GPT-2's."""
    from gptkit.machine.timing import fastest_in_turns

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # Hugging Face's batch encoder on one thread, as tiktoken's calls
    texts, size = corpus_sample(corpus, cfg.encode_mb)
    gpt2, hf = make_tokenizer("gpt2"), hugging_face_encoder(tok)
    trained, theirs, baseline = (f"trained {tok.vocab_size:,}, tiktoken (the project's encoder)",
                                 f"trained {tok.vocab_size:,}, Hugging Face tokenizers",
                                 f"GPT-2 ({gpt2.enc.name}), tiktoken")
    same = sum(list(a) == b.ids for a, b in zip((tok.encode(t) for t in texts[:50]), hf.encode_batch_fast(texts[:50])))
    cores = {}
    encoders = {trained: lambda: [tok.encode_array(t, np.uint32) for t in texts],
                theirs: lambda: hf.encode_batch_fast(texts),
                baseline: lambda: [gpt2.encode_array(t, np.uint32) for t in texts]}
    print(f"\n== encoding {size / 1e6:.1f} MB of the corpus's text ({len(texts):,} pieces) on one thread, each "
          f"encoder's fastest of {cfg.rounds} turn{'s' * (cfg.rounds > 1)}, taking turns", flush=True)
    seconds = fastest_in_turns({name: timed_on_one_core(fn, cores, name) for name, fn in encoders.items()}, cfg.rounds)
    rates = {name: size / 1e6 / s for name, s in seconds.items()}
    for name, mb_s in rates.items():
        print(f"  {name:<48}{mb_s:>8.2f} MB/s  (cores busy: {cores[name]:.2f})")
    ratio = rates[trained] / rates[baseline]
    print(f"trained against GPT-2, both through tiktoken: {ratio:.2f}x GPT-2's MB/s per core: "
          f"{'PASS' if ratio >= LEAST_RATIO else 'FAIL'} (at least {LEAST_RATIO:g})")
    theirs_ratio = rates[theirs] / rates[trained]
    print(f"Hugging Face's encoder gave tiktoken's tokens for {same} of the first {min(50, len(texts))} pieces; "
          f"its speed is {theirs_ratio:.2f}x tiktoken's for the same ranks" +
          (": FASTER than tiktoken, which this project encodes with" if theirs_ratio > 1 else
           " (this project encodes with tiktoken)"))
