"""
The attention lab: train each step of the path from a bigram table to the full GPT for the same
wall-time budget, on the same data, and compare them side by side.

    python lab.py                                  # every rung, 25 s each, into out-lab/
    python lab.py --rungs=scaled,dot --budget=60   # the sqrt(d) lesson, longer
    python sample.py --out_dir=out-lab/blocks      # each rung is a normal run folder
"""

import sys

from gptkit.config import parse_config
from gptkit.errors import run_main
from gptkit.lab import LabConfig, run_lab


def main(argv=None):
    run_lab(parse_config(LabConfig, sys.argv[1:] if argv is None else argv, prog="lab.py"))


if __name__ == "__main__":
    run_main(main)
