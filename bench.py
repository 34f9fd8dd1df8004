"""
Benchmarks, one subcommand each; every subcommand takes its own --key=value options (--help lists them).

    python bench.py sample                         # KV cache vs full recompute on a random baby GPT
    python bench.py sample --out_dir=out           # the same on a trained checkpoint
    python bench.py sample --dtype=bfloat16 --threads=1
    python bench.py train                          # nanoGPT's CPU recipe vs config/shakespeare_char.py, side by side
    python bench.py throughput                     # training tokens/s on the baby GPT: fp32 AdamW vs the default's settings
    python bench.py dropout                        # the share of the default's steps that dropout 0.1 costs
    python bench.py explore --out_dir=out          # the explorer: first token, streaming, page load, analysis
    python bench.py busy                           # training tokens/s idle and beside one busy process
    python bench.py presets                        # each preset trained with 3 seeds: mean val loss, spread, target
    python bench.py prepare --nanogpt_dir=../nanoGPT  # a 1 GB JSON Lines corpus: ours vs nanoGPT's OpenWebText prepare
    python bench.py prepare --size_gb=10           # peak memory preparing, then training on, 10 GB
"""

import copy
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from gptkit.config import check_seed, parse_config, pick_subcommand, require
from gptkit.decoding import generate_stream, lay_out_for_decoding
from gptkit.errors import UserError, run_main
from gptkit.flops import flops_per_token, peak_flops
from gptkit.metrics import read_metrics
from gptkit.timing import (attention_path_for, matmul_peak, pick_decode_dtype, pick_decode_threads,
                           pick_training_dtype, synchronize)
from gptkit.runtime import (DTYPES, allow_tf32, autocast, check_device_name, compile_blocks, keep_freed_memory,
                            pick_device)
from gptkit.train_config import TrainConfig
from model import GPT, GPTConfig


def comma_items(text):
    """The items of a comma-separated option, stripped, empty ones left out."""
    return [item.strip() for item in text.split(",") if item.strip()]


@dataclass
class SampleBenchConfig:
    out_dir: str = ""  # a run folder, whose best.pt is timed ('' = a random-weight model of the shape below)
    n_layer: int = 6  # random model: transformer blocks (nanoGPT's baby GPT)
    n_head: int = 6  # random model: attention heads
    n_embd: int = 384  # random model: width
    block_size: int = 256  # random model: context length
    vocab_size: int = 65  # random model: vocabulary (tinyshakespeare characters)
    pos_emb: Literal["learned", "rope"] = "learned"  # random model: position encoding
    max_new_tokens: int = 1000  # tokens generated per timed run
    batch_size: int = 1  # sequences generated together
    warmup_tokens: int = 16  # untimed tokens generated first, per mode
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    seed: int = 1337  # weights of the random model and the sampling generator
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # cached decoder's weights, as sample.py
    threads: int = 0  # torch CPU threads (0 = measured, as sample.py does)
    repeats: int = 1  # timed runs per mode; the fastest counts
    modes: str = "cache,nocache"  # which decoders to time, comma-separated

    def __post_init__(self):
        require(self, ["max_new_tokens", "batch_size", "repeats"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup_tokens", "temperature", "threads"], lambda v: v >= 0, "at least 0")
        check_seed(self.seed)
        check_device_name(self.device)
        self.shape()  # the random model's settings are checked by the model's own config
        modes = self.mode_list()
        if not modes or set(modes) - {"cache", "nocache"}:
            raise ValueError(f"modes must be 'cache', 'nocache' or both, comma-separated (got {self.modes!r})")

    def mode_list(self):
        return comma_items(self.modes)

    def shape(self):
        return GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size,
                         vocab_size=self.vocab_size, pos_emb=self.pos_emb, bias=False, dropout=0.0)


def device_name(device):
    """What the numbers were measured on, e.g. 'Intel(R) Xeon(R) Processor, 2 cores'."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    if device != "cpu":
        return device
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def bench_model(cfg, device):
    """The checkpoint's model, or a random-weight one of the configured shape; and a description."""
    if cfg.out_dir:
        from gptkit.rundir import load_model

        model, _ = load_model(cfg.out_dir, device)
        source = f"checkpoint in {cfg.out_dir}"
    else:
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.shape()).to(device).eval()
        source = "random weights"
    c = model.config
    return model, (f"{c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, block {c.block_size}, "
                   f"vocab {c.vocab_size}, {c.pos_emb} positions ({model.num_params() / 1e6:.2f}M parameters), "
                   f"{source}")


