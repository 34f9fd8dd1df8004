"""A chat dataset (gptkit/data/chat_preparing.py) tokenized by a BPE, GPT-2's or one trained on it: each chat
marker is the one token meta.json names, past the BPE's own; the roles beside the tokens count exactly the answers
and their end marker; the mixed text is plain text; the same command prepares it again."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import copied_again, make_text
from gptkit.base.errors import UserError
from gptkit.data.conversations import ANSWER, MARKERS, NAMES, PROMPT, TEXT
from gptkit.data.dataset import load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.tasks import TASKS
from gptkit.data.tokenizer import tokenizer_from_meta

OWN = {"gpt2": 50257, "bpe": 300}  # the BPE's own tokens: GPT-2's, and those trained (--vocab_size)


@pytest.fixture(params=["gpt2", "bpe"])
def chat_bpe(request, tmp_path):
    """A tasks dataset with text mixed in, prepared with the BPE: (its settings, folder, meta as load_meta reads it)."""
    if request.param == "gpt2":
        request.getfixturevalue("tiktoken_cache")
    mix = tmp_path / "text.txt"
    mix.write_text(make_text(8000), encoding="utf-8")
    cfg = PrepareConfig(synthetic="tasks", tasks="addition,reverse", problems=200, heldout=5, mix=str(mix),
                        tokenizer=request.param, vocab_size=OWN["bpe"] if request.param == "bpe" else 0,
                        data_dir=str(tmp_path / "data"), workers=1)
    prepare(cfg)
    return (cfg, *load_meta(cfg.data_dir, "tasks"))


def test_each_marker_is_the_one_token_meta_json_names_past_the_bpes_own(chat_bpe):
    cfg, folder, meta = chat_bpe
    own = OWN[cfg.tokenizer]
    on_disk = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    assert on_disk["chat"] == {"user": own, "assistant": own + 1, "end": own + 2}
    assert on_disk["vocab_size"] == own + 3 and on_disk["dtype"] == "uint16"
    assert (folder / "tokenizer.json").is_file() == (cfg.tokenizer == "bpe") == ("tokenizer_file" in on_disk)
    tok = tokenizer_from_meta(meta)
    assert tok.chat == on_disk["chat"] and tok.vocab_size == on_disk["vocab_size"]
    for name, char in MARKERS.items():
        assert tok.encode(char) == [on_disk["chat"][name]]
    ids = np.fromfile(folder / "train.bin", dtype=np.uint16).tolist()
    assert ids.count(own) == ids.count(own + 2) == meta["conversations"]["train"]  # one turn each
    text = tok.decode(ids)
    assert tok.encode(text) == ids  # the markers and the text between them, as render made them
    # the characters the tokens spell: every one but the markers', which are no text
    assert meta["train_chars"] == len(text) - sum(text.count(c) for c in MARKERS.values())
    prepare(cfg)  # the same command again: the same dataset, made again


def test_the_roles_count_exactly_each_answer_and_its_end_marker(chat_bpe):
    cfg, folder, meta = chat_bpe
    tok = tokenizer_from_meta(meta)
    ids = np.fromfile(folder / "train.bin", dtype=np.uint16)
    roles = np.fromfile(folder / "train_roles.bin", dtype=np.uint8)
    assert len(ids) == len(roles) == meta["train_tokens"]
    chat = meta["chat"]
    assert set(roles[ids == chat["user"]]) == set(roles[ids == chat["assistant"]]) == {PROMPT}
    assert set(roles[ids == chat["end"]]) == {ANSWER}
    # each conversation, read through its roles: the prompt's text is the question, the answer's the right answer
    ends = np.flatnonzero(ids == chat["end"])
    start = 0
    for end in ends[:50]:
        user = start + int(np.flatnonzero(ids[start:end] == chat["user"])[0])
        piece, kinds = ids[user:end + 1].tolist(), roles[user:end + 1].tolist()
        assert TEXT not in kinds and kinds == sorted(kinds)  # the prompt's tokens, then the answer's
        question = tok.decode([t for t, k in zip(piece, kinds) if k == PROMPT])
        answer = tok.decode([t for t, k in zip(piece, kinds) if k == ANSWER])
        assert re.fullmatch(f"{MARKERS['user']}(.+){MARKERS['assistant']}", question)
        q, a = question[1:-1], answer[:-1]
        assert answer.endswith(MARKERS["end"]) and any(TASKS[t].check(q, a) for t in ("addition", "reverse"))
        start = end + 1
    mixed = tok.decode(ids[roles == TEXT].tolist())  # the text mixed in: plain text, no marker
    assert mixed and not set(mixed) & set(NAMES)
    assert mixed.split("\n")[0] in Path(cfg.mix).read_text(encoding="utf-8")


@pytest.mark.parametrize("tasks, expected", [
    ("addition,sort:5,addition:7", "--tasks names addition twice; give it once, with the count it needs "
                                   "(addition:COUNT)"),
    ("addition:0", "--tasks: 'addition:0' must be NAME or NAME:COUNT, COUNT at least 1"),
    (" , ", "--tasks names no task"),
])
def test_a_tasks_list_that_would_draw_nothing_or_the_same_problems_twice_is_one_line(tasks, expected):
    with pytest.raises(ValueError) as e:
        PrepareConfig(synthetic="tasks", tasks=tasks)
    assert str(e.value) == expected


@pytest.mark.parametrize("setting, expected", [
    (dict(tasks="reverse,addition:1000000"), "--tasks: addition has 793,754 distinct training problems, fewer than "
                                             "1,000,000: give addition:793754 or less"),
    (dict(tasks="sort", problems=10 ** 12), "--tasks: sort has 212,836,543,527 distinct training problems, fewer "
                                            "than 1,000,000,000,000: give sort:212836543527 or less"),
    (dict(tasks="addition_reversed:1000", heldout=20_000), "--heldout=20000: addition_reversed has 16,246 distinct "
                                                           "held-out problems: give --heldout=16246 or less")])
def test_more_problems_than_a_task_has_is_one_line_before_any_is_drawn(setting, expected):
    """Not a draw that ran for minutes and wrote fewer, with meta.json recording the count asked for."""
    with pytest.raises(ValueError) as e:
        PrepareConfig(synthetic="tasks", **setting)
    assert str(e.value) == expected


@pytest.mark.parametrize("setting, needs", [(dict(mix_share=0.3), "--mix"), (dict(problems=10), "--synthetic=tasks"),
                                            (dict(heldout=5, synthetic="repeats"), "--synthetic=tasks")])
def test_a_setting_nothing_would_read_is_one_line_not_ignored(setting, needs):
    with pytest.raises(ValueError) as e:
        PrepareConfig(**setting)
    key = next(iter(setting))
    assert str(e.value) == f"--{key} is read only with {needs}: give that too, or leave out --{key}"


def test_copies_of_one_conversation_that_cannot_be_split_say_why(tmp_path):
    """A split is decided by each conversation's text, so copies of one all land on one side."""
    path = tmp_path / "same.jsonl"
    line = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    path.write_text(f"{line}\n" * 60, "utf-8")
    with pytest.raises(UserError) as e:
        prepare(PrepareConfig(input=str(path), name="same", data_dir=str(tmp_path / "data")))
    assert str(e.value).endswith("too few conversations to split into train and val (60, 1 of them different (a "
                                 "conversation's split is decided by its text: copies share one); val_fraction 0.1)")


