"""A run's timeline and snapshots (gptkit/interp/timeline.py, gptkit/training/snapshots.py, analyze.py timeline):
the record's head scores are analyze.py heads' on the weights of that step, a resumed run's timeline is the
uninterrupted one's, snapshots stay log-spaced and open in every tool, and each mistake is one line."""

import json
import math
import shutil

import pytest
import torch

import train
from conftest import Run, assert_one_error_line, check_ok, faulty_train, logged, run_here, train_args, train_cmd
from gptkit.base.errors import UserError
from gptkit.interp.timeline import icl_positions, phase_change, steepest, timeline_of, travelled, why_no_timeline
from gptkit.run.metrics import read_metrics
from gptkit.run.run_folder import RunDir
from gptkit.training.snapshots import crowded

SHORT = ["--max_iters=30", "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--n_layer=2"]


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory, data_dir):
    """A 30-step run of a 2-layer model keeping 4 snapshots, in this process."""
    out = tmp_path_factory.mktemp("timeline") / "out"
    train.main(train_args(data_dir, out, *SHORT, "--snapshots=4"))
    return out


def test_a_resume_that_keeps_fewer_snapshots_than_the_run_holds_is_one_line_and_deletes_none(timed_run, tmp_path,
                                                                                            data_dir):
    """--snapshots=1 read as "one more": its next record would have deleted all but one, unsaid."""
    out = tmp_path / "out"
    shutil.copytree(timed_run, out)
    kept = sorted(p.name for p in (out / "snapshots").iterdir())
    with pytest.raises(UserError, match=rf"^--snapshots=1 is fewer than the {len(kept)} snapshots {out} keeps \("):
        train.main(train_args(data_dir, out, *SHORT, "--snapshots=1", "--init_from=auto", "--max_iters=40"))
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == kept


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


def test_a_resumed_runs_timeline_is_the_uninterrupted_ones(tmp_path, data_dir, capsys):
    """A snapshot of a step past the state resumed from (a later run's, stopped before its state was saved) is
    trained again: it goes, and a note names it."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train.main(train_args(data_dir, straight, *SHORT, "--snapshots=3"))
    script = faulty_train(tmp_path, signal=("SIGTERM", 14, [0]))
    proc = Run(train_cmd(data_dir, stopped, *SHORT, "--snapshots=3", script=script), tmp_path / "log")
    assert proc.wait() == 143
    shutil.copy(next((stopped / "snapshots").iterdir()), stopped / "snapshots" / "iter_99.pt")
    capsys.readouterr()
    train.main(train_args(data_dir, stopped, *SHORT, "--snapshots=3", "--init_from=auto"))
    assert "note: dropped the snapshots of steps past 14, which this run trains again: iter_99.pt\n" in \
        capsys.readouterr().out
    def numbers(out):  # each record but the seconds it was written at
        return [{k: v for k, v in t.items() if k != "elapsed_s"} for t in timeline(out)]
    assert numbers(stopped) == numbers(straight)
    assert sorted(p.name for p in (stopped / "snapshots").iterdir()) == \
        sorted(p.name for p in (straight / "snapshots").iterdir())


def test_a_run_records_its_start_and_its_end_whatever_its_records_cost(tmp_path, data_dir, monkeypatch):
    """Records that no share of the run's time affords (records.RECORD_SHARE 0) leave the start and the end: the
    timeline's records and the snapshots of steps 0 and 30 alone."""
    monkeypatch.setattr("gptkit.training.records.RECORD_SHARE", 0.0)
    out = tmp_path / "out"
    train.main(train_args(data_dir, out, *SHORT, "--snapshots=4"))
    assert [t["iter"] for t in timeline(out)] == [0, 30]
    assert RunDir(out).kept_snapshots() == [0, 30]


def test_records_never_change_what_trains(timed_run, tmp_path, data_dir):
    """The same run without a timeline or snapshots trains the same: every loss logged, evaluated and scored at the
    end is the one the run with all its records logged."""
    bare = tmp_path / "bare"
    train.main(train_args(data_dir, bare, *SHORT, "--timeline=False"))
    assert not timeline(bare) and not (bare / "snapshots").exists()
    for kind, field in (("train", "loss"), ("eval", "val_loss"), ("eval", "train_loss"), ("final", "val_loss")):
        assert logged(bare, kind, field) == logged(timed_run, kind, field), (kind, field)


def test_snapshots_are_kept_without_a_timeline_which_is_said_to_be_off(tmp_path, data_dir):
    out = tmp_path / "out"
    train.main(train_args(data_dir, out, *SHORT, "--timeline=False", "--snapshots=3"))
    assert RunDir(out).kept_snapshots()[::2] == [0, 30] and len(RunDir(out).kept_snapshots()) == 3
    assert not timeline(out)
    assert_one_error_line(run_here("analyze.py", "timeline", out).stderr,
                          f"error: {out} has no timeline: it was trained with --timeline=False; train it again to "
                          "record one")


