"""gptkit/machine/model_contract.py: a forward edited to return otherwise than (logits, loss), or a merge_lora
otherwise than (weights, config), is one line, and the forward's check leaves the model in the mode it found it."""

import re

import pytest

from conftest import tiny_model
from gptkit.base.errors import UserError
from gptkit.machine.model_contract import check_forward, merged_lora
from model import GPT, GPTConfig


@pytest.mark.parametrize("returns, said", [
    (lambda logits, loss: (logits, loss, None), "returned 3 values: the tools read (logits, loss)"),
    (lambda logits, loss: logits, "returned Tensor: the tools read (logits, loss)"),
    (lambda logits, loss: (logits, logits), "returned a loss of shape (1, 4, 3) as its loss: train.py steps on one"),
])
@pytest.mark.parametrize("training", [True, False])
def test_a_forward_edited_to_return_otherwise_than_logits_and_loss_is_one_line(returns, said, training,
                                                                               monkeypatch):
    model = tiny_model(vocab_size=3).train(training)
    check_forward(model)  # as written
    forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, targets=None: returns(*forward(self, idx, targets)))
    with pytest.raises(UserError, match=rf"^model.py's GPT.forward\(idx, targets\) {re.escape(said)}"):
        check_forward(model)
    assert model.training == training


@pytest.mark.parametrize("edit, said", [
    (lambda logits, targets: logits[:, -1] if targets is None else logits,  # the last position as (B, V)
     "GPT.forward(idx) returned logits of shape (1, 3) for 1 × 4 tokens: the tools read the last position's (or "
     "every position's) logits, (B, 1 or T, vocab_size) = (1, 1 or 4, 3)"),
    (lambda logits, targets: logits[:, :, :2],  # a head one token short of the vocabulary
     "GPT.forward(idx, targets) returned logits of shape (1, 4, 2) for 1 × 4 tokens: the tools read every "
     "position's logits, (B, T, vocab_size) = (1, 4, 3)"),
])
def test_a_forward_edited_to_return_logits_of_another_shape_is_one_line(edit, said, monkeypatch):
    """Sampling reads (B, 1 or T, V) logits without targets, and the analyses every position's with them: a forward
    that returns another shape is one line before any work, not an error deep in the decoding."""
    model = tiny_model(vocab_size=3)
    forward = GPT.forward

    def edited(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return edit(logits, targets), loss
    monkeypatch.setattr(GPT, "forward", edited)
    with pytest.raises(UserError, match=f"^model.py's {re.escape(said)}$"):
        check_forward(model)


def test_a_merge_lora_edited_to_return_the_weights_alone_is_one_line(monkeypatch):
    import model as model_py

    adapted = GPT(GPTConfig(vocab_size=5, n_layer=1, n_head=2, n_embd=8, block_size=4, tie_weights=False,
                            lora_rank=2))
    weights, config = merged_lora(adapted.state_dict(), adapted.config)  # as written
    assert config.lora_rank == 0 and not any("lora" in name for name in weights)
    merge = model_py.merge_lora
    monkeypatch.setattr(model_py, "merge_lora", lambda weights, config: merge(weights, config)[0])
    with pytest.raises(UserError, match=r"^model.py's merge_lora\(weights, config\) returned dict: the tools read "
                                        r"\(weights, config\), the weights a dict$"):
        merged_lora(adapted.state_dict(), adapted.config)
