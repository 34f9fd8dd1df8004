"""A run's timeline and snapshots (gptkit/interp/timeline.py, gptkit/training/snapshots.py, analyze.py timeline):
the record's head scores are analyze.py heads' on the weights of that step, a resumed run's timeline is the
uninterrupted one's, snapshots stay log-spaced and open in every tool, and each mistake is one line."""

import json
import math
import shutil

import pytest
import torch

import train
from conftest import Run, assert_one_error_line, check_ok, faulty_train, run_here, train_args, train_cmd
from gptkit.interp.timeline import icl_positions, phase_change, steepest, timeline_of
from gptkit.run.metrics import read_metrics
from gptkit.training.snapshots import crowded

SHORT = ["--max_iters=30", "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--n_layer=2"]


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory, data_dir):
    """A 30-step run of a 2-layer model keeping 4 snapshots, in this process."""
    out = tmp_path_factory.mktemp("timeline") / "out"
    train.main(train_args(data_dir, out, *SHORT, "--snapshots=4"))
    return out


def timeline(out):
    return timeline_of(read_metrics(out))


# ----------------------------------------------------------------------------- the records


def test_records_come_at_log_spaced_steps_and_every_evaluation(timed_run):
    steps = [t["iter"] for t in timeline(timed_run)]
    assert steps == [0, 1, 2, 4, 8, 10, 20, 30]
    first = timeline(timed_run)[0]
    assert set(first["heads"]) == {"previous_token", "first_token", "duplicate_token", "induction", "local"}
    assert len(first["heads"]["induction"]) == 2 and len(first["loss_by_position"]) == 8


def test_a_records_head_scores_are_analyze_heads_on_the_weights_of_that_step(timed_run):
    """The snapshot of step 10 opened by analyze.py heads scores every head as the timeline recorded it then."""
    recorded = {t["iter"]: t for t in timeline(timed_run)}
    for step in [i for i in (0, 10, 30) if (timed_run / "snapshots" / f"iter_{i}.pt").exists()]:
        answer = json.loads(check_ok(run_here("analyze.py", "heads", timed_run, f"--checkpoint=iter:{step}",
                                              "--json", "--tokens=512", "--dtype=float32",
                                              f"--output={timed_run / 'h.png'}")).stdout)
        for row in answer["heads"]:
            for kind, scores in recorded[step]["heads"].items():
                assert row[kind] == pytest.approx(scores[row["layer"]][row["head"]], abs=1e-4), (step, kind)


def test_a_resumed_runs_timeline_is_the_uninterrupted_ones(tmp_path, data_dir):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train.main(train_args(data_dir, straight, *SHORT, "--snapshots=3"))
    script = faulty_train(tmp_path, signal=("SIGTERM", 14, [0]))
    proc = Run(train_cmd(data_dir, stopped, *SHORT, "--snapshots=3", script=script), tmp_path / "log")
    assert proc.wait() == 143
    train.main(train_args(data_dir, stopped, *SHORT, "--snapshots=3", "--init_from=auto"))
    def numbers(out):  # each record but the seconds it was written at
        return [{k: v for k, v in t.items() if k != "elapsed_s"} for t in timeline(out)]
    assert numbers(stopped) == numbers(straight)
    assert sorted(p.name for p in (stopped / "snapshots").iterdir()) == \
        sorted(p.name for p in (straight / "snapshots").iterdir())


def test_icl_positions_scale_olssons_to_the_context():
    assert icl_positions(512) == (49, 499) and icl_positions(128) == (11, 124) and icl_positions(16) == (1, 15)


def test_the_phase_change_is_the_steepest_rise_and_fall():
    steps = [0, 100, 200, 300, 400]
    assert steepest(steps, [0.0, 0.05, 0.6, 0.7, 0.72]) == 150
    assert steepest(steps, [0.0, -0.1, -0.2, -1.5, -1.6], rise=False) == 250
    heads = [{"induction": [[0.0, a]], **{k: [[0.0, 0.0]] for k in ("previous_token", "first_token",
                                                                       "duplicate_token", "local")}}
             for a in (0.0, 0.05, 0.6, 0.7, 0.72)]
    records = [{"iter": s, "icl": i, "heads": h} for s, i, h in zip(steps, [0, -0.1, -0.2, -1.5, -1.6], heads)]
    assert phase_change(records) == {"induction_iter": 150, "icl_iter": 250, "layer": 0, "head": 1}


# ----------------------------------------------------------------------------- snapshots


def test_snapshots_stay_log_spaced_however_long_the_run():
    kept = []
    for step in [0, 1, 2, 4, 8, 16, 32, 64, *range(100, 5001, 100)]:
        kept.append(step)
        while len(kept) > 5:
            kept.pop(crowded(kept))
    gaps = [math.log1p(b) - math.log1p(a) for a, b in zip(kept, kept[1:])]
    assert kept[0] == 0 and kept[-1] == 5000 and max(gaps) < 3 * min(gaps), kept


