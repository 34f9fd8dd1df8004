"""
Benchmarks, one subcommand each; every subcommand takes its own --key=value options (--help lists them).

    python bench.py sample                         # KV cache vs full recompute on a random baby GPT
    python bench.py sample --out_dir=out           # the same on a trained checkpoint
    python bench.py sample --dtype=bfloat16 --threads=1
    python bench.py train                          # nanoGPT's CPU recipe vs config/shakespeare_char.py, side by side
    python bench.py throughput                     # training tokens/s on the baby GPT: fp32 AdamW vs the default's settings
    python bench.py dropout                        # the share of the default's steps that dropout 0.1 costs
    python bench.py hooks                          # what the idle hook points cost a step and a decoded token
    python bench.py explore --out_dir=out          # the explorer: first token, streaming, page load, analysis, load
    python bench.py analyze                        # analyze.py: every head's ablation delta, a patching heatmap
    python bench.py features                       # analyze.py features on the default's model, against its targets
    python bench.py timeline                       # what the timeline costs; the induction lesson against its targets
    python bench.py busy                           # training tokens/s idle and beside one busy process
    python bench.py startup                        # start-up, the same choices run after run, max_time held
    python bench.py fair                           # the same steps idle and busy; records' cost; edits compared
    python bench.py presets                        # each preset trained with 3 seeds: mean val loss, spread, target
    python bench.py prepare --nanogpt_dir=../nanoGPT  # a 1 GB JSON Lines corpus: ours vs nanoGPT's OpenWebText prepare
    python bench.py prepare --size_gb=10           # peak memory preparing, then training on, 10 GB
    python bench.py tokenizers                     # characters vs trained BPEs; training and encoding a BPE
    python bench.py tokenizers --parts=compare     # only the comparison: bits per character after equal training time
    python bench.py chat                           # base, SFT, LoRA and RL on held-out problems, against the targets

Each benchmark lives in benchmarks/, one module per subcommand, named for what it measures (COMMANDS below).
"""

import sys

from gptkit.base.errors import run_main  # first: a Ctrl-C while torch loads is one line too
from benchmarks import (analyze_speed, busy, chat_pipeline, dropout, explore_speed, fair, features_cost, hooks_cost,
                        prepare_cost, presets, sample_speed, startup, throughput, timeline_cost, tokenizers,
                        train_speed)
from gptkit.base.settings import pick_subcommand

# subcommand -> (its module's entry function, taking the remaining arguments; what it measures)
COMMANDS = {
    "sample": (sample_speed.main, "sample.py's decoding with its KV cache against recomputing the whole context"),
    "train": (train_speed.main, "nanoGPT's CPU recipe and the default config trained side by side: times to targets"),
    "throughput": (throughput.main, "training tokens/s: fp32 AdamW GPT-2 against a config's settings"),
    "dropout": (dropout.main, "the share of a config's training steps that dropout costs"),
    "hooks": (hooks_cost.main, "what model.py's idle hook points cost a training step and a decoded token"),
    "explore": (explore_speed.main, "the explorer: page load, first token, streaming, the analysis panels, under load"),
    "analyze": (analyze_speed.main, "analyze.py: every head's ablation delta on 65,536 val tokens, a patching heatmap"),
    "features": (features_cost.main, "analyze.py features on the default's model: time, peak memory, the SAE's "
                                      "metrics"),
    "timeline": (timeline_cost.main, "the timeline's cost in training time and disk; the induction lesson's targets"),
    "busy": (busy.main, "training tokens/s idle and beside a busy process"),
    "startup": (startup.main, "start-up to the first step, the same command's choices idle and busy, max_time held"),
    "fair": (fair.main, "the same command idle and busy, a busy first measurement, the records' cost, edits "
                            "compared idle and busy"),
    "presets": (presets.main, "each preset trained once per seed: mean val loss, spread, target"),
    "prepare": (prepare_cost.main, "a JSON Lines corpus prepared (and read by train.py) beside nanoGPT's script"),
    "tokenizers": (tokenizers.main, "characters against trained BPEs in bits per character at equal training time; "
                                    "a BPE's training and encoding speed"),
    "chat": (chat_pipeline.main, "the chat lesson's stages (base, SFT, LoRA, RL) timed and scored on held-out "
                                 "problems; plain against reversed sums"),
}


def main(argv=None):
    picked = pick_subcommand("bench.py", COMMANDS, sys.argv[1:] if argv is None else argv, "benchmark")
    if picked:
        name, rest = picked
        run, _ = COMMANDS[name]
        run(rest)


if __name__ == "__main__":
    run_main(main, memory_settings=("batch_size", "block_size", "n_embd", "n_layer", "vocab_size", "max_new_tokens"))
