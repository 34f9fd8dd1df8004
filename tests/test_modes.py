"""gptkit/base/modes.py: a pass in eval mode leaves the model in the mode it found it, however the pass ends."""

import pytest

from conftest import tiny_model
from gptkit.base.modes import evaluating


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_puts_the_model_back_in_its_mode_however_the_block_ends(training):
    model = tiny_model(vocab_size=3).train(training)
    with pytest.raises(ZeroDivisionError):
        with evaluating(model):
            assert not any(m.training for m in model.modules())
            1 / 0
    assert all(m.training == training for m in model.modules())
