"""rl.py: a run stopped by a signal continues to the weights of one never stopped; a model never right is one
line before anything is written; a task the run never saw, a start from a folder without a run and an out_dir
holding train.py's run are each one line."""

import os
import shutil
import signal
import sys

import pytest
import torch

from conftest import assert_one_error_line, run_here
from gptkit.base.errors import RunStopped, UserError
from gptkit.data.tasks import TASKS
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.metrics import read_metrics
from gptkit.run.run_folder import RunDir

SMALL = ["--problems_per_step=2", "--samples=4", "--max_iters=4", "--eval_interval=2", "--eval_problems=3",
         "--eval_samples=2", "--max_new_tokens=4", "--device=cpu", "--learning_rate=1e-2"]


def rl_args(chat_run, out):
    return [f"--init_from={chat_run}", f"--out_dir={out}", *SMALL]


@pytest.mark.parametrize("again", ["the same command", "out_dir alone"])
def test_a_stopped_run_continues_to_the_weights_of_one_never_stopped(again, tmp_path, chat_run, monkeypatch, capsys):
    """Continued by the same command, or by --out_dir alone: the run keeps the settings it saved, as train.py's do."""
    import rl

    # a reward the tiny model earns about half the time, so that every step learns something
    monkeypatch.setattr(rl, "reward", lambda tok, task, question, answer: float(sum(answer) % 2))
    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    rl.main(rl_args(chat_run, tmp_path / "whole"))
    step = rl.step

    def stopped_at_3(cfg, s):  # a scheduler's SIGTERM during step 3
        if s["state"].iter_num == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(cfg, s)

    monkeypatch.setattr(rl, "step", stopped_at_3)
    with pytest.raises(RunStopped, match="at step 3"):
        rl.main(rl_args(chat_run, tmp_path / "half"))
    monkeypatch.setattr(rl, "step", step)
    capsys.readouterr()
    rl.main(rl_args(chat_run, tmp_path / "half") if again == "the same command" else [f"--out_dir={tmp_path / 'half'}"])
    assert f"continuing the RL run in {tmp_path / 'half'} from step 3 of 4\n" in capsys.readouterr().out
    whole, resumed = load_checkpoint(tmp_path / "whole" / "latest.pt"), load_checkpoint(tmp_path / "half" / "latest.pt")
    assert whole["iter_num"] == resumed["iter_num"] == 4
    assert any(not torch.equal(v, load_checkpoint(chat_run / "best.pt")["model"][k]) for k, v in whole["model"].items())
    for key, value in whole["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    assert {r["kind"] for r in read_metrics(tmp_path / "whole")} >= {"rl", "rl_eval"}  # plot.py's, the explorer's


BAD_STARTS = {"never right": "'s answers to addition's 3 held-out problems was right: with no reward REINFORCE has "
                             "nothing to learn from", "unknown task": "never saw task 'sort'",
              "no run": "holds no run: fine-tune one there first, e.g. `python train.py config/chat_sft_early.py",
              "no snapshots": "keeps no snapshots (train it with --snapshots=N to keep the weights at N steps); use "
                              "--init_checkpoint=best or latest",
              "not yet evaluated": "not finished an evaluation); use its latest state with --init_checkpoint=latest",
              "a checkpoint file": "is a file, not a run's folder: give the folder train.py wrote (--init_from="}


@pytest.mark.parametrize("case", BAD_STARTS)
def test_bad_starts_are_one_line_and_write_nothing(case, tmp_path, chat_run, monkeypatch):
    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: False)
    (tmp_path / "empty").mkdir()
    unevaluated = tmp_path / "unevaluated"  # a fine-tune that has not reached its first evaluation: no best.pt
    unevaluated.mkdir()
    shutil.copy(chat_run / "latest.pt", unevaluated)
    extra = {"unknown task": ["--tasks=sort"], "no run": [f"--init_from={tmp_path / 'empty'}"],
             "no snapshots": [f"--init_from={unevaluated}", "--init_checkpoint=iter:7"],
             "not yet evaluated": [f"--init_from={unevaluated}"],
             "a checkpoint file": [f"--init_from={unevaluated / 'latest.pt'}"]}.get(case, [])
    proc = run_here("rl.py", *rl_args(chat_run, tmp_path / "out"), *extra)
    assert proc.returncode == 1
    assert BAD_STARTS[case] in assert_one_error_line(proc.stderr)
    assert not (tmp_path / "out").exists()


