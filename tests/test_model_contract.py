"""gptkit/machine/model_contract.py: a forward edited to return otherwise than (logits, loss) is one line, and
the check leaves the model in the mode it found it."""

import re

import pytest

from conftest import tiny_model
from gptkit.base.errors import UserError
from gptkit.machine.model_contract import check_forward
from model import GPT


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