def time_generation(model, prompt, cfg, kv_cache, device):
    """Wall and CPU seconds to generate max_new_tokens after an untimed warm-up; and the tokens."""
    with torch.no_grad():
        if cfg.warmup_tokens:
            for _ in generate_stream(model, prompt, cfg.warmup_tokens, kv_cache=kv_cache):
                pass
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = list(generate_stream(model, prompt, cfg.max_new_tokens, temperature=cfg.temperature,
                                      kv_cache=kv_cache, generator=generator))
        synchronize(device)
        return time.perf_counter() - t0, time.process_time() - c0, torch.cat(tokens, dim=1)


def bench_sample(argv):
    """sample.py's decoding (KV cache, the precision it picks, its thread count) against nanoGPT's
    (the whole context every token, float32), at the same thread count."""
    cfg = parse_config(SampleBenchConfig, argv, prog="bench.py sample")
    device = pick_device(cfg.device)
    model, description = bench_model(cfg, device)
    cached = copy.deepcopy(model)
    if device == "cpu":  # as sample.py
        lay_out_for_decoding(cached)
    _, why_threads = pick_decode_threads(cfg.threads, cached, device, cfg.batch_size)  # both decode on these
    dtype, why = pick_decode_dtype(cfg.dtype, cached, device, cfg.batch_size)
    decoders = {"cache": (cached.to(DTYPES[dtype]), True, f"with KV cache ({dtype}):"),
                "nocache": (model, False, "without cache (float32):")}
    prompt = torch.zeros((cfg.batch_size, 1), dtype=torch.long, device=device)
    print(f"model: {description}")
    print(f"machine: {device_name(device)}, torch {torch.__version__}")
    n = torch.get_num_threads()
    cpu_threads = f", {n} CPU thread{'s' if n > 1 else ''}" if device == "cpu" else ""
    print(f"device {device}{cpu_threads}, batch {cfg.batch_size}, {cfg.max_new_tokens} new tokens from a 1-token "
          f"prompt; {'; '.join(w for w in (why_threads, why) if w)}", flush=True)
    results = {}
    for mode in cfg.mode_list():
        decoder, kv_cache, label = decoders[mode]
        runs = [time_generation(decoder, prompt, cfg, kv_cache, device) for _ in range(cfg.repeats)]
        seconds, cpu_seconds, tokens = min(runs, key=lambda run: run[0])
        results[mode] = (seconds, tokens)
        rate = cfg.max_new_tokens * cfg.batch_size / seconds
        best = f"best of {cfg.repeats}, " if cfg.repeats > 1 else ""
        print(f"{label:<27} {rate:9.1f} tokens/s  ({best}{seconds:.2f} s wall, {cpu_seconds:.2f} s CPU)", flush=True)
    if len(results) == 2:
        (t_cache, a), (t_full, b) = results["cache"], results["nocache"]
        print(f"speedup: {t_full / t_cache:.1f}x")
        if dtype == "float32":
            print(f"same tokens: {'yes' if torch.equal(a, b) else 'no (float rounding differs between the paths)'}")
    return {mode: cfg.max_new_tokens * cfg.batch_size / seconds for mode, (seconds, _) in results.items()}


# nanoGPT's documented CPU recipe, spelled as this project's flags on nanoGPT's shakespeare_char config, run
# as nanoGPT runs it: fp32, eager, attention in SDPA's kernel
CLASSIC_ARGS = ["config/shakespeare_char_gpu.py", "--dtype=float32", "--compile=False", "--attention_path=fused",
                "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
                "--n_head=4", "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
REPO = Path(__file__).resolve().parent


@dataclass
class TrainBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench"  # prepared data, both runs and loss_vs_time.png go here
    config: str = "config/shakespeare_char.py"  # the new default, compared with the classic recipe
    device: str = "cpu"  # device for both runs
    targets: str = "1.886,1.60"  # val losses to time, comma-separated
    # which runs to do, comma-separated; 'fitted' is the default with max_time set so that its whole run ends
    # within the classic run's wall time (so it needs 'classic' too)
    runs: str = "classic,default,fitted"
    default_args: str = ""  # more train.py options for the default's runs, space-separated (e.g. "--max_time=45")

    def __post_init__(self):
        runs = self.run_list()
        if set(runs) - {"classic", "default", "fitted"} or not runs or ("fitted" in runs and "classic" not in runs):
            raise ValueError(f"runs must be some of 'classic', 'default' and 'fitted', 'fitted' with 'classic' "
                             f"(got {self.runs!r})")
        try:
            targets = self.target_list()
        except ValueError:
            targets = []
        if not targets or not all(0 < t < float("inf") for t in targets):
            raise ValueError(f"targets must be positive val losses, comma-separated (got {self.targets!r})")
        check_device_name(self.device)

    def target_list(self):
        return [float(t) for t in comma_items(self.targets)]

    def run_list(self):
        return comma_items(self.runs)


def bench_input(cfg):
    if cfg.input:
        return cfg.input
    path = REPO / "data/shakespeare_char/input.txt"
    if not path.exists():
        raise UserError("no tinyshakespeare here: run `python data/prepare.py` first or pass --input=PATH")
    return str(path)


def prepared_work_dir(cfg):
    """A training benchmark's work folder, its text (cfg.input, or tinyshakespeare) prepared in work/data."""
    from gptkit.corpus import PrepareConfig, prepare

    work = Path(cfg.work_dir)
    prepare(PrepareConfig(input=bench_input(cfg), name="shakespeare_char", data_dir=str(work / "data")))
    return work


def run_summary(out_dir, targets, wall_s):
    """What a finished run reached and how fast: times to each target (seconds since its process started),
    the whole-split val loss at the end, its iterations, and, from its first and last train records, tokens/s
    and achieved FLOP/s against this machine's matmul peak (None with fewer than two train records)."""
    records = read_metrics(out_dir)
    run = next(r for r in records if r["kind"] == "run")
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    final = next(r for r in reversed(records) if r["kind"] == "final")
    tok_s = gflops = peak_pct = None
    if len(trains) >= 2 and trains[-1]["elapsed_s"] > trains[0]["elapsed_s"]:
        first, last = trains[0], trains[-1]
        tok_s = (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])
        flops = tok_s * run["flops_per_token"]
        gflops, peak_pct = flops / 1e9, 100 * flops / matmul_peak(run["dtype"], run["device"])
    return {"wall_s": wall_s, "final_val": final["val_loss"], "iters": final["iter"], "dtype": run["dtype"],
            "tok_s": tok_s, "gflops": gflops, "peak_pct": peak_pct,
            "hit": {t: next((r["elapsed_s"] for r in evals if r["val_loss"] <= t), None) for t in targets},
            "evals": evals}