def test_a_tasks_dataset_mixing_other_text_or_none_replaces_the_one_there_only_with_start_over(tmp_path):
    text, other = tmp_path / "text.txt", tmp_path / "other.txt"
    text.write_text(make_text(8000), encoding="utf-8")
    other.write_text(make_text(8000, seed=1), encoding="utf-8")
    base = dict(synthetic="tasks", tasks="addition", problems=200, heldout=5, data_dir=str(tmp_path / "data"),
                workers=1)
    prepare(PrepareConfig(**base, mix=str(text)))
    made = (tmp_path / "data" / "tasks" / "meta.json").read_bytes()
    for settings, said in (({}, f"made with --mix={text}"),
                           ({"mix": str(other)}, f"made with other text mixed in ({text} as it was then)"),
                           ({"mix": str(text), "mix_share": 0.3}, "made with --mix_share=0.45")):
        with pytest.raises(UserError) as e:
            prepare(PrepareConfig(**base, **settings))
        assert said in str(e.value) and "--start_over=True" in str(e.value)
        assert (tmp_path / "data" / "tasks" / "meta.json").read_bytes() == made
    prepare(PrepareConfig(**base, mix=str(text)))  # the same command again: the same dataset
    copied_again(text, text.read_bytes())  # the same text, a new time
    prepare(PrepareConfig(**base, mix=str(text)))
    prepare(PrepareConfig(**base, start_over=True))
    assert "mix" not in load_meta(base["data_dir"], "tasks")[1]