def test_a_run_without_a_timeline_is_said_why():
    again = "; train it again to record one"
    assert why_no_timeline([{"kind": "run", "timeline": False}]) == "it was trained with --timeline=False" + again
    assert why_no_timeline([{"kind": "run", "timeline": True}]) == "it stopped before its first record" + again
    assert why_no_timeline([{"kind": "run"}]).startswith("it was trained before runs recorded one")
    assert why_no_timeline([{"kind": "rl", "iter": 1, "reward": 0.5}]) == (
        "it is an rl.py run, which records none; the run it started from (its init_from) may hold one")


def test_icl_positions_scale_olssons_to_the_context():
    assert icl_positions(512) == (49, 499) and icl_positions(128) == (11, 124) and icl_positions(16) == (1, 15)


def test_the_phase_change_is_the_steepest_rise_and_fall():
    steps = [0, 100, 200, 300, 400]
    assert steepest(steps, [0.0, 0.05, 0.6, 0.7, 0.72]) == 150
    assert steepest(steps, [0.0, -0.1, -0.2, -1.5, -1.6], rise=False) == 250
    # config/induction.py's records: the in-context score's noise between steps 0 and 1 is no fall
    early = [0, 1, 2, 25, 75, 100, 150, 200, 250, 300, 350]
    icl = [0.013, -0.023, -0.023, -0.008, -0.048, 0.013, -0.034, -0.135, -1.014, -0.935, -0.923]
    assert steepest(early, icl, rise=False) == 225
    heads = [{"induction": [[0.0, a]], **{k: [[0.0, 0.0]] for k in ("previous_token", "first_token",
                                                                       "duplicate_token", "local")}}
             for a in (0.0, 0.05, 0.6, 0.7, 0.72)]
    records = [{"iter": s, "icl": i, "heads": h} for s, i, h in zip(steps, [0, -0.1, -0.2, -1.5, -1.6], heads)]
    assert phase_change(records) == {"formed": True, "layer": 0, "head": 1, "score": 0.72, "induction_iter": 150,
                                     "icl_iter": 250, "note": None}


def test_a_phase_change_is_marked_only_where_an_induction_head_formed():
    """Issue 64's run: its strongest induction head, L0H0, rose fastest around step 3 and ends at 0.03. Scores that
    stayed near chance moved somewhere fastest too; that is no phase change, and none is marked. Nor is one marked
    from a single record, or in a model without attention."""
    flat = timeline_records(0.03)
    assert phase_change(flat) == {
        "formed": False, "layer": 0, "head": 0, "score": 0.03, "induction_iter": None, "icl_iter": None,
        "note": "no induction head formed (the strongest, L0H0, ends at 0.03, below 0.3): no phase change to locate"}
    assert phase_change(timeline_records(0.8)) | {"score": None} == {
        "formed": True, "layer": 0, "head": 0, "score": None, "induction_iter": 3, "icl_iter": 3, "note": None}
    alone = phase_change(timeline_records(0.8)[-1:])
    assert alone["formed"] and alone["induction_iter"] is None and "a single record cannot tell" in alone["note"]
    bigram = phase_change([{k: v for k, v in t.items() if k != "heads"} for t in flat])
    assert bigram["icl_iter"] is None and bigram["note"].startswith("no head scores in this timeline (a model "
                                                                   "without attention, or attention that passes no ")
    assert phase_change([]) is None


# ----------------------------------------------------------------------------- snapshots


def test_snapshots_stay_log_spaced_however_long_the_run():
    kept = []
    for step in [0, 1, 2, 4, 8, 16, 32, 64, *range(100, 5001, 100)]:
        kept.append(step)
        while len(kept) > 5:
            kept.pop(crowded(kept))
    gaps = [math.log1p(b) - math.log1p(a) for a, b in zip(kept, kept[1:])]
    assert kept[0] == 0 and kept[-1] == 5000 and max(gaps) < 3 * min(gaps), kept