def rate(value, form):
    return "n/a" if value is None else form.format(value)


def fmt_s(seconds):
    return f"{seconds:.1f} s" if seconds is not None else "never"


def print_train_table(summaries, targets):
    names = list(summaries)
    rows = [("wall time of the run", lambda s: fmt_s(s["wall_s"])),
            *[(f"time to val <= {t}", lambda s, t=t: fmt_s(s["hit"][t])) for t in targets],
            ("iterations", lambda s: str(s["iters"])),
            ("final val (whole split)", lambda s: f"{s['final_val']:.4f}"),
            ("precision", lambda s: s["dtype"]), ("tokens/s", lambda s: rate(s["tok_s"], "{:,.0f}")),
            ("GFLOP/s", lambda s: rate(s["gflops"], "{:.1f}")),
            ("% of matmul peak", lambda s: rate(s["peak_pct"], "{:.0f}%"))]
    print(f"\n{'':<24}" + "".join(f"{n:>14}" for n in names))
    for label, cell in rows:
        print(f"{label:<24}" + "".join(f"{cell(summaries[n]):>14}" for n in names))
    if "classic" in summaries and "default" in summaries:
        a, b = summaries["classic"], summaries["default"]
        for t in targets:
            if b["hit"][t]:
                print(f"time to {t}: the default gets there {a['wall_s'] / b['hit'][t]:.1f}x sooner than the "
                      f"classic run's wall time" + (f", {a['hit'][t] / b['hit'][t]:.1f}x sooner than the classic run "
                                                    "does" if a["hit"][t] else "; the classic run never does"))
        print(f"the default's whole run took {b['wall_s'] / a['wall_s']:.2f} of the classic run's wall time")
        if a["tok_s"] and b["tok_s"]:
            print(f"tokens/s: {b['tok_s'] / a['tok_s']:.2f}x, GFLOP/s: {b['gflops'] / a['gflops']:.2f}x")
        else:
            print("tokens/s: n/a (a run logged fewer than two train records; lower its log_interval)")
    if "fitted" in summaries:
        a, f = summaries["classic"], summaries["fitted"]
        print(f"fitted to the classic run's wall time, the default's whole run took {fmt_s(f['wall_s'])} against "
              f"{fmt_s(a['wall_s'])} ({'within' if f['wall_s'] <= a['wall_s'] else 'OVER'}) and ended at "
              f"{f['final_val']:.4f}, the classic run at {a['final_val']:.4f}")


def clear_run_folder(out_dir):
    """Empty a benchmark's run folder for a new run, under its lock: a run still training there is refused in one
    line, never deleted from under it."""
    from gptkit.rundir import RunDir

    with RunDir(out_dir).locked():
        shutil.rmtree(out_dir)


