"""Tasks a program checks: the checkers are right, and the held-out problems appear nowhere in what trains."""

import json

import numpy as np
import pytest

from gptkit.data.conversations import MARKERS
from gptkit.data.dataset import load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.tasks import TASKS, problems, split_of
from gptkit.data.tokenizer import tokenizer_from_meta


@pytest.mark.parametrize("task", list(TASKS))
def test_each_checker_accepts_the_reference_and_rejects_a_changed_answer(task):
    for question, answer in problems(task, "train", 50, seed=3):
        assert TASKS[task].check(question, answer)
        changed = answer[:-1] + ("1" if answer[-1] != "1" else "2") if task.startswith("addition") else \
            answer[:-1] + ("a" if answer[-1] != "a" else "b")
        assert not TASKS[task].check(question, changed)
        assert not TASKS[task].check(question, answer + answer[-1])  # no more than the answer
        assert not TASKS[task].check(question, "")


def test_the_checkers_compute_the_answers_themselves():
    assert TASKS["addition"].check("123+456", "579") and TASKS["addition"].check("999+999", "1998")
    assert TASKS["addition_reversed"].check("123+456", "975") and not TASKS["addition_reversed"].check("123+456", "579")
    assert TASKS["reverse"].check("reverse: hello", "olleh")
    assert TASKS["sort"].check("sort: hello", "ehllo")
    assert not TASKS["addition"].check("what?", "1")  # a question the task never asks: wrong, not an error


def test_problems_are_distinct_and_on_their_side_of_the_split():
    held = problems("addition", "heldout", 1000, seed=0)
    assert len(held) == 1000 and len({q for q, _ in held}) == 1000
    assert all(split_of(q) == "heldout" for q, _ in held)
    assert all(split_of(q) == "train" for q, _ in problems("reverse", "train", 500, seed=1))


def test_each_task_knows_how_many_problems_each_split_holds_and_never_hands_back_fewer():
    """A count beyond them once came back short without a word, after minutes of drawing."""
    held = sum(split_of(f"{a}+{b}") == "heldout" for a in range(100, 1000) for b in range(100, 1000))
    for task in ("addition", "addition_reversed"):
        assert TASKS[task].sizes == {"train": 900 * 900 - held, "heldout": held}
    for task in ("reverse", "sort"):
        assert sum(TASKS[task].sizes.values()) == sum(26 ** n for n in range(3, 9))
    with pytest.raises(ValueError) as e:
        problems("addition", "heldout", held + 1, seed=0)
    assert str(e.value) == f"addition has {held:,} distinct heldout problems, not {held + 1:,}"


def test_the_held_out_problems_appear_nowhere_in_the_training_tokens(tmp_path):
    out, meta = prepare(PrepareConfig(synthetic="tasks", problems=3000, heldout=200, data_dir=str(tmp_path),
                                      tasks="addition,reverse,sort"))
    folder, meta = load_meta(str(tmp_path), "tasks")
    tok = tokenizer_from_meta(meta)
    text = tok.decode(np.fromfile(folder / "train.bin", dtype=np.uint16).tolist())
    val = tok.decode(np.fromfile(folder / "val.bin", dtype=np.uint16).tolist())
    held = [json.loads(line) for line in (folder / "heldout.jsonl").read_text().splitlines()]
    assert len(held) == 600 and meta["tasks"] == ["addition", "reverse", "sort"]
    for record in held:  # as the model would meet it: the whole user turn, markers and all
        turn = MARKERS["user"] + record["messages"][0]["content"] + MARKERS["assistant"]
        assert turn not in text and turn not in val
    asked = text.count(MARKERS["user"])
    assert asked == meta["conversations"]["train"] and meta["conversations"]["val"] > 0
