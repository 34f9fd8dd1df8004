"""A prepared dataset as a run reads it (gptkit/data/dataset.py): an epoch's windows, a dataset prepared again or a
split file changed under a run, a meta.json too deeply nested to read, and a chat dataset's keys edited, each one
line."""

import json

import numpy as np
import pytest
import torch

from conftest import make_text
from gptkit.base.errors import UserError
from gptkit.data.dataset import BatchSampler, Split, TrainingData, load_meta
from test_settings import DEEP
from test_versions import opens, prepared


@pytest.mark.parametrize("length, block_size, batch_size", [(1000, 8, 3), (50, 16, 4), (9, 8, 2)])
def test_an_epoch_shows_every_window_once_before_any_again(tmp_path, length, block_size, batch_size):
    """batch_order='epochs': an epoch's windows lie block_size apart from a random first offset, so every token
    after it is a target once, and come each once in a random order; the batches run on into the next epoch, even
    where a batch holds more windows than the split."""
    (tmp_path / "train.bin").write_bytes(np.arange(length, dtype=np.uint16).tobytes())
    split = Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": length}, block_size)
    sampler = BatchSampler(split, batch_size, 0, "cpu", "epochs")
    starts, epochs, start_epoch = [], [], sampler.start_epoch

    def noted_start():
        start_epoch()
        epochs.append(sampler.epoch)

    sampler.start_epoch = noted_start
    while len(epochs) < 3:  # two whole epochs drawn
        x, y = sampler.next()
        assert torch.equal(y, x + 1) and int(y.max()) < length  # the tokens are their own offsets
        starts += x[:, 0].tolist()
    for epoch in epochs[:2]:
        seen, starts = starts[:epoch.windows], starts[epoch.windows:]
        assert sorted(seen) == list(range(epoch.phase, epoch.phase + epoch.windows * block_size, block_size))
        assert epoch.phase + epoch.windows * block_size + 1 > length - block_size  # no whole window left out
        if epoch.windows > 20:
            assert seen != sorted(seen)


def test_dataset_prepared_again_under_a_run_is_one_line(tmp_path):
    old_text, new_text = tmp_path / "old.txt", tmp_path / "new.txt"
    old_text.write_text(make_text(9000, seed=1), encoding="utf-8")
    new_text.write_text(make_text(5000, seed=2), encoding="utf-8")
    data_dir = prepared(old_text, tmp_path / "data")
    run = opens(data_dir)
    run.sampler.next()
    for split in ("train", "val"):
        run.splits[split].batch(run.eval_offsets[split][0], "cpu")
    prepared(new_text, data_dir)  # shorter: the run's windows near the end now lie past it
    folder = data_dir / "tiny"
    with pytest.raises(UserError) as e:
        run.sampler.next()
    assert str(e.value) == (f"{folder / 'train.bin'} changed under this run (the dataset was prepared again or "
                            "edited since the run opened it); start the run again to train on the new data")
    with pytest.raises(UserError, match=r"val\.bin changed under this run"):
        run.splits["val"].batch(run.eval_offsets["val"][0], "cpu")
    opens(data_dir).sampler.next()  # a run started now reads the new dataset


def test_tokens_checksum_is_the_same_for_the_same_tokens_prepared_again_and_another_for_others(tmp_path):
    """A copy of the text, prepared again (another file, another time): the same tokens, the same checksum, so a
    resume says nothing; other text under the same name: another."""
    from gptkit.data.dataset import tokens_checksum

    text, copy, other = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    text.write_text(make_text(9000, seed=1), encoding="utf-8")
    copy.write_text(text.read_text(encoding="utf-8"), encoding="utf-8")
    other.write_text(make_text(9000, seed=2), encoding="utf-8")
    sums = [tokens_checksum(load_meta(str(prepared(path, tmp_path / "data")), "tiny")[1])
            for path in (text, copy, other)]
    assert sums[0] == sums[1] != sums[2]


def test_split_file_rewritten_or_removed_under_a_run_is_one_line(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    split = Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8)
    last = torch.tensor([1000 - 9])
    assert split.batch(last, "cpu")[1][0, -1].item() == 999
    with open(path, "r+b") as f:  # the same file, cut short in place
        f.truncate(600)
    with pytest.raises(UserError, match=r"train\.bin changed under this run"):
        split.batch(last, "cpu")
    path.unlink()
    with pytest.raises(UserError, match=r"train\.bin changed under this run"):
        split.batch(last, "cpu")


def test_a_meta_json_nested_too_deeply_is_one_error_line(tmp_path):
    """The dataset's JSON file: deep nesting is damage to report, as any other (the run's metrics.jsonl: see
    test_metrics.py)."""
    deep = "[" * DEEP + "]" * DEEP
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "meta.json").write_text(deep)
    with pytest.raises(UserError, match=r"meta.json is damaged: not valid JSON"):
        load_meta(tmp_path, "tiny")