def train_run(name, args, work, out_dir, targets):
    """train.py with args on the data prepared in work, into out_dir (emptied first), to its end; its run_summary."""
    clear_run_folder(out_dir)
    cmd = [sys.executable, str(REPO / "train.py"), *args, f"--data_dir={work / 'data'}", "--dataset=shakespeare_char",
           f"--out_dir={out_dir}"]
    print(f"\n== {name}: {' '.join(map(str, cmd[1:]))}", flush=True)
    start = time.time()
    if subprocess.run(cmd, cwd=REPO).returncode:
        raise UserError(f"the {name} run failed")
    return run_summary(out_dir, targets, time.time() - start)


def bench_train(argv):
    """The classic nanoGPT CPU recipe and the new default, one after the other on this machine."""
    cfg = parse_config(TrainBenchConfig, argv, prog="bench.py train")
    targets = cfg.target_list()
    work = prepared_work_dir(cfg)
    args = {"classic": CLASSIC_ARGS, "default": [cfg.config, *cfg.default_args.split()]}
    print(f"machine: {device_name(cfg.device)}, torch {torch.__version__}")
    summaries = {}
    for name in sorted(cfg.run_list(), key=["classic", "default", "fitted"].index):
        if name == "fitted":  # max_time counts from process start to exit, as wall_s does
            args["fitted"] = [*args["default"], f"--max_time={max(1, int(summaries['classic']['wall_s']))}"]
        summaries[name] = train_run(name, [*args[name], f"--device={cfg.device}"], work, work / name, targets)
    print_train_table(summaries, targets)
    from gptkit.pictures import draw_val_loss_vs_time

    draw_val_loss_vs_time({name: s["evals"] for name, s in summaries.items()},
                          "tinyshakespeare, val loss against wall time", work / "loss_vs_time.png")


@dataclass
class PresetsBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-presets"  # prepared data and every run go here
    configs: str = ("config/shakespeare_char.py,config/shakespeare_char_5min.py,"
                    "config/shakespeare_char_10min.py")  # presets to train, comma-separated
    targets: str = "1.46,1.43,1.41"  # each preset's target: mean val loss on the whole split ('' = none)
    seeds: str = "1337,1338,1339"  # each preset trains once per seed, comma-separated
    device: str = "cpu"  # device for every run
    args: str = ""  # more train.py options for every run, space-separated

    def __post_init__(self):
        if not self.config_list() or not self.seed_list():
            raise ValueError("configs and seeds must each name at least one")
        for seed in self.seed_list():
            check_seed(seed)
        targets = self.target_list()
        if targets and (len(targets) != len(self.config_list()) or not all(t > 0 for t in targets)):
            raise ValueError(f"targets must be one positive val loss per config, or '' (got {self.targets!r})")
        check_device_name(self.device)

    def config_list(self):
        return comma_items(self.configs)

    def seed_list(self):
        try:
            return [int(s) for s in comma_items(self.seeds)]
        except ValueError:
            raise ValueError(f"seeds must be integers, comma-separated (got {self.seeds!r})") from None

    def target_list(self):
        try:
            return [float(t) for t in comma_items(self.targets)]
        except ValueError:
            raise ValueError(f"targets must be val losses, comma-separated (got {self.targets!r})") from None


def bench_presets(argv):
    """Each preset trained once per seed, one run after another, wall time taken from process start to exit;
    each preset's mean whole-split val loss, its spread, and its target."""
    cfg = parse_config(PresetsBenchConfig, argv, prog="bench.py presets")
    work = prepared_work_dir(cfg)
    print(f"machine: {device_name(cfg.device)}, torch {torch.__version__}")
    results = {}
    for config in cfg.config_list():
        results[config] = []
        for seed in cfg.seed_list():
            args = [config, *cfg.args.split(), f"--seed={seed}", f"--device={cfg.device}"]
            out_dir = work / f"{Path(config).stem}-{seed}"
            results[config].append(train_run(f"{config}, seed {seed}", args, work, out_dir, []))
    budgets = {config: parse_config(TrainConfig, [config, *cfg.args.split()]).max_time for config in results}
    print_presets_table(results, dict(zip(cfg.config_list(), cfg.target_list())), budgets, cfg.seed_list())


def print_presets_table(results, targets, budgets, seeds):
    """One row per run, then each preset's mean and spread over its seeds against its target and time budget."""
    print(f"\n{'preset':<36}{'seed':>6}{'final val':>11}{'wall time':>11}{'iterations':>12}{'precision':>11}")
    for config, runs in results.items():
        for seed, s in zip(seeds, runs):
            print(f"{config:<36}{seed:>6}{s['final_val']:>11.4f}{fmt_s(s['wall_s']):>11}{s['iters']:>12}"
                  f"{s['dtype']:>11}")
    print()
    for config, runs in results.items():
        losses, walls = [s["final_val"] for s in runs], [s["wall_s"] for s in runs]
        mean = statistics.mean(losses)
        spread = f"{min(losses):.4f}-{max(losses):.4f}" + (f", std {statistics.stdev(losses):.4f}" if len(runs) > 1
                                                           else "")
        line = f"{config}: mean {mean:.4f} over {len(runs)} seed{'s' if len(runs) > 1 else ''} ({spread})"
        if budgets[config] > 0:
            line += (f"; wall time {min(walls):.1f}-{max(walls):.1f} s, " +
                     ("within" if max(walls) <= budgets[config] else "OVER") + f" max_time {budgets[config]:g} s")
        if config in targets:
            line += f"; target <= {targets[config]}: " + ("met" if mean <= targets[config] else "missed")
        print(line)


