"""Ending a chat fine-tune by its score (stop_task, stop_pass_at_1): at each evaluation, one task's held-out
pass@1, and the run ends at the first evaluation where it reaches the aim. RL sharpens what a model can already
sample, so it learns most from a fine-tune right about half the time; the sums are learned in a sudden change whose
step moves with the base model, so no step count can say where that is."""

from gptkit.base.errors import UserError
from gptkit.base.modes import evaluating
from gptkit.chat.scoring import heldout_problems, score
from gptkit.training.evaluation import eagerly

# what `chat.py --eval --tasks=TASK --samples=8 --temperature=1 --limit=200` scores, at its seed and answer length,
# so that the figure a run stops at is the one chat.py gives its checkpoint
PROBLEMS, SAMPLES, TEMPERATURE, MAX_NEW_TOKENS = 200, 8, 1.0, 64


class ScoreStop:
    """The task's held-out problems, and whether the model has reached the aim on them."""

    def __init__(self, cfg, folder, meta, tokenizer):
        self.task, self.aim, self.seed, self.tokenizer = cfg.stop_task, cfg.stop_pass_at_1, cfg.seed, tokenizer
        found = heldout_problems(folder, meta)
        if self.task not in found:
            holds = f"held-out problems of {', '.join(found)}" if found else "no held-out problems"
            raise UserError(f"stop_task={self.task!r}: the dataset {meta.get('source', cfg.dataset)} holds {holds}; "
                            f"stop by one of those, or prepare a dataset with it (data/prepare.py --synthetic=tasks)")
        self.problems = {self.task: found[self.task][:PROBLEMS]}

    def reached(self, rt, state, report):
        """Score the weights evaluations score (rank 0; every process gets the figure), say and log it: where it
        reaches the aim, {"task", "pass_at_1", "iter"}, which the run's latest.pt keeps; else None."""
        pass_1 = rt.broadcast(self.pass_at_1(state) if rt.master else None)
        report.scored(state.iter_num, self.task, pass_1, self.aim)
        return dict(task=self.task, pass_at_1=pass_1, iter=state.iter_num) if pass_1 >= self.aim else None

    def pass_at_1(self, state):
        model = state.model
        with state.scored(), eagerly(), evaluating(model):
            found = score(model, self.tokenizer, self.problems, SAMPLES, TEMPERATURE, MAX_NEW_TOKENS, self.seed)
        return found[self.task]["pass_at"]["1"]


def stopped_by_score(ckpt, cfg):
    """Where a saved run ended by reaching the aim this config sets: {"task", "pass_at_1", "iter"}; else None."""
    stopped = ckpt.get("stopped_by_score")
    if stopped and cfg.stop_task == stopped["task"] and stopped["pass_at_1"] >= cfg.stop_pass_at_1:
        return stopped
    return None