def test_a_continued_run_says_each_setting_it_takes_anew(tmp_path, chat_run, monkeypatch, capsys):
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    capsys.readouterr()
    rl.main([f"--out_dir={tmp_path / 'out'}", "--max_iters=3", "--learning_rate=1e-3"])
    assert (f"continuing the RL run in {tmp_path / 'out'} from step 2 of 3; max_iters 2 → 3; learning_rate 0.01 → "
            "0.001\n") in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "out" / "latest.pt")["optimizer"][0]["param_groups"][0]["lr"] == 1e-3
    with pytest.raises(UserError, match=r"keeps no snapshots \(rl\.py keeps none\); use --checkpoint=best or latest$"):
        RunDir(tmp_path / "out").snapshot_file(2)  # chat.py --checkpoint=iter:2 on it
    rl.main([f"--out_dir={tmp_path / 'out'}", "--max_iters=2"])  # past it: finished, said once, nothing continues
    assert capsys.readouterr().out == (f"the RL run in {tmp_path / 'out'} is finished (3 steps, max_iters 2); raise "
                                       "--max_iters to go on\n")
    with pytest.raises(UserError, match=f"holds an RL run started from init_from={str(chat_run)!r}; continue it "
                                        "without --init_from, or start from 'elsewhere' in another --out_dir "
                                        r"\(or there, with --start_over=True: its files are moved aside\)$"):
        rl.main([f"--out_dir={tmp_path / 'out'}", "--init_from=elsewhere"])  # a new start is a new run


@pytest.mark.parametrize("key, value", [("temperature", "0.5"), ("eval_problems", "2")])
def test_a_continued_run_scored_otherwise_compares_its_best_anew(key, value, tmp_path, chat_run, monkeypatch, capsys):
    """At another temperature, or on other held-out problems, pass@1 measures something else: the next score is
    the best, even a lower one."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    monkeypatch.setattr(rl, "evaluate", lambda cfg, s: {"pass_at_1": 0.5, "accuracy": 0.5})
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    monkeypatch.setattr(rl, "evaluate", lambda cfg, s: {"pass_at_1": 0.25, "accuracy": 0.25})
    capsys.readouterr()
    rl.main([f"--out_dir={tmp_path / 'out'}", "--max_iters=3", f"--{key}={value}"])
    assert (f"note: with {key} changed, held-out pass@1 measures something else from here: best.pt (step 2, "
            "50.0%) was scored otherwise, and the next score replaces it\n") in capsys.readouterr().out
    best = load_checkpoint(tmp_path / "out" / "best.pt")
    assert (best["iter_num"], best["pass_at_1"]) == (3, 0.25)


def test_a_learners_single_optimizer_practises_and_one_sample_scores_pass_at_1(tmp_path, chat_run, monkeypatch):
    """model.py's configure_optimizers may return one optimizer (its docstring's SGD), as train.py takes it; and
    pass@1 from one sampled answer a problem is a score like any other."""
    import rl
    from model import GPT

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    monkeypatch.setattr(GPT, "configure_optimizers", lambda self, cfg, dtype="float32":
                        torch.optim.SGD(self.parameters(), lr=0.1))
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2", "--eval_samples=1"])
    evals = [r for r in read_metrics(tmp_path / "out") if r["kind"] == "rl_eval"]
    assert [r["iter"] for r in evals] == [0, 2] and all(0 <= r["pass_at_1"] <= 1 for r in evals)
    assert load_checkpoint(tmp_path / "out" / "latest.pt")["optimizer"][0]["param_groups"][0]["lr"] == 0.1


@pytest.mark.parametrize("damage, says", [
    (lambda c: c["rl"].update(state=5), "rl.state is 5, not a dict"),
    (lambda c: c["rl"].update(draw=5), "rl.draw is 5, not a torch random state"),
    (lambda c: c.pop("optimizer"), "it has no optimizer")])
def test_a_saved_state_whose_fields_are_not_what_rl_py_writes_is_one_line(tmp_path, chat_run, monkeypatch, damage,
                                                                          says):
    """latest.pt rewritten with a right checksum but fields rl.py never writes (by hand, or damaged before it was
    summed): continuing it is one line naming the field, never a traceback."""
    import rl
    from gptkit.run.checkpoint import save_checkpoint

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    latest = tmp_path / "out" / "latest.pt"
    ckpt = load_checkpoint(latest)
    damage(ckpt)
    save_checkpoint({k: v for k, v in ckpt.items() if k != "format_version"}, latest)
    proc = run_here("rl.py", f"--out_dir={tmp_path / 'out'}", "--max_iters=3")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {latest} is damaged: {says}; the run cannot continue from it: start "
                                       "it anew with --start_over=True (its files are moved aside)")


def test_a_saved_state_cut_short_is_one_line_naming_the_way_on(tmp_path, chat_run, monkeypatch):
    """A first latest.pt cut short (no state saved before it) leaves nothing to continue from, and
    --start_over=True (which moves the run's files aside) is the way on."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    latest = tmp_path / "out" / "latest.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    proc = run_here("rl.py", f"--out_dir={tmp_path / 'out'}", "--max_iters=3")
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr, f"error: {latest} is damaged*")
    assert line.endswith("; the run cannot continue from it: start it anew with --start_over=True (its files are "
                         "moved aside)")
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2", "--start_over=True"])  # the way on, as said
    assert load_checkpoint(latest)["iter_num"] == 2
    assert [p.name for p in (tmp_path / "out").glob("replaced-*/latest.pt")] == ["latest.pt"]


