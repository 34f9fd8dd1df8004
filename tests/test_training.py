"""gptkit/training/: the parts train.py's loop is made of: the random state a checkpoint carries, the whole-split
evaluation, and how processes share a step's batch. (The start-up choices, a preset's shape fitted to its time budget
among them: test_choices.py.)"""

import random

import numpy as np
import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.base.errors import UserError
from gptkit.data.dataset import BatchSampler, Split
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.training.evaluation import evaluate_split
from gptkit.training.starting import batch_shares, global_batch
from gptkit.training.state import rng_state, set_rng_state


@pytest.mark.parametrize("order", ["random", "epochs"])
def test_every_rng_round_trips_through_a_checkpoint(tmp_path, order):
    """torch, numpy, python and the sampler (which redraws the batch it had fetched ahead) come back exactly; in
    epochs, with the batch fetched ahead running from the end of one epoch into the next."""
    (tmp_path / "train.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    sampler = BatchSampler(Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8), 3, 0, "cpu", order)
    for _ in range(41):  # 123 of an epoch's 124 windows
        sampler.next()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    pending, _ = sampler.next()
    save_checkpoint({"rng": [rng_state(sampler)]}, tmp_path / "ckpt.pt")

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), sampler.next()[0].tolist()

    first = draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9), sampler.next()
    set_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng"][0], sampler)
    assert sampler.next()[0].tolist() == pending.tolist()
    assert draws() == first


@pytest.mark.parametrize("max_tokens", [0, 100, 37, 1, 5, 15, 16, 17])
def test_split_evaluation_scores_every_target_once(tmp_path, max_tokens):
    """Against a plain loop: consecutive windows, the last one cut to the targets no window scored yet; the whole
    split (max_tokens 0), or its first max_tokens targets, down to fewer than a block (a final_eval_tokens shorter
    than one)."""
    (tmp_path / "val.bin").write_bytes(np.random.default_rng(0).integers(0, 20, 203).astype(np.uint16).tobytes())
    split = Split(tmp_path, "val", {"dtype": "uint16", "vocab_size": 20}, 16)
    model = tiny_model(config=train_config().model, vocab_size=20).eval()
    loss, scored = evaluate_split(model, split, torch.autocast("cpu", enabled=False), 3, max_tokens)
    tokens = torch.from_numpy(np.fromfile(tmp_path / "val.bin", dtype=np.uint16).astype(np.int64))
    n = max_tokens or len(tokens) - 1
    losses = []
    with torch.no_grad():
        for start in range(0, n, 16):
            end = min(start + 16, n)  # targets start+1 .. end
            first = max(0, end - 16)  # a full window ending at `end`
            logits, _ = model(tokens[first:end][None], tokens[first + 1:end + 1][None])
            per_token = torch.nn.functional.cross_entropy(logits[0], tokens[first + 1:end + 1], reduction="none")
            losses += per_token[start - first:].tolist()
    assert scored == n == len(losses)
    assert loss == pytest.approx(sum(losses) / n, rel=1e-5)


@pytest.mark.parametrize("sequences, batch_size, world, shares", [
    (8, 4, 1, (4, 2)), (8, 4, 2, (4, 1)), (8, 4, 4, (2, 1)), (4, 4, 2, (2, 1)), (36, 12, 2, (9, 2)), (12, 4, 3, (4, 1))])
def test_processes_share_a_step_in_the_fewest_micro_batches_no_larger_than_batch_size(sequences, batch_size, world,
                                                                                      shares):
    assert batch_shares(sequences, batch_size, world) == shares


def test_a_step_the_processes_cannot_share_evenly_is_one_line():
    with pytest.raises(UserError, match="this run takes 8 sequences a step, which 3 processes cannot share evenly"):
        batch_shares(8, 4, 3)


def test_a_resumed_run_keeps_its_global_batch_unless_its_batch_settings_are_given_anew():
    """Saved by 2 processes with one micro-batch of 4 each: 8 a step, on 1 process or 4 (a checkpoint from before
    the number was saved has it from its settings and its count of processes: test_formats.py)."""
    cfg = train_config(batch_size=4, gradient_accumulation_steps=1)
    assert global_batch(cfg, 2) == 8 and global_batch(cfg, 1) == 4
    saved = {"config": {"batch_size": 4, "gradient_accumulation_steps": 1}, "rng": [{}, {}], "global_batch": 8}
    assert global_batch(cfg, 1, saved) == global_batch(cfg, 4, saved) == 8
    assert global_batch(cfg, 1, {**saved, "global_batch": 16}) == 16
    assert global_batch(train_config(batch_size=2, gradient_accumulation_steps=1), 1, saved) == 2  # given anew


@pytest.mark.parametrize("sequences", [0, 4, 6, 10 ** 9 + 2])
def test_a_saved_global_batch_its_batch_settings_cannot_give_is_one_line_naming_the_file(sequences):
    """A hand edit: 4 a micro-batch and 2 micro-batches give 8, or 4 times the processes where they were more;
    another number could have the run stepping a billion micro-batches a step without a word."""
    cfg = train_config(batch_size=4, gradient_accumulation_steps=2)
    saved = {"config": {"batch_size": 4, "gradient_accumulation_steps": 2}, "rng": [{}], "global_batch": sequences}
    with pytest.raises(UserError, match=rf"^out/latest.pt is damaged: global_batch is {sequences:,} sequences a "
                                        r"step, which its batch_size \(4\) and gradient_accumulation_steps \(2\) do "
                                        "not give$"):
        global_batch(cfg, 1, saved, "out/latest.pt")
    # its own 8, and the 12 three processes take in one micro-batch each
    assert [global_batch(cfg, 1, {**saved, "global_batch": n}) for n in (8, 12)] == [8, 12]


def test_a_checkpoint_whose_processes_each_had_their_own_order_continues_from_process_0s(tmp_path, capsys):
    """Written before the processes shared one data order, a checkpoint holds one sampler state per process
    (process r's seeded with seed + r): every process continues the one order from process 0's, and rank 0
    says so."""
    from types import SimpleNamespace

    from gptkit.training.state import TrainState

    (tmp_path / "train.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    split = Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8)
    states = []
    for rank in (0, 1):
        sampler = BatchSampler(split, 4, 1337 + rank, "cpu", "epochs")
        sampler.next()
        states.append(rng_state(sampler))
    whole = BatchSampler(split, 8, 0, "cpu", "epochs")
    whole.load_state_dict(states[0]["sampler"])
    expected = whole.next()[0]  # process 0's order, 8 windows a step
    for rank in (0, 1):
        state = SimpleNamespace(sampler=BatchSampler(split, 4, 1337, "cpu", "epochs", rank=rank, world=2),
                                global_batch=8, micro_batches=1)
        TrainState.restore_random_state(state, states, SimpleNamespace(rank=rank, world=2, master=rank == 0))
        assert torch.equal(state.sampler.next()[0], expected[rank * 4:(rank + 1) * 4])
    assert capsys.readouterr().out == ("note: this checkpoint was written before the processes shared one data "
                                       "order; the order continues from process 0's, so some windows process 1 "
                                       "and up read may come round again\n")