def test_a_snapshot_opens_in_every_tool(timed_run, tmp_path):
    from gptkit.interp.experiments import open_run

    kept = sorted(int(p.stem[5:]) for p in (timed_run / "snapshots").glob("iter_*.pt"))
    assert len(kept) == 4 and kept[0] == 0 and kept[-1] == 30
    step = kept[1]
    assert open_run(timed_run, checkpoint=f"iter:{step}").model is not None
    check_ok(run_here("sample.py", f"--out_dir={timed_run}", f"--checkpoint=iter:{step}", "--num_samples=1",
                      "--max_new_tokens=5", "--device=cpu"))
    check_ok(run_here("plot.py", "attention", f"--out_dir={timed_run}", f"--checkpoint=iter:{step}",
                      f"--output={tmp_path / 'a.png'}", "--start=AB"))
    proc = run_here("sample.py", f"--out_dir={timed_run}", "--checkpoint=iter:7", "--device=cpu")
    assert_one_error_line(proc.stderr, f"error: {timed_run} keeps no snapshot of iteration 7; it keeps "
                                       f"{', '.join(f'iter:{i}' for i in kept)}")


def test_a_damaged_snapshot_is_one_line(timed_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(timed_run, out)
    path = out / "snapshots" / "iter_30.pt"
    blob = bytearray(path.read_bytes())
    blob[-100] ^= 0xFF
    path.write_bytes(bytes(blob))
    line = assert_one_error_line(run_here("analyze.py", "heads", out, "--checkpoint=iter:30").stderr)
    assert str(path) in line and "damaged" in line


@pytest.mark.parametrize("args, expected", [
    (["--snapshots=-1"], "error: snapshots must be at least 0 (got -1)"),
    (["--snapshots=many"], "error: command line: snapshots must be int, got 'many'"),
])
def test_a_bad_snapshots_setting_is_one_line(data_dir, tmp_path, args, expected):
    assert_one_error_line(run_here("train.py", *train_args(data_dir, tmp_path / "o", *args)).stderr, expected)


# ----------------------------------------------------------------------------- analyze.py timeline


def test_analyze_timeline_prints_a_table_draws_the_picture_and_answers_json(timed_run, tmp_path):
    from test_plot import assert_png

    picture = tmp_path / "t.png"
    proc = check_ok(run_here("analyze.py", "timeline", timed_run, f"--output={picture}"))
    assert "no induction head formed (the strongest, " in proc.stdout  # 30 steps: none, so no phase change
    assert_png(picture)
    answer = json.loads(check_ok(run_here("analyze.py", "timeline", timed_run, "--json",
                                          f"--output={picture}")).stdout)
    assert [s["iter"] for s in answer["steps"]] == [0, 1, 2, 4, 8, 10, 20, 30]
    assert set(answer["phase_change"]) == {"induction_iter", "icl_iter", "layer", "head"}
    assert set(answer["steps"][-1]["heads"][0]) == {"layer", "head", "previous_token", "first_token",
                                                     "duplicate_token", "induction", "local"}
    assert answer["steps"][-1]["val_loss"] is not None and answer["steps"][1]["val_loss"] is None


def test_a_run_without_a_timeline_or_without_attention_is_one_line(timed_run, tmp_path, data_dir):
    old = tmp_path / "old"
    shutil.copytree(timed_run, old)
    lines = (old / "metrics.jsonl").read_text().splitlines(keepends=True)
    (old / "metrics.jsonl").write_text("".join(line for line in lines if '"timeline"' not in line))
    assert_one_error_line(run_here("analyze.py", "timeline", old).stderr,
                          f"error: {old} has no timeline: it was trained before runs recorded one*")
    bigram = tmp_path / "bigram"
    proc = check_ok(run_here("train.py", *train_args(data_dir, bigram, "--n_layer=0", "--max_iters=4",
                                                     "--eval_interval=2", "--eval_iters=1")))
    assert proc.stdout.count("timeline: this model has no attention") == 1
    assert_one_error_line(run_here("analyze.py", "timeline", bigram).stderr,
                          f"error: {bigram}'s model has no attention (a bigram table)*")
    records = timeline(bigram)
    assert records and all("heads" not in t for t in records)
    assert torch.tensor([t["icl"] for t in records]).isfinite().all()


def test_a_run_started_over_moves_the_old_runs_snapshots_aside(timed_run, tmp_path, data_dir):
    """A fresh run into a folder with another run's snapshots moves them aside with its other files: the new run's
    snapshots are its own, never thinned together with the old run's."""
    out = tmp_path / "run"
    shutil.copytree(timed_run, out)
    train.main(train_args(data_dir, out, *SHORT, "--max_iters=12", "--snapshots=2", "--start_over=True"))
    aside = next(out.glob("replaced-*"))
    assert sorted(p.name for p in (aside / "snapshots").iterdir()) == \
        sorted(p.name for p in (timed_run / "snapshots").iterdir())
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["iter_0.pt", "iter_12.pt"]


def test_the_table_names_the_phase_change_only_where_an_induction_head_formed():
    import analyze

    def step(i, score):
        row = {"layer": 1, "head": 0, "previous_token": 0.0, "first_token": 0.0, "duplicate_token": 0.0,
               "induction": score, "local": 0.0}
        return {"iter": i, "val_loss": None, "icl": 0.0, "heads": [row]}
    phase = {"induction_iter": 150, "icl_iter": 160, "layer": 1, "head": 0}
    formed = analyze.timeline_table([step(0, 0.05), step(300, 0.7)], phase)
    assert formed.endswith("the phase change: the strongest induction head, L1H0, rose fastest at step 150; the "
                           "in-context learning score fell fastest at step 160 (docs/analysis.md#python-analyzepy-"
                           "timeline defines both)")
    assert analyze.timeline_table([step(0, 0.05), step(300, 0.1)], phase).endswith(
        "no induction head formed (the strongest, L1H0, ends at 0.10, below 0.3): no phase change to locate")