def test_a_damaged_latest_pt_continues_from_the_state_before_it_to_the_same_weights(tmp_path, chat_run, monkeypatch,
                                                                                     capsys):
    """Each save keeps the state it replaces as latest.prev.pt: a latest.pt damaged after the run (a bad disk,
    an edit) costs the steps since the state before it, which the continued run takes again to the same weights;
    with both damaged, one line names them and the way on."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    out = tmp_path / "out"
    rl.main(rl_args(chat_run, out))  # saves at steps 2 and 4
    latest, previous = out / "latest.pt", out / "latest.prev.pt"
    whole = load_checkpoint(latest)
    assert load_checkpoint(previous)["iter_num"] == 2
    latest.write_bytes(latest.read_bytes()[:1000])
    capsys.readouterr()
    rl.main([f"--out_dir={out}"])
    said = capsys.readouterr().out
    assert said.startswith(f"note: {latest} is damaged") and f"; continuing from {previous} (step 2)\n" in said
    assert f"continuing the RL run in {out} from step 2 of 4\n" in said
    for key, value in whole["model"].items():
        assert torch.equal(value, load_checkpoint(latest)["model"][key]), key
    for path in (latest, previous):
        path.write_bytes(path.read_bytes()[:1000])
    proc = run_here("rl.py", f"--out_dir={out}", "--max_iters=5")
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr, f"error: {latest} is damaged*")
    assert f"; {previous} is damaged" in line
    assert line.endswith("; the run cannot continue from either: start it anew with --start_over=True (its files are "
                         "moved aside)")


def test_a_continued_run_whose_best_pt_is_gone_writes_it_anew(tmp_path, chat_run, monkeypatch, capsys):
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    monkeypatch.setattr(rl, "evaluate", lambda cfg, s: {"pass_at_1": 0.5 - s["state"].iter_num / 10, "accuracy": 0.5})
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    (tmp_path / "out" / "best.pt").unlink()
    capsys.readouterr()
    rl.main([f"--out_dir={tmp_path / 'out'}", "--max_iters=4"])
    out = capsys.readouterr().out
    assert "note: best.pt of step 2 is missing; the next score writes it anew\n" in out
    assert load_checkpoint(tmp_path / "out" / "best.pt")["iter_num"] == 4 and "best.pt holds step 4" in out


def test_a_continued_run_names_a_metrics_line_the_pictures_would_refuse(tmp_path, chat_run, monkeypatch, capsys):
    import rl

    monkeypatch.setattr(rl, "evaluate", lambda cfg, s: {"pass_at_1": 0.5, "accuracy": 0.5})
    rl.main([*rl_args(chat_run, tmp_path / "out"), "--max_iters=2"])
    metrics = tmp_path / "out" / "metrics.jsonl"
    metrics.write_text("{damaged\n" + metrics.read_text(encoding="utf-8"), encoding="utf-8")
    capsys.readouterr()
    rl.main([f"--out_dir={tmp_path / 'out'}", "--max_iters=3"])
    assert f"note: {metrics} line 1 is not a record this project writes" in capsys.readouterr().out


def test_an_out_dir_holding_a_train_py_run_is_one_line_and_keeps_its_files(tmp_path, chat_run):
    taken = tmp_path / "taken"
    shutil.copytree(chat_run, taken)
    files = {p.name: p.read_bytes() for p in taken.iterdir() if p.is_file() and p.name != "run.lock"}
    proc = run_here("rl.py", *rl_args(chat_run, taken))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {taken} holds a run of train.py, not of rl.py; pick another --out_dir, "
                                       "or start over there with --start_over=True (its files are moved aside)")
    assert {p.name: p.read_bytes() for p in taken.iterdir() if p.is_file() and p.name != "run.lock"} == files


def test_an_out_dir_that_is_init_from_is_refused_before_anything_moves(tmp_path, chat_run):
    """--start_over=True would move the SFT run aside, leaving nothing to practise from: one line first."""
    taken = tmp_path / "taken"
    shutil.copytree(chat_run, taken)
    kept = sorted(p.name for p in taken.iterdir())
    proc = run_here("rl.py", *rl_args(taken, taken), "--start_over=True")
    assert_one_error_line(proc.stderr, f"error: out_dir and init_from are the same folder, {taken}: RL starts from the "
                                       "run there and practises in a folder of its own; give it another --out_dir")
    assert sorted(p.name for p in taken.iterdir()) == kept


def test_a_start_that_failed_before_its_first_save_starts_again_in_its_place(tmp_path, chat_run, monkeypatch,
                                                                              capsys):
    """A first step that fails (out of memory, say) leaves the step-0 evaluation in metrics.jsonl and no latest.pt:
    it trained nothing, so the command run again starts in its place, with a note, and logs step 0 once."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    step = rl.step

    def out_of_memory(cfg, s):
        raise RuntimeError("simulated: out of memory")

    monkeypatch.setattr(rl, "step", out_of_memory)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated"):
        rl.main(rl_args(chat_run, out))
    monkeypatch.setattr(rl, "step", step)
    capsys.readouterr()
    rl.main(rl_args(chat_run, out))
    assert (f"note: {out} holds a run stopped before its first step (metrics.jsonl: its records of iteration "
            "0); it trained nothing, and a new run starts in its place\n") in capsys.readouterr().out
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 4
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "rl_eval"] == [0, 2, 4]