def test_snapshots_gather_where_the_timeline_moves_fastest():
    """Issue 65: the induction run's records (steps 1, 2, 4, ... 32, then every 50), its heads forming between steps
    175 and 250. Thinned on a log scale alone, 8 snapshots kept 150 and then 500; spread along the timeline too, the
    kept ones pass through the change."""
    def record(step):
        formed = 1 / (1 + math.exp(-(step - 210) / 15))  # the induction score's rise, and the loss's fall with it
        return {"iter": step, "icl": -formed, "loss_by_position": [3.3 - formed - step / 3000] * 8,
                "heads": {"induction": [[0.05], [0.05 + 0.7 * formed]]}}
    records, kept, log_only = [], [], []
    for step in [0, 1, 2, 4, 8, 16, 32, *range(50, 3001, 50)]:
        records.append(record(step))
        along = travelled(records)
        for ours, spread in ((kept, along), (log_only, None)):
            ours.append(step)
            while len(ours) > 8:
                ours.pop(crowded(ours, spread))
    assert [s for s in log_only if 150 <= s <= 500] == [150, 500]
    assert kept[0] == 0 and kept[-1] == 3000 and {200, 250} <= set(kept) and 150 not in kept, kept  # 50 before it


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
    assert answer["phase_change"] == phase_change(timeline(timed_run)) and answer["left_out"] == []
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
                          f"error: {bigram}'s timeline has no head scores to follow: its model has no attention (a "
                          "bigram table)*")
    records = timeline(bigram)
    assert records and all("heads" not in t for t in records)
    assert torch.tensor([t["icl"] for t in records]).isfinite().all()


def test_a_run_started_over_moves_the_old_runs_snapshots_and_pictures_aside(timed_run, tmp_path, data_dir):
    """A fresh run into a folder with another run's snapshots moves them aside with its other files: the new run's
    snapshots are its own, never thinned together with the old run's; and so the pictures drawn of the old run."""
    out = tmp_path / "run"
    shutil.copytree(timed_run, out)
    for name in ("timeline.png", "loss.png", "heads.png"):
        (out / name).write_bytes(b"the old run's picture")
    train.main(train_args(data_dir, out, *SHORT, "--max_iters=12", "--snapshots=2", "--start_over=True"))
    aside = next(out.glob("replaced-*"))
    assert sorted(p.name for p in (aside / "snapshots").iterdir()) == \
        sorted(p.name for p in (timed_run / "snapshots").iterdir())
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["iter_0.pt", "iter_12.pt"]
    for name in ("timeline.png", "loss.png", "heads.png"):
        assert not (out / name).exists() and (aside / name).read_bytes() == b"the old run's picture"


def test_a_timeline_without_head_scores_is_not_called_a_bigram_s(tmp_path):
    """A run whose attention is the learner's own (the notes' MultiHeadAttention, or an averaging loop past
    self.hook_pattern) records its timeline without head scores, saying why as it trains: analyze.py timeline
    called its model 'no attention (a bigram table)'."""
    import analyze

    records = [{"kind": "run", "iter": 0, "timeline": True}] + [
        {"kind": "timeline", "iter": i, "icl": -0.1, "loss_by_position": [3.0] * 8} for i in (0, 1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.raises(UserError) as e:
        analyze.main(["timeline", str(tmp_path)])
    assert str(e.value) == (f"{tmp_path}'s timeline has no head scores to follow: its model has no attention (a "
                            "bigram table), or its attention passes no hook point the records read (its run named it "
                            "as it trained)")


def test_the_table_names_the_phase_change_only_where_an_induction_head_formed():
    import analyze

    def table(end):
        records = timeline_records(end)
        return analyze.timeline_table(analyze.timeline_steps(records), phase_change(records))
    assert table(0.7).endswith("the phase change: the strongest induction head, L0H0, rose fastest at step 3; the "
                               "in-context learning score fell fastest at step 3 (docs/analysis.md#python-analyzepy-"
                               "timeline defines both)")
    assert table(0.1).endswith("no induction head formed (the strongest, L0H0, ends at 0.10, below 0.3): no phase "
                               "change to locate")


STEPS = (0, 1, 2, 4, 8, 10, 20, 30)
RISE = (0.0, 0.0, 0.1, 1.0, 1.0, 1.0, 1.0, 1.0)  # the share of its end L0H0's score has reached: fastest from 2 to 4


def timeline_records(end, layers=2, heads=4):
    """Whole timeline records, as train.py writes them, of a model whose L0H0's induction score rises to end, fastest
    between steps 2 and 4, the in-context learning score falling with it, every other score 0."""
    from gptkit.interp.experiments import KINDS

    records = []
    for step, rise in zip(STEPS, RISE):
        grids = {kind: [[0.0] * heads for _ in range(layers)] for kind in KINDS}
        grids["induction"][0][0] = round(end * rise, 4)
        records.append({"kind": "timeline", "iter": step, "icl": round(-0.5 * rise, 4), "loss_by_position": [3.0] * 8,
                        "heads": grids})
    return records


def synthetic_run(folder, end, edit=lambda lines: lines):
    """A run folder as analyze.py and the explorer read it, written in a moment: a tiny model's best.pt (2 layers of
    4 heads) and a metrics.jsonl of timeline_records(end) and an evaluation at steps 0, 10, 20 and 30, its lines
    passed through edit."""
    from test_analyze import saved_run

    saved_run(folder)
    lines = []
    for t in timeline_records(end):
        if t["iter"] % 10 == 0:
            lines.append(json.dumps({"kind": "eval", "iter": t["iter"], "train_loss": 3.0,
                                     "val_loss": 3.0 - t["iter"] / 100, "elapsed_s": 1.0 + t["iter"]}))
        lines.append(json.dumps({**t, "elapsed_s": 1.0 + t["iter"]}))
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in edit(lines)), encoding="utf-8")
    return folder