def numbered_split(tmp_path, length=1000, block_size=8):
    """A train split whose tokens are their own offsets, so a window's first token says where it starts."""
    (tmp_path / "train.bin").write_bytes(np.arange(length, dtype=np.uint16).tobytes())
    return Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": length}, block_size)


@pytest.mark.parametrize("order", ["random", "epochs"])
def test_processes_share_one_order_each_taking_its_stride(tmp_path, order):
    """world processes read, micro-batch by micro-batch, exactly what one process reads in world micro-batches:
    rank r's m-th batch is the single process's (m * world + r)-th."""
    split = numbered_split(tmp_path)
    alone = BatchSampler(split, 4, 7, "cpu", order)
    ranks = [BatchSampler(split, 4, 7, "cpu", order, rank=r, world=3) for r in range(3)]
    for _ in range(40):
        for sampler in ranks:
            assert torch.equal(sampler.next()[0], alone.next()[0])


@pytest.mark.parametrize("before, after", [((2, 4), (1, 8)), ((1, 8), (2, 4)), ((2, 4), (4, 2))])
def test_a_run_continued_on_another_number_of_processes_sees_no_window_twice_in_an_epoch(tmp_path, before, after):
    """(processes, micro-batch) before and after a resume, the same 8 sequences a step: the order goes on from
    the saved state (the one before the batch each process fetched ahead), and the epoch's windows come each
    once until it ends."""
    split, seen = numbered_split(tmp_path), []

    def steps(world, micro, n, state=None):
        samplers = [BatchSampler(split, micro, 3, "cpu", "epochs", rank=r, world=world) for r in range(world)]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state)
        for _ in range(n):
            seen.extend(int(x[0]) for sampler in samplers for x in sampler.next()[0])
        for sampler in samplers:
            sampler.next()  # fetched ahead, not trained on: a resume draws it again
        return samplers[0]

    first = steps(*before, 5)
    windows = first.epoch.windows
    steps(*after, (windows - len(seen)) // 8, first.state_dict())
    assert len(seen) == len(set(seen)) > windows - 8  # all but the epoch's last part-step, each once


@pytest.mark.parametrize("damage, says", [
    ("missing", "tokenizer.json is missing: this dataset's trained tokenizer; run data/prepare.py for this dataset "
                "again"),
    ("not JSON", "tokenizer.json is damaged: not valid JSON"),
    ("edited", "tokenizer.json is damaged or was edited: it does not match its checksum"),
    ("not merges", "tokenizer.json is damaged: it is not a byte-level BPE with merges data/prepare.py wrote")])
def test_a_trained_tokenizer_missing_or_damaged_in_a_dataset_is_one_line(bpe_data, tmp_path, damage, says):
    import json
    import shutil

    shutil.copytree(bpe_data[0] / "tiny_bpe", tmp_path / "tiny_bpe", symlinks=False)
    path = tmp_path / "tiny_bpe" / "tokenizer.json"
    content = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    if damage == "not JSON":
        path.write_text('{"format": "gptkit byte-level BPE 1", "merges": [[32, 1', encoding="utf-8")
    elif damage == "edited":
        path.write_text(json.dumps(dict(content, merges=content["merges"][:-1])), encoding="utf-8")
    elif damage == "not merges":
        path.write_text(json.dumps(dict(content, merges=[[1, 2, 3]])), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_meta(tmp_path, "tiny_bpe")
    assert str(info.value).startswith(f"{path}") and says in str(info.value) and "\n" not in str(info.value)


def test_a_chat_datasets_targets_skip_the_prompts_unless_told_to_train_on_all(tmp_path):
    """A chat dataset's batches: every target of a prompt token (the user's turn, the markers that open turns) is
    -1 and every other is the next token; the inputs are untouched; train_on='all' scores every token."""
    from gptkit.data.conversations import PROMPT
    from gptkit.data.preparing import PrepareConfig, prepare

    prepare(PrepareConfig(synthetic="tasks", tasks="addition,reverse", problems=300, heldout=5,
                          data_dir=str(tmp_path)))
    folder, meta = load_meta(str(tmp_path), "tasks")
    tokens = np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.int64)
    roles = np.fromfile(folder / "train_roles.bin", dtype=np.uint8)
    offsets = torch.tensor([0, 37, 400])
    x, y = Split(folder, "train", meta, 32).batch(offsets, "cpu")
    for row, start in enumerate(offsets.tolist()):
        assert x[row].tolist() == tokens[start:start + 32].tolist()
        expected = np.where(roles[start + 1:start + 33] == PROMPT, -1, tokens[start + 1:start + 33])
        assert y[row].tolist() == expected.tolist()
    assert (y == -1).any() and (y != -1).any()
    _, every = Split(folder, "train", meta, 32, train_on="all").batch(offsets, "cpu")
    assert every.tolist() == [tokens[s + 1:s + 33].tolist() for s in offsets.tolist()]


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """A chat dataset with held-out problems and text mixed in: its meta.json has every chat key."""
    from gptkit.data.preparing import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("chat")
    (root / "text.txt").write_text(make_text(8000), encoding="utf-8")
    prepare(PrepareConfig(synthetic="tasks", tasks="addition", problems=200, heldout=5, mix=str(root / "text.txt"),
                          data_dir=str(root / "data"), workers=1))
    return root / "data"


def edited_meta(data, edit):
    """The dataset's meta.json without its checksum (so the edit is not caught as one) and edited; its text as it
    was, to put back."""
    path = data / "tasks" / "meta.json"
    was = path.read_text(encoding="utf-8")
    meta = json.loads(was)
    del meta["sha256"]
    edit(meta)
    path.write_text(json.dumps(meta), encoding="utf-8")
    return path, was


@pytest.mark.parametrize("key, value, says", [
    ("mix", "x", "'mix' must describe the text mixed in, its val_file 'mixed_val.txt'"),
    ("heldout_file", 5, "'heldout_file' must be 'heldout.jsonl'"),
    ("heldout_file", "../meta.json", "'heldout_file' must be 'heldout.jsonl'"),
    ("text_sha256", "x", "'text_sha256' must map each file beside the tokens to its checksum"),
    ("roles", "x", "'roles' must list each split's roles file, with its tokens and sha256"),
    ("roles", {"train": {"file": "train_roles.bin"}}, "'roles' must list each split's roles file, with its tokens and "
                                                      "sha256"),
    ("chat", {"user": 1}, "'chat' must map each chat marker to its token id")])
def test_a_chat_key_edited_in_meta_json_is_one_line_naming_it(chat_data, key, value, says):
    """chat.py, rl.py and train.py read these keys: an edit gave an AttributeError or a TypeError."""
    path, was = edited_meta(chat_data, lambda meta: meta.update({key: value}))
    try:
        with pytest.raises(UserError) as e:
            load_meta(str(chat_data), "tasks")
    finally:
        path.write_text(was, encoding="utf-8")
    assert str(e.value) == f"{path}: {says}; run data/prepare.py for this dataset again"


def test_a_roles_file_holding_a_value_no_role_has_is_one_line_naming_it_as_a_role(chat_data):
    """It said 'holds token id 7, outside the vocabulary of 3' of the roles file, whose values are no token ids."""
    folder, meta = load_meta(str(chat_data), "tasks")
    path = folder / "train_roles.bin"
    was = path.read_bytes()
    path.write_bytes(was[:10] + bytes([7]) + was[11:])
    try:
        with pytest.raises(UserError) as e:
            Split(folder, "train", meta, 8)
    finally:
        path.write_bytes(was)
    assert str(e.value) == (f"{path} holds role 7, and a token's role is 0 to 2; run data/prepare.py for this dataset "
                            "again")


def test_a_chat_dataset_without_its_roles_is_one_line_unless_told_to_train_on_all(chat_data):
    """Without them the loss counted every token, the questions too, without a word."""
    path, was = edited_meta(chat_data, lambda meta: meta.pop("roles"))
    try:
        folder, meta = load_meta(str(chat_data), "tasks")
        with pytest.raises(UserError) as e:
            TrainingData(folder, meta, 8, 2, 1, 0, "cpu")
        TrainingData(folder, meta, 8, 2, 1, 0, "cpu", train_on="all")
    finally:
        path.write_text(was, encoding="utf-8")
    assert str(e.value) == (f"{path} lacks 'roles', which say the tokens that are answers; run data/prepare.py for "
                            "this dataset again, or train on every token with --train_on=all")


@pytest.mark.parametrize("name,command", [
    ("shakespeare_char", "python data/prepare.py --data_dir={d}"),
    ("tasks", "python data/prepare.py --synthetic=tasks --mix=data/shakespeare_char/input.txt --data_dir={d}"),
    ("repeats", "python data/prepare.py --synthetic=repeats --data_dir={d}"),
    ("mine", "python data/prepare.py --input=YOUR.txt --name=mine --data_dir={d}")])
def test_a_missing_dataset_names_the_command_that_makes_it(tmp_path, name, command):
    """The tasks' with the main job's text mixed in, as docs/chat.md prepares them: without it, the fine-tune
    forgets more of the text its base learned."""
    with pytest.raises(UserError) as e:
        load_meta(str(tmp_path), name)
    assert str(e.value) == f"dataset folder {tmp_path / name} not found; create it with `{command.format(d=tmp_path)}`"