def test_a_run_that_failed_between_saves_logs_the_steps_it_takes_again_once(tmp_path, chat_run, monkeypatch, capsys):
    """A run that dies past its last save (killed, out of memory) logged steps its saved state has not taken: the
    continued run drops them, says so, and its records are those of a run never stopped."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    rl.main(rl_args(chat_run, tmp_path / "whole"))
    step = rl.step

    def fails_at_4(cfg, s):  # step 3 logged, latest.pt of step 2
        if s["state"].iter_num == 3:
            raise RuntimeError("simulated: out of memory")
        return step(cfg, s)

    out = tmp_path / "out"
    monkeypatch.setattr(rl, "step", fails_at_4)
    with pytest.raises(RuntimeError, match="simulated"):
        rl.main(rl_args(chat_run, out))
    monkeypatch.setattr(rl, "step", step)
    capsys.readouterr()
    rl.main([f"--out_dir={out}"])
    assert (f"note: {out / 'metrics.jsonl'} held 1 record logged after step 2, the state this run continues from; "
            "it is dropped, and logged again as it goes on\n") in capsys.readouterr().out
    assert [(r["kind"], r["iter"]) for r in read_metrics(out)] == \
        [(r["kind"], r["iter"]) for r in read_metrics(tmp_path / "whole")]


def test_start_over_moves_a_run_aside_once_and_the_new_run_then_continues(tmp_path, chat_run, monkeypatch, capsys):
    """--start_over=True starts a new run where one is (rl.py continues a run it finds otherwise); the new run
    does not keep the setting, so that continuing it continues it."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    out = tmp_path / "out"
    rl.main([*rl_args(chat_run, out), "--max_iters=2"])
    first = (out / "latest.pt").read_bytes()
    rl.main([*rl_args(chat_run, out), "--max_iters=3", "--start_over=True"])
    (aside,) = out.glob("replaced-*")
    assert (aside / "latest.pt").read_bytes() == first
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 3
    capsys.readouterr()
    rl.main([f"--out_dir={out}", "--max_iters=4"])
    assert f"continuing the RL run in {out} from step 3 of 4; max_iters 3 → 4\n" in capsys.readouterr().out
    assert len(list(out.glob("replaced-*"))) == 1 and load_checkpoint(out / "latest.pt")["iter_num"] == 4


