"""`bench.py train`: nanoGPT's documented CPU recipe and the new default, each a train.py run one after the
other on this machine, side by side: times to the target val losses, final loss, rates; and a loss-against-time
plot."""

from dataclasses import dataclass

import torch

from benchmarks.common import device_name, fmt_s, prepared_work_dir, rate, train_run
from gptkit.base.settings import comma_items, parse_config
from gptkit.machine.runtime import check_device_name

# nanoGPT's documented CPU recipe, spelled as this project's flags on nanoGPT's shakespeare_char config, run
# as nanoGPT runs it: fp32, eager, attention in SDPA's kernel
CLASSIC_ARGS = ["config/shakespeare_char_gpu.py", "--dtype=float32", "--compile=False", "--attention_path=fused",
                "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
                "--n_head=4", "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]


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


def main(argv):
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
    from gptkit.interp.pictures import draw_val_loss_vs_time

    draw_val_loss_vs_time({name: s["evals"] for name, s in summaries.items()},
                          "tinyshakespeare, val loss against wall time", work / "loss_vs_time.png")


def print_train_table(summaries, targets):
    """One column per run, then how the default (and the fitted run) compare with the classic run."""
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
        print_default_against_classic(summaries["classic"], summaries["default"], targets)
    if "fitted" in summaries:
        a, f = summaries["classic"], summaries["fitted"]
        print(f"fitted to the classic run's wall time, the default's whole run took {fmt_s(f['wall_s'])} against "
              f"{fmt_s(a['wall_s'])} ({'within' if f['wall_s'] <= a['wall_s'] else 'OVER'}) and ended at "
              f"{f['final_val']:.4f}, the classic run at {a['final_val']:.4f}")


def print_default_against_classic(a, b, targets):
    """How much sooner the default (b) reaches each target than the classic run (a), and their rates."""
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
