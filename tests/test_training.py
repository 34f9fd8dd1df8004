"""gptkit/training.py, the parts train.py's loop is made of: the random state a checkpoint carries, and the
whole-split evaluation. (The start-up choices, the model fitted to its time budget among them: test_choices.py.)"""

import random

import numpy as np
import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.checkpoint import load_checkpoint, save_checkpoint
from gptkit.dataset import BatchSampler, Split
from gptkit.training import evaluate_split, rng_state, set_rng_state


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