@pytest.mark.parametrize("refused", ["a snapshot it lacks", "no reward", "wandb missing"])
def test_start_over_refused_at_its_start_leaves_the_run_where_it_was(tmp_path, chat_run, monkeypatch, refused):
    """The old run is moved aside only once the new one has started: a start refused for its checkpoint, for
    samples never right (no reward), or by wandb, leaves it in place, to continue as before."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    out = tmp_path / "out"
    rl.main([*rl_args(chat_run, out), "--max_iters=2"])
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    if refused == "no reward":
        monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: False)
    if refused == "wandb missing":
        monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as where it is not installed
    extra = {"a snapshot it lacks": ["--init_checkpoint=iter:999"],
             "wandb missing": ["--wandb_log=True"]}.get(refused, [])
    with pytest.raises(UserError):
        rl.main([*rl_args(chat_run, out), "--max_iters=3", "--start_over=True", *extra])
    assert not list(out.glob("replaced-*"))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"} == files


def test_auto_continues_the_run_or_starts_one_from_the_configs_init_from(tmp_path, chat_run, monkeypatch, capsys):
    """--init_from=auto, train.py's way to continue a run or start it (a job requeued as it is): with no RL run in
    out_dir, the config file's init_from starts one, said in a note; with one, it continues; with no config to
    start from, one line."""
    import rl

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    config, out = tmp_path / "rl_config.py", tmp_path / "out"
    config.write_text(f"init_from = {str(chat_run)!r}\n", encoding="utf-8")
    args = [str(config), "--init_from=auto", f"--out_dir={out}", *SMALL]
    rl.main([*args, "--max_iters=2"])
    assert f"note: {out} holds no RL run to continue: --init_from=auto starts one from {chat_run} (the config's)" \
        in capsys.readouterr().out
    rl.main([*args, "--max_iters=3"])
    assert f"continuing the RL run in {out} from step 2 of 3; max_iters 2 → 3\n" in capsys.readouterr().out
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 3
    with pytest.raises(UserError, match=rf"^init_from='auto' continues the RL run in {tmp_path / 'none'}, which holds "
                                        r"none; start one with --init_from=FOLDER"):
        rl.main(["--init_from=auto", f"--out_dir={tmp_path / 'none'}", *SMALL])


def test_a_run_saved_on_another_kind_of_device_continues_with_a_note(tmp_path, chat_run, monkeypatch, capsys):
    """A CUDA generator's state (16 bytes) does not fit a CPU's (5,056): a run moved between a laptop and a GPU
    continues from its weights and optimizer, its sampling seeded anew, and says so."""
    import rl
    from gptkit.run.checkpoint import save_checkpoint

    monkeypatch.setattr(TASKS["addition"], "check", lambda question, answer: len(answer) % 2 == 0)
    out = tmp_path / "out"
    rl.main([*rl_args(chat_run, out), "--max_iters=2"])
    ckpt = load_checkpoint(out / "latest.pt")
    ckpt["rl"]["sampling"] = torch.zeros(16, dtype=torch.uint8)  # as torch.Generator(device="cuda") saves it
    save_checkpoint(ckpt, out / "latest.pt")
    capsys.readouterr()
    rl.main([f"--out_dir={out}", "--max_iters=3"])
    said = capsys.readouterr().out
    assert f"note: {out / 'latest.pt'} was sampled on another kind of device; the answers from here are drawn" in said
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 3


def test_threads_are_followed_on_the_steps_unless_given():
    """Beside a busy program two threads can run a step's many small operations slower than one, and idle faster:
    the count is followed on the steps themselves (a ThreadTuner, as train.py's); a count given is kept."""
    import rl
    from gptkit.chat.reinforce import RLConfig
    from gptkit.machine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        tuner = rl.thread_tuner(RLConfig(), "cpu")
        assert isinstance(tuner, ThreadTuner) and tuner.most == tuner.current == 2 == torch.get_num_threads()
        assert rl.thread_tuner(RLConfig(), "cuda") is None
        assert rl.thread_tuner(RLConfig(threads=1), "cpu") is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
