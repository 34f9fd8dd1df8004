"""
The attention lab: train each step of the path from a bigram table to the full GPT on the same text, and compare
them side by side: on as many training tokens each (what each mechanism learns from the same text), or for as
many seconds each (what each buys per second on this machine).

    python lab.py                                  # every rung, 1,000,000 training tokens each, into out-lab/
    python lab.py --budget=25                      # every rung, 25 s of training each
    python lab.py --rungs=scaled,dot --tokens=3000000   # the sqrt(d) lesson, longer
    python lab.py --qk_norm=True                   # any of model.py's settings, over every rung's own
    python sample.py --out_dir=out-lab/blocks      # each rung is a normal run folder
"""

import sys

from gptkit.base.errors import run_main
from gptkit.lab.ladder import lab_config, run_lab


def main(argv=None):
    run_lab(lab_config(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run_main(main)
