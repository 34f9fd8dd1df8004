"""A model's mode for a pass that must draw no dropout and leave the model as it found it."""

from contextlib import contextmanager


@contextmanager
def evaluating(model):
    """The model in eval mode (no dropout draws) for the block, then in the mode it was in, however the block ends."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
