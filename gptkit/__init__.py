"""gptkit: the machinery behind the commands at the project's root (train.py, sample.py, plot.py,
export.py, bench.py, data/prepare.py). One module per concern; none imports a command, and the
model (model.py at the root) imports nothing from here."""
