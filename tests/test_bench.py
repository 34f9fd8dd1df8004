"""bench.py's training benchmarks: the throughput comparison runs, and the side-by-side table states the ratios."""

import re

import bench


def test_throughput_times_the_baseline_and_the_config(capsys):
    bench.main(["throughput", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                "--steps=2", "--warmup=1", "--compiled=False"])
    out = capsys.readouterr().out
    assert "fp32 AdamW GPT-2" in out and "config/shakespeare_char.py" in out
    assert re.search(r"throughput ratio, config/shakespeare_char.py: \d+\.\d+x", out)


def summary(wall_s, hits):
    return {"wall_s": wall_s, "final_val": 1.5, "iters": 10, "tok_s": 1000.0, "gflops": 1.0, "hit": hits}


def test_train_table_compares_times_to_each_target(capsys):
    classic = summary(80.0, {1.886: 60.0, 1.6: None})
    default = summary(150.0, {1.886: 20.0, 1.6: 120.0})
    bench.print_train_table({"classic": classic, "default": default}, [1.886, 1.6])
    out = capsys.readouterr().out
    assert "time to 1.886: default is 3.0x faster" in out
    assert "time to 1.6: default gets there in 1.50 of the classic run's wall time; the classic run never does" in out
    assert re.search(r"time to val <= 1.6 +never +120.0 s", out)
    assert "default's whole run vs classic's: 1.88 of its wall time" in out
