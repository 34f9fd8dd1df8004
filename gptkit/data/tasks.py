"""
Tasks whose answers a program checks: the conversations `data/prepare.py --synthetic=tasks` writes, and the
checkers that score a model's answers to them (chat.py --eval, rl.py's reward).

- addition: two 3-digit numbers, `123+456` -> `579`;
- addition_reversed: the same sums with the answer's digits least significant first, `123+456` -> `975`: the model
  then writes each digit after the digits it depends on (Lee et al. 2023, "Teaching Arithmetic to Small
  Transformers");
- reverse: a word of 3-8 random letters backwards, `reverse: hello` -> `olleh`;
- sort: the letters of such a word in alphabetical order, `sort: hello` -> `ehllo`.

Every problem belongs to one split by a hash of its question, so the held-out problems are split off by
construction: no training conversation can hold one, whatever the counts or the seed.
"""

import hashlib
import random
import string

HELDOUT_SHARE = 0.02  # of each task's problem space, by the question's hash
SUMS, SUMS_HELDOUT = 900 * 900, 16_246  # the pairs of 3-digit numbers, and those held out (test_tasks.py counts them)
# words of 3-8 letters, too many to count by their hash: the held-out share of them, which at billions is off by
# about one part in ten thousand, where far fewer problems than that would fill the memory
WORDS = sum(26 ** n for n in range(3, 9))
WORDS_HELDOUT = round(WORDS * HELDOUT_SHARE)


def addition_problem(draw):
    a, b = 100 + int(draw() * 900), 100 + int(draw() * 900)
    return f"{a}+{b}", str(a + b)


def word(draw):
    return "".join(string.ascii_lowercase[int(draw() * 26)] for _ in range(3 + int(draw() * 6)))


class Task:
    """A kind of problem: `make(draw)` gives a (question, answer) from a random() function; `solve(question)`
    computes the one right answer, which the checker compares with the model's. `sizes` holds how many distinct
    problems each split has: a count beyond them could never be drawn."""

    def __init__(self, make, solve, questions, heldout):
        self.make, self.solve = make, solve
        self.sizes = {"train": questions - heldout, "heldout": heldout}

    def check(self, question, answer):
        """Whether `answer` (the model's text before <|end|>) is right: exactly the answer, no more."""
        try:
            return answer == self.solve(question)
        except ValueError:  # a question this task never asks
            return False


def sum_of(question):
    a, _, b = question.partition("+")
    return str(int(a) + int(b))


def reversed_sum_of(question):
    return sum_of(question)[::-1]


def reversed_word(question):
    return question.removeprefix("reverse: ")[::-1]


def sorted_word(question):
    return "".join(sorted(question.removeprefix("sort: ")))


def asked(prefix, solve):
    """A task's problem maker: the question `prefix` + a random word, and solve's answer to it."""
    def make(draw):
        question = prefix(draw)
        return question, solve(question)
    return make


TASKS = {
    "addition": Task(asked(lambda draw: addition_problem(draw)[0], sum_of), sum_of, SUMS, SUMS_HELDOUT),
    "addition_reversed": Task(asked(lambda draw: addition_problem(draw)[0], reversed_sum_of), reversed_sum_of,
                              SUMS, SUMS_HELDOUT),
    "reverse": Task(asked(lambda draw: f"reverse: {word(draw)}", reversed_word), reversed_word, WORDS, WORDS_HELDOUT),
    "sort": Task(asked(lambda draw: f"sort: {word(draw)}", sorted_word), sorted_word, WORDS, WORDS_HELDOUT),
}


def split_of(question):
    """'heldout' or 'train': where a problem belongs, by the hash of its question alone (the dataset then
    splits val off the training problems as it splits any conversations)."""
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") / 2 ** 64
    return "heldout" if h < HELDOUT_SHARE else "train"


def problems(task, split, count, seed):
    """`count` distinct problems of a task that belong to `split`, drawn with random.random() alone (whose
    sequence for a seed Python keeps from version to version). The split must hold that many (Task.sizes: a
    settings check says so first), else no draw could end."""
    if count > TASKS[task].sizes[split]:
        raise ValueError(f"{task} has {TASKS[task].sizes[split]:,} distinct {split} problems, not {count:,}")
    draw, found = random.Random(f"{task}/{split}/{seed}").random, {}
    while len(found) < count:
        question, answer = TASKS[task].make(draw)
        if question not in found and split_of(question) == split:
            found[question] = answer
    return list(found.items())


def conversation(task, question, answer):
    return {"task": task, "messages": [{"role": "user", "content": question},
                                       {"role": "assistant", "content": answer}]}