def test_a_synthetic_prepare_that_fails_leaves_no_folder_and_keeps_a_dataset_there(tmp_path):
    """Too few conversations to split: the corpus it drew goes again, so a new name leaves no folder, and an
    existing dataset's folder holds no stray corpus beside it."""
    base = dict(synthetic="tasks", workers=1, data_dir=str(tmp_path / "data"))
    with pytest.raises(UserError, match="too few conversations to split into train and val"):
        prepare(PrepareConfig(**base, tasks="sort:5", heldout=2))
    assert not (tmp_path / "data").exists()
    prepare(PrepareConfig(**base, tasks="addition", problems=200, heldout=5))
    made = sorted(p.name for p in (tmp_path / "data" / "tasks").iterdir())
    with pytest.raises(UserError, match="too few conversations"):
        prepare(PrepareConfig(**base, tasks="sort:5", heldout=2, start_over=True))
    assert sorted(p.name for p in (tmp_path / "data" / "tasks").iterdir()) == made


def test_a_mix_holding_no_text_is_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(UserError, match="holds no text to mix in"):
        prepare(PrepareConfig(synthetic="tasks", tasks="addition", problems=200, heldout=5, workers=1,
                              mix=str(tmp_path / "empty.txt"), data_dir=str(tmp_path / "data")))
    assert not (tmp_path / "data" / "tasks").exists()


def test_other_held_out_counts_replace_the_problems_with_a_note(tmp_path, capsys):
    """--heldout changes heldout.jsonl alone, not what trains: the same dataset goes ahead, but says that the
    earlier scores were on other problems (it once changed them without a word)."""
    base = dict(synthetic="tasks", tasks="addition", problems=200, data_dir=str(tmp_path / "data"), workers=1)
    prepare(PrepareConfig(**base, heldout=5))
    capsys.readouterr()
    prepare(PrepareConfig(**base, heldout=5))
    assert "held-out" not in capsys.readouterr().out
    prepare(PrepareConfig(**base, heldout=3))
    assert f"note: {tmp_path / 'data' / 'tasks'}'s held-out problems change from 5 a task to 3 (what it trains on " \
           "stays the same): a score chat.py --eval gave before was on the earlier ones" in capsys.readouterr().out
    assert len((tmp_path / "data" / "tasks" / "heldout.jsonl").read_text().splitlines()) == 3


def test_skip_bad_leaves_a_chat_file_s_bad_lines_out_with_a_note(tmp_path, capsys):
    good = [json.dumps({"messages": [{"role": "user", "content": f"{i}+1"}, {"role": "assistant",
                                                                            "content": str(i + 1)}]})
            for i in range(200)]
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(good[:3] + ["garbage"] + good[3:]) + "\n", encoding="utf-8")
    cfg = dict(input=str(path), name="c", data_dir=str(tmp_path / "d"), workers=1)
    with pytest.raises(UserError, match="line 4 is not JSON"):
        prepare(PrepareConfig(**cfg))
    prepare(PrepareConfig(**cfg, skip_bad=True))
    assert f"note: skipped 1 bad line of {path} (--skip_bad): line 4" in capsys.readouterr().out
