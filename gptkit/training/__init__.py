"""Training: its settings, the state a checkpoint keeps, optimizers, resuming, and what a run reports."""
