"""Ending a fine-tune by its score (gptkit/training/score_stop.py, train.py's stop_task and stop_pass_at_1): the run
ends at the first evaluation whose held-out pass@1 reaches the aim, a resume of it has nothing to do until the aim
is raised, scoring leaves the training as it would have been, and a task it cannot score is one line."""

import pytest
import torch

import train
from conftest import CHAT_SFT, assert_one_error_line, logged, run_here
from gptkit.chat.scoring import score
from gptkit.run.checkpoint import load_checkpoint
from gptkit.training import score_stop
from gptkit.training.score_stop import ScoreStop


def fine_tune(base, chat_data, out, *extra):
    return [f"--init_from={base}", f"--out_dir={out}", f"--data_dir={chat_data}", *CHAT_SFT, *extra]


def test_the_run_ends_at_the_first_evaluation_that_reaches_the_aim_and_a_resume_waits_for_a_higher_one(
        tmp_path, trained_run, chat_data, monkeypatch, capsys):
    figures = iter([0.25, 0.5, 0.5, 0.75])  # at steps 3 and 6, then the resumed run's 9 and 12
    monkeypatch.setattr(ScoreStop, "pass_at_1", lambda self, state: next(figures))
    out = tmp_path / "out"
    args = fine_tune(trained_run[0], chat_data, out, "--max_iters=30", "--stop_task=addition",
                     "--stop_pass_at_1=0.5")
    train.main(args)
    said = capsys.readouterr().out
    assert "step 3: addition held-out pass@1 25.0% (the run ends at 50%)" in said
    assert "step 6: addition held-out pass@1 50.0%, at least stop_pass_at_1 (50%): the run ends here" in said
    latest = load_checkpoint(out / "latest.pt")
    assert latest["iter_num"] == 6 and latest["stopped_by_score"] == dict(task="addition", pass_at_1=0.5, iter=6)
    assert logged(out, "task_eval", "pass_at_1") == {3: 0.25, 6: 0.5}
    assert logged(out, "final", "val_loss").keys() == {6}

    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "run.lock"}
    train.main([*args, "--init_from=auto"])
    assert "nothing to do: raise --stop_pass_at_1, or give --stop_task=''" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "run.lock"} == files

    train.main([*args, "--init_from=auto", "--stop_pass_at_1=0.7"])
    latest = load_checkpoint(out / "latest.pt")
    assert latest["iter_num"] == 12 and latest["stopped_by_score"]["pass_at_1"] == 0.75


def test_scoring_at_each_evaluation_scores_the_checkpoints_weights_and_leaves_the_training_as_it_was(
        tmp_path, trained_run, chat_data, monkeypatch):
    """The held-out answers come from the weights the checkpoint keeps (the weight average), drawn in eval mode from
    a generator of their own: the run trains the same weights as one that never scores (dropout on, so that a mode
    left in eval would show)."""
    scored_weights = []

    def scoring(model, *args):
        scored_weights.append({k: v.clone() for k, v in model.state_dict().items()})
        return score(model, *args)

    monkeypatch.setattr(score_stop, "score", scoring)
    plain, scored = tmp_path / "plain", tmp_path / "scored"
    for out, extra in ((plain, []), (scored, ["--stop_task=addition", "--stop_pass_at_1=1.0"])):
        train.main(fine_tune(trained_run[0], chat_data, out, "--dropout=0.2", "--ema_decay=0.5", *extra))
    assert len(logged(scored, "task_eval", "pass_at_1")) == len(scored_weights) == 2
    a, b = load_checkpoint(plain / "latest.pt"), load_checkpoint(scored / "latest.pt")
    for weights in ("model", "trained"):
        for key, value in a[weights].items():
            assert torch.equal(value, b[weights][key]), (weights, key)
    assert all(torch.equal(v, scored_weights[-1][k]) for k, v in b["model"].items())
    assert not all(torch.equal(v, scored_weights[-1][k]) for k, v in b["trained"].items())


@pytest.mark.parametrize("extra, expected", [
    (["--stop_task=sort"], "holds held-out problems of addition, reverse; stop by one of those"),
    (["--stop_task=adition"], "stop_task must be one of addition, addition_reversed, reverse, sort (got 'adition'; "
                              "did you mean 'addition'?)"),
    (["--stop_task=addition", "--max_time=60"], "stop_task ends the run by its score, max_time by a number of steps "
                                                "planned in advance: give one of them"),
])
def test_an_aim_the_run_cannot_score_is_one_line_before_it_trains(tmp_path, trained_run, chat_data, extra, expected):
    proc = run_here("train.py", *fine_tune(trained_run[0], chat_data, tmp_path / "out", *extra))
    assert proc.returncode == 1
    assert expected in assert_one_error_line(proc.stderr)
    assert not (tmp_path / "out").exists()
