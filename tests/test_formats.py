"""gptkit/run/formats.py: a checkpoint of an earlier format is brought to the current one as it loads, and a run
saved in it resumes as it would have."""

import train
from gptkit.run import checkpoint
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.run.formats import CHECKPOINT_FORMAT, upgraded_checkpoint


def format_1_state(run, monkeypatch, **drop):
    """The run's latest.pt rewritten as an early format-1 file: its time spent as loop_seconds, and without
    best_iter, global_batch, wandb_id and measured."""
    ckpt = load_checkpoint(run / "latest.pt")
    ckpt["loop_seconds"] = ckpt.pop("seconds_spent")
    for key in ("best_iter", "global_batch", "wandb_id", "measured", "format_version"):
        ckpt.pop(key)
    monkeypatch.setattr(checkpoint, "CHECKPOINT_FORMAT", 1)
    save_checkpoint(ckpt, run / "latest.pt")
    monkeypatch.undo()
    return ckpt


def test_an_early_format_1_state_loads_as_the_current_format(run, monkeypatch):
    written = format_1_state(run, monkeypatch)
    ckpt = load_checkpoint(run / "latest.pt")
    assert ckpt["format_version"] == CHECKPOINT_FORMAT == 2
    assert ckpt["seconds_spent"] == written["loop_seconds"] and "loop_seconds" not in ckpt
    assert (ckpt["best_iter"], ckpt["wandb_id"], ckpt["measured"]) == (0, None, {})
    config = ckpt["config"]
    assert ckpt["global_batch"] == config["batch_size"] * max(1, config["gradient_accumulation_steps"])
    weights = load_checkpoint(run / "best.pt")  # a model file keeps its fields: nothing a resume reads
    assert weights["format_version"] == 2 and "seconds_spent" not in weights


def test_a_run_saved_in_format_1_resumes_and_saves_the_current_format(run, data_dir, monkeypatch, capsys):
    format_1_state(run, monkeypatch)
    train.main([f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}", "--init_from=resume",
                "--max_iters=32"])
    assert "resuming from iteration 30 of 32" in capsys.readouterr().out
    ckpt = load_checkpoint(run / "latest.pt")
    assert ckpt["iter_num"] == 32 and ckpt["format_version"] == 2 and ckpt["seconds_spent"] > 0


def test_a_format_1_state_saved_by_two_processes_took_their_batches_together():
    state = {"format_version": 1, "iter_num": 3, "optimizer": [], "rng": [{}, {}],
             "config": {"batch_size": 4, "gradient_accumulation_steps": 1}}
    assert upgraded_checkpoint(state)["global_batch"] == 8


def test_the_current_format_is_left_as_it_is():
    state = {"format_version": 2, "iter_num": 3, "optimizer": [], "seconds_spent": 1.0}
    assert upgraded_checkpoint(dict(state)) == state