@dataclass
class BusyBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-busy"  # prepared data and the runs go here
    config: str = "config/shakespeare_char.py"  # the run timed idle and beside a busy process
    seconds: float = 40.0  # each run's max_time
    fixed_threads: int = 0  # also time this many threads, fixed, idle and busy (0 = torch's default)

    def __post_init__(self):
        require(self, ["seconds"], lambda v: v > 0, "more than 0")
        require(self, ["fixed_threads"], lambda v: v >= 0, "at least 0")


def bench_busy(argv):
    """Training tokens/s on an idle machine, beside one busy process (a core held by a spinning Python) and beside
    one that starts halfway through: the run's own thread choice (threads=0, measured as it goes) against a fixed
    thread count, idle (what measuring costs) and busy (what it saves)."""
    cfg = parse_config(BusyBenchConfig, argv, prog="bench.py busy")
    work = prepared_work_dir(cfg)
    fixed = cfg.fixed_threads or torch.get_num_threads()
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}")
    rates = {}
    for name, busy_after, threads in [("idle", None, 0), (f"idle, {fixed} threads fixed", None, fixed),
                                      ("busy", 0, 0), (f"busy, {fixed} threads fixed", 0, fixed),
                                      ("busy from halfway", cfg.seconds / 2, 0)]:
        args = [cfg.config, "--device=cpu", f"--max_time={cfg.seconds}", f"--threads={threads}", "--log_interval=5"]
        spinner = None if busy_after is None else subprocess.Popen(
            [sys.executable, "-c", f"import time\ntime.sleep({busy_after})\nwhile True: pass"])
        try:
            rates[name] = train_run(name, args, work, work / name.replace(" ", "_").replace(",", ""), [])["tok_s"]
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
    print_busy_table(rates)


def print_busy_table(rates):
    """Each run's tokens/s and its share of the idle run's; n/a where a run logged too little to have a rate."""
    print()
    for name, tok_s in rates.items():
        share = tok_s / rates["idle"] if tok_s and rates["idle"] else None
        print(f"{name:<28} {rate(tok_s, '{:,.0f}'):>10} tokens/s  {rate(share, '{:.0%}'):>5} of idle")


@dataclass
class ThroughputBenchConfig:
    config: str = "config/shakespeare_char.py"  # whose dtype, optimizer, architecture and compile setting to time
    n_layer: int = 6  # the timed shape: nanoGPT's baby GPT
    n_head: int = 6  # attention heads
    n_embd: int = 384  # width
    block_size: int = 256  # context length
    batch_size: int = 64  # sequences per step (nanoGPT: 64 x 256 = 16,384 tokens)
    vocab_size: int = 65  # the random tokens' vocabulary: tinyshakespeare's characters, or GPT-2's 50304
    steps: int = 10  # timed optimizer steps of each, shared among the rounds
    rounds: int = 5  # rounds of each candidate and of the matmul peak, alternating; the median round counts
    warmup: int = 2  # untimed steps first (compilation happens here)
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    compiled: bool = True  # also time the config's settings compiled, when the config itself runs eagerly

    def __post_init__(self):
        require(self, ["n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size", "steps", "rounds"],
                lambda v: v >= 1, "at least 1")
        require(self, ["warmup"], lambda v: v >= 0, "at least 0")
        check_device_name(self.device)
        GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size)


def training_step(tcfg, device, vocab_size=65):
    """One optimizer step of tcfg's model, optimizer, precision and attention path (chosen as train.py chooses
    them) on random tokens, as a function; and the model, the precision and the attention path taken."""
    from gptkit.optim import build_optimizers

    torch.manual_seed(0)
    model = GPT(replace(tcfg.model, vocab_size=vocab_size)).to(device)
    dtype, _, measured, _ = pick_training_dtype(tcfg.dtype, model, tcfg.batch_size, device, tcfg.attention_path)
    optimizers = build_optimizers(model, tcfg, dtype)
    ctx = autocast(device, dtype)
    path, _ = measured or attention_path_for(tcfg.attention_path, model, tcfg.batch_size, ctx, device)
    model.set_attention_path(path)
    if tcfg.compile:
        compile_blocks(model)
    x = torch.randint(vocab_size, (tcfg.batch_size, tcfg.model.block_size), device=device)

    def step():
        with ctx:
            loss = model(x, x)[1]
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()

    return step, model, dtype, path


