"""A run's files: its checkpoints, its folder and lock, and its metrics."""
