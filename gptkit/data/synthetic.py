"""
Synthetic corpora: text a seeded generator writes, whose structure is known exactly, so that the mechanism a model
needs for it can be watched as it forms (docs/corpora.md#synthetic-text). `data/prepare.py --synthetic=NAME`
writes one in its dataset folder and prepares that, char-level unless told otherwise.

repeats: random lowercase strings, each written twice, one pair after another (`xqbwkexqbwkegtlgtl...`). The first
copy cannot be predicted, each letter is one of 26 (ln 26 = 3.26 nats); the second can, letter for letter, by a
model that finds the current letter earlier and reads the letter after it: an induction head. The lengths vary
from pair to pair, so that a head looking a fixed distance back cannot pass for one.

tasks: conversations that ask problems a program checks (gptkit/data/tasks.py), one JSON line each, for chat
fine-tuning; their held-out problems are written beside the dataset, never among these.
"""

import hashlib
import json
import os
import random
import string

from gptkit.base.errors import UserError
from gptkit.base.files import write_whole
from gptkit.data.sources import shown
from gptkit.data.tasks import conversation, problems

REPEATS_SEED = 0
REPEATS_STRINGS = 150_000  # about 4.5 MB of text: a model this data is for cannot learn the strings themselves
REPEATS_SHORTEST, REPEATS_LONGEST = 6, 24  # letters in a string, uniform
# the written file's modification time, fixed: prepare knows a dataset's text by its files' sizes and times
# (preparing.same_text), so the same text written again (the file deleted since) is still the text it was made of
SOURCE_MTIME = 1_735_689_600  # 2025-01-01 UTC


def repeats_strings(count=REPEATS_STRINGS, seed=REPEATS_SEED):
    """The `count` strings of the repeats corpus: letters drawn independently (a string may hold one twice), each
    string's length uniform in [REPEATS_SHORTEST, REPEATS_LONGEST]. Drawn with random.random() alone, whose
    sequence for a seed is the one Python promises to keep from version to version (randint's and choice's are not)."""
    draw = random.Random(seed).random
    letters, lengths = string.ascii_lowercase, REPEATS_LONGEST - REPEATS_SHORTEST + 1
    for _ in range(count):
        length = REPEATS_SHORTEST + int(draw() * lengths)
        yield "".join(letters[int(draw() * len(letters))] for _ in range(length))


def repeats_text(count=REPEATS_STRINGS, seed=REPEATS_SEED):
    """Each string written twice, with nothing between the pairs. Not a line each: a model trained on lines learns
    that a newline starts a new string, and the sequences analyze.py's induction score reads (random ids from the
    whole vocabulary, written twice: gptkit/interp/experiments.py repeated_tokens) then hold newlines in the
    middle of their strings. Letters may repeat within a string: on strings of distinct letters, models learned
    to copy without an induction head, ruling out the letters seen since (docs/corpora.md#synthetic-text)."""
    return "".join(s + s for s in repeats_strings(count, seed))


def tasks_text(tasks, seed=0):
    """Conversations of each (task, count) in tasks, none of them held out, as JSON Lines in a seeded random
    order, so that a window of them mixes the tasks (prepare splits val off them)."""
    lines = [json.dumps(conversation(task, question, answer))
             for task, count in tasks for question, answer in problems(task, "train", count, seed)]
    random.Random(seed).shuffle(lines)
    return "".join(line + "\n" for line in lines)


# --synthetic's names: each corpus's (file name, text) for prepare's settings
SYNTHETIC = {"repeats": lambda cfg: ("repeats.txt", repeats_text()),
             "tasks": lambda cfg: tasks_source(cfg.task_list())}


def tasks_source(tasks):
    text = tasks_text(tasks)
    # named for what it holds: other tasks or counts are another text, which prepare will not mix up with this
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"tasks-{key}.jsonl", text


def write_source(name, folder, cfg):
    """The synthetic corpus `name` as a file in folder, written there unless it is there already: (its path,
    whether this call wrote it). A file of that name holding other text is the user's error, never replaced
    (another version of the corpus, or theirs)."""
    file_name, text = SYNTHETIC[name](cfg)
    path, data = folder / file_name, text.encode("utf-8")
    if not path.exists():
        write_whole(path, data)
        os.utime(path, (SOURCE_MTIME, SOURCE_MTIME))
        return path, True
    if not (path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data):
        raise UserError(f"{shown(path)} is not the text --synthetic={name} writes; move it out of the way (or "
                        "delete it) and run again")
    return path, False