def seconds_per_step(step, steps, device):
    """The mean seconds of `steps` calls of step(), the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def bench_throughput(argv):
    """Training tokens/s on one shape: fp32 AdamW GPT-2 (the baseline) against a config's settings,
    and against them compiled when the config itself runs eagerly; each as a share of the matmul peak
    measured here for the precision it trains in. The steps and the peaks are timed in alternating rounds in
    one process and the median round counts, so that a machine whose speed drifts slows each of them alike."""
    cfg = parse_config(ThroughputBenchConfig, argv, prog="bench.py throughput")
    device = pick_device(cfg.device)
    keep_freed_memory()  # as train.py does
    allow_tf32(device)  # as train.py's Runtime does
    shape = [f"--{k}={getattr(cfg, k)}" for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size")]
    baseline = [*shape, "--dtype=float32", "--dropout=0.0", "--attention_path=fused"]  # as nanoGPT runs
    candidates = {"fp32 AdamW GPT-2": parse_config(TrainConfig, baseline),
                  cfg.config: parse_config(TrainConfig, [cfg.config, *shape, "--dropout=0.0"])}
    if cfg.compiled and not candidates[cfg.config].compile:
        candidates[f"{cfg.config}, compiled"] = replace(candidates[cfg.config], compile=True)
    print(f"machine: {device_name(device)}, torch {torch.__version__}", flush=True)
    taken = {}
    for name, tcfg in candidates.items():
        step, model, dtype, path = training_step(tcfg, device, cfg.vocab_size)
        for _ in range(cfg.warmup):
            step()
        taken[name] = step, flops_per_token(model, tcfg.model.block_size), dtype, path
    rounds = timed_rounds(taken, cfg, device)
    rates, tokens = {}, cfg.batch_size * cfg.block_size
    for name, (_, token_flops, dtype, path) in taken.items():
        rates[name] = statistics.median(tokens / s for s, _ in rounds[name])
        share = statistics.median(tokens / s * token_flops / peak for s, peak in rounds[name])
        peaks = sorted(peak / 1e9 for _, peak in rounds[name])
        print(f"{name:<36} {dtype:>9} {candidates[name].optimizer:>6} compile={candidates[name].compile!s:<5} "
              f"attention={path:<7} {rates[name]:8,.0f} tokens/s {rates[name] * token_flops / 1e9:7.1f} GFLOP/s = "
              f"{100 * share:3.0f}% of the {dtype} matmul peak measured here (median round; peaks "
              f"{peaks[0]:.0f}-{peaks[-1]:.0f} GFLOP/s){datasheet_mfu(rates[name] * token_flops, device, dtype)}")
    base, *others = rates
    for name in others:
        print(f"throughput ratio, {name}: {rates[name] / rates[base]:.2f}x")


def datasheet_mfu(flops, device, dtype):
    """', N% MFU' against the device's datasheet peak for dtype (TF32's for float32), or '' where none is known."""
    peak = peak_flops(device, dtype)
    return f", {100 * flops / peak:.1f}% MFU of the datasheet's {peak / 1e12:.0f} TFLOP/s" if peak else ""


def timed_rounds(taken, cfg, device):
    """[(seconds a step took, the matmul peak of its precision timed just before)] of each candidate, one of each
    a round, in cfg.rounds rounds sharing cfg.steps timed steps per candidate (at least one a round): on a
    machine whose speed moves from minute to minute, a step's share of the peak is the share of that moment's."""
    rounds, per_round = {name: [] for name in taken}, max(1, cfg.steps // cfg.rounds)
    print(f"{cfg.rounds} rounds of {per_round} step{'s' * (per_round > 1)} each, alternating", flush=True)
    for _ in range(cfg.rounds):
        for name, (step, _, dtype, _) in taken.items():
            peak = matmul_peak(dtype, device)
            rounds[name].append((seconds_per_step(step, per_round, device), peak))
    return rounds


@dataclass
class DropoutBenchConfig:
    config: str = "config/shakespeare_char.py"  # whose model, batch, optimizer, precision and compile setting to time
    dropout: float = 0.1  # the rate timed against no dropout
    rounds: int = 16  # rounds of each, alternating; the median round counts
    steps: int = 6  # timed optimizer steps per round
    warmup: int = 3  # untimed steps of each first (compilation happens here)
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'

    def __post_init__(self):
        require(self, ["rounds", "steps"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup"], lambda v: v >= 0, "at least 0")
        require(self, ["dropout"], lambda v: 0 < v < 1, "above 0 and below 1")
        check_device_name(self.device)


def bench_dropout(argv):
    """The share of the steps dropout costs: the config's training step without dropout and with it, in
    alternating rounds in one process, so that a machine whose speed drifts slows both alike."""
    cfg = parse_config(DropoutBenchConfig, argv, prog="bench.py dropout")
    device = pick_device(cfg.device)
    keep_freed_memory()  # as train.py does
    steps, seconds = {}, {}
    for p in (0.0, cfg.dropout):
        step, _, dtype, path = training_step(parse_config(TrainConfig, [cfg.config, f"--dropout={p}"]), device)
        for _ in range(cfg.warmup):
            step()
        steps[p], seconds[p] = step, []
        if p and path == "fused" and device == "cpu":
            path = "folded (SDPA's fused CPU kernel takes no dropout)"
        print(f"dropout {p}: {dtype}, attention path {path}", flush=True)
    print(f"machine: {device_name(device)}, torch {torch.__version__}; {cfg.config}, {cfg.rounds} rounds of "
          f"{cfg.steps} steps each")
    for _ in range(cfg.rounds):
        for p, step in steps.items():
            seconds[p].append(seconds_per_step(step, cfg.steps, device))
    median = {p: statistics.median(s) for p, s in seconds.items()}
    for p, s in seconds.items():
        print(f"dropout {p:<4} {1000 * median[p]:7.1f} ms a step (median round; rounds "
              f"{1000 * min(s):.0f}-{1000 * max(s):.0f} ms)")
    print(f"dropout {cfg.dropout} costs {1 - median[0.0] / median[cfg.dropout]:.1%} of the steps")


@dataclass
class ExploreBenchConfig:
    out_dir: str = "out"  # the run the explorer serves (e.g. the default's, after python train.py config/...)
    max_tokens: int = 1000  # tokens streamed in the timed generation
    text_tokens: int = 256  # length of the text the analysis panels are timed on
    repeats: int = 5  # timed requests per analysis; the median counts

    def __post_init__(self):
        require(self, ["max_tokens", "text_tokens", "repeats"], lambda v: v >= 1, "at least 1")


def bench_explore(argv):
    """The explorer as a browser uses it, against a server started as a user starts it (python explore.py):
    the page's load from a cold start, the first streamed token after the request, streaming tokens/s against
    bench.py sample's cached decoding of the same model, and the analysis panels' answers on a long text."""
    import statistics

    import httpx

    cfg = parse_config(ExploreBenchConfig, argv, prog="bench.py explore")
    rates = bench_sample([f"--out_dir={cfg.out_dir}", "--modes=cache", f"--max_new_tokens={cfg.max_tokens}",
                          "--repeats=3", "--device=cpu"])
    server = subprocess.Popen([sys.executable, str(REPO / "explore.py"), cfg.out_dir, "--port=0", "--device=cpu"],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline()
        if not address.startswith("explorer: "):
            raise UserError(f"explore.py did not start: {address.strip() or 'no output'}")
        with httpx.Client(base_url=address.split()[1].rstrip("/"), timeout=120) as http:
            page_s = timed(lambda: [http.get(f).raise_for_status() for f in PAGE_FILES])
            run = http.get("/api/runs").json()["runs"][0]["name"]
            first_s, stream_rate = time_stream(http, run, cfg.max_tokens)
            analysis = time_analysis(http, run, cfg)
    finally:
        server.terminate()
        server.wait()
    print(f"page and its files from a cold server start: {page_s * 1e3:.0f} ms")
    print(f"first streamed token after the request: {first_s * 1e3:.0f} ms")
    print(f"streaming: {stream_rate:.1f} tokens/s, {stream_rate / rates['cache']:.0%} of bench.py sample's "
          f"{rates['cache']:.1f} cached tokens/s")
    for name, seconds in analysis.items():
        print(f"{name}: {statistics.median(seconds) * 1e3:.0f} ms (median of {len(seconds)})")


PAGE_FILES = ["/", "/static/explorer.js", "/static/explorer.css", "/static/vendor/uPlot.iife.min.js",
              "/static/vendor/uPlot.min.css", "/api/runs"]


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def time_stream(http, run, max_tokens):
    """Seconds from the request to the first token event, and tokens/s from the first token to the last."""
    start, first, count = time.perf_counter(), None, 0
    body = {"run": run, "prompt": "\n", "max_tokens": max_tokens, "seed": 1337}
    with http.stream("POST", "/api/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[len("data: "):])["type"] == "token":
                count += 1
                first = first or time.perf_counter()
    return first - start, (count - 1) / (time.perf_counter() - first)


def time_analysis(http, run, cfg):
    """Each analysis request, timed repeats times on a text of text_tokens tokens that the model wrote (its last
    context window for the per-position panels)."""
    model = http.get(f"/api/runs/{run}").json()
    body = {"run": run, "prompt": "\n", "max_tokens": cfg.text_tokens - 1, "seed": 1}
    with http.stream("POST", "/api/generate", json=body) as r:
        done = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")][-1]
    text = "\n" + done["text"]
    ids = [t["id"] for t in http.post("/api/read", json={"run": run, "text": text}).json()["tokens"]]
    window = ids[-model["block_size"]:]
    requests = {"read a text (surprise of every token)": ("/api/read", {"run": run, "text": text}),
                "why this token, where it looked, logit lens": ("/api/position",
                                                                {"run": run, "ids": window,
                                                                 "position": len(window) - 1}),
                "one head's full map": ("/api/attention_map", {"run": run, "ids": window, "layer": 0, "head": 0})}
    return {name: [timed(lambda: http.post(path, json=body).raise_for_status()) for _ in range(cfg.repeats)]
            for name, (path, body) in requests.items()}


@dataclass
class PrepareBenchConfig:
    input: str = ""  # text the corpus is cut from ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    size_gb: float = 1.0  # size of the JSON Lines corpus to make and prepare, in GB (10**9 bytes)
    tokenizer: str = "gpt2"  # the tokenizer both prepares use
    workers: int = 0  # tokenizing processes, ours and nanoGPT's num_proc (0 = one per core)
    val_fraction: float = 0.0005  # our val split's share of documents (nanoGPT's script takes 0.0005)
    work_dir: str = "out-bench-prepare"  # the corpus, the datasets and nanoGPT's cache go here
    nanogpt_dir: str = ""  # a checkout of nanoGPT, whose OpenWebText prepare runs beside ours ('' = ours only)
    train_iters: int = 20  # train.py iterations reading the prepared shards, memory measured (0 = none)
    keep: bool = False  # keep what was written (removed by default: it is as big as the corpus, twice over)

    def __post_init__(self):
        require(self, ["size_gb"], lambda v: 0 < v <= 10_000, "above 0, at most 10,000")
        require(self, ["workers"], lambda v: 0 <= v <= 512, "0 (one per core) to 512")
        require(self, ["train_iters"], lambda v: v >= 0, "0 or more")
        require(self, ["val_fraction"], lambda v: 0 < v < 1, "between 0 and 1")


def bench_prepare(argv):
    """A JSON Lines corpus prepared by data/prepare.py (and read by train.py), beside nanoGPT's script."""
    from gptkit import prepare_bench as pb
    from gptkit.corpus import cores

    cfg = parse_config(PrepareBenchConfig, argv, prog="bench.py prepare")
    workers = cfg.workers or cores()
    if cfg.nanogpt_dir:
        pb.nanogpt_script(cfg.nanogpt_dir)  # a wrong checkout fails now, not after our run
    work = Path(cfg.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{cfg.size_gb:g}GB.jsonl"
    if not corpus.exists() or abs(corpus.stat().st_size - cfg.size_gb * 1e9) > 1e7 + pb.HUGE_BYTES:
        print(f"making {corpus} ({cfg.size_gb:g} GB of JSON Lines)", flush=True)
        pb.make_corpus(Path(bench_input(cfg)).read_text(encoding="utf-8"), corpus, int(cfg.size_gb * 1e9))
    print(f"machine: {device_name('cpu')}")
    results = {"ours": pb.run_ours(corpus, work / "data", cfg.tokenizer, cfg.val_fraction, workers)}
    if results["ours"][0]:
        raise UserError("data/prepare.py failed on the benchmark's corpus (its error is above)")
    if cfg.train_iters:
        results["training reads ours"] = pb.run_training_read(work / "data", work / "train", cfg.train_iters)
    if cfg.nanogpt_dir:
        results["nanoGPT"] = pb.run_nanogpt(corpus, work, cfg.nanogpt_dir, workers)
    print_prepare_table(results, corpus.stat().st_size)
    if not cfg.keep:
        for name in ("data", "train", "nanogpt", "hf_cache"):
            shutil.rmtree(work / name, ignore_errors=True)


def print_prepare_table(results, corpus_bytes):
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


# subcommand -> function taking the remaining arguments
COMMANDS = {
    "sample": bench_sample,
    "train": bench_train,
    "throughput": bench_throughput,
    "dropout": bench_dropout,
    "explore": bench_explore,
    "busy": bench_busy,
    "presets": bench_presets,
    "prepare": bench_prepare,
}


def main(argv=None):
    picked = pick_subcommand("bench.py", COMMANDS, sys.argv[1:] if argv is None else argv, "benchmark")
    if picked:
        name, rest = picked
        COMMANDS[name](rest)


if __name__ == "__main__":
    run_main(main, memory_settings=("batch_size", "block_size", "n_embd", "n_layer", "vocab_size", "max_new_tokens"))