def test_analyze_timeline_and_the_explorer_agree_on_the_phase_change(tmp_path, capsys):
    """Issue 64: one rule, phase_change, decides whether a phase change happened and where, for analyze.py timeline
    and the explorer's Over training panel alike: on a run whose strongest induction head ends at 0.03 neither
    marks one (the explorer marked L0H0's steepest rise, around step 3), and on one whose head formed both mark the
    same steps."""
    import analyze
    from gptkit.explorer.runs import summarize
    from gptkit.explorer.timeline_answers import timeline_report

    for name, end in (("flat", 0.03), ("formed", 0.8)):
        out = synthetic_run(tmp_path / name, end)
        analyze.main(["timeline", str(out), "--json", f"--output={tmp_path / name}.png"])
        said = json.loads(capsys.readouterr().out)["phase_change"]
        shown = timeline_report(summarize(name, out))["phase"]
        assert said == shown == phase_change(timeline(out)), name
        assert said["induction_iter"] == (None if end < 0.3 else 3) and said["layer"] == said["head"] == 0


def strict(text):
    """JSON as a strict reader takes it: NaN and Infinity refused."""
    return json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} in the JSON"))


def hand_edited(lines):
    """Issue 65's edits of metrics.jsonl, each to one timeline record (of steps 1, 2, 4, 8 and 10: lines 3 to 8),
    one of NaN (line 13); and the evaluation at step 20 logging NaN, as a run that diverged logs it."""
    edits = [lambda t: t.pop("icl"), lambda t: t.update(icl="0.5"), lambda t: t.update(heads=[[0.1]]),
             lambda t: t["heads"]["local"][1].append(0.2), lambda t: t["heads"]["induction"][0].__setitem__(0, 1.5)]
    out, records = lines[:2], [json.loads(line) for line in lines[2:]]
    for record, edit in zip([r for r in records if r["kind"] == "timeline"], edits):
        edit(record)
    out += [json.dumps(r) for r in records]
    out += ['{"kind": "timeline", "iter": 40, "icl": NaN, "loss_by_position": [1.0], "heads": null}']
    return [line.replace('"val_loss": 2.8,', '"val_loss": NaN,') for line in out]


def test_hand_edited_records_are_left_out_in_one_line_and_the_json_stays_strict(tmp_path, capsys):
    """Each timeline record not as train.py writes it (a field missing, text where a number goes, a list where a
    dict goes, a grid not of the run's shape, a score outside 0 to 1, NaN) is left out, one line on stderr naming
    each line and why; the table and the picture come from the rest, and --json holds no NaN: the diverged
    evaluation's val loss is null, with its note beside it."""
    import analyze

    out = synthetic_run(tmp_path / "run", 0.8, hand_edited)
    picture = tmp_path / "t.png"
    analyze.main(["timeline", str(out), f"--output={picture}"])
    text = capsys.readouterr()
    assert "the phase change: the strongest induction head, L0H0" in text.out
    assert text.err.count("\n") == 1 and text.err.startswith(
        f"note: left out 6 timeline records of {out / 'metrics.jsonl'} that train.py would not write (line 3: it has "
        "no icl; line 4: icl is '0.5', not a number; line 5: heads is [[0.1]], not each kind's scores; ...)")
    analyze.main(["timeline", str(out), "--json", f"--output={picture}"])
    answer = strict(capsys.readouterr().out)
    assert [s["iter"] for s in answer["steps"]] == [0, 20, 30]
    assert answer["steps"][1]["val_loss"] is None and "nan" in answer["steps"][1]["val_loss_note"]
    left = [(r["line"], r["why"]) for r in answer["left_out"]]
    assert [line for line, _ in left] == [3, 4, 5, 6, 8, 13] and left[3][1].startswith("heads' local is [[0.0,")
    assert left[3][1].endswith("not a grid of scores") and left[4:] == [(8, "induction is 1.5, outside 0 to 1"),
                                                                         (13, "icl is nan, not a finite number")]
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in hand_edited([])[-1:]))
    with pytest.raises(UserError, match=r"has no timeline: no whole record: left out 1 timeline record of .*\(line 1: "
                                        r"icl is nan, not a finite number\); train it again to record one$"):
        analyze.main(["timeline", str(out), f"--output={picture}"])
