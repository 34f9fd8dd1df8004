"""
Export a trained checkpoint (best.pt, or latest.pt with --checkpoint=latest) as a Hugging Face GPT-2 model
(config.json + model.safetensors).

    python export.py --out_dir=out-shakespeare --hf_dir=hf-shakespeare

Then `GPT2LMHeadModel.from_pretrained("hf-shakespeare")` gives the same logits. Needs `transformers`.
Models with options GPT-2 has no place for (rope, rmsnorm, qk_norm, logit_softcap, token_shift) are refused.
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gptkit.base.errors import run_main
from gptkit.base.settings import parse_config
from gptkit.run.run_folder import load_model


@dataclass
class ExportConfig:
    out_dir: str = "out"  # the run's folder
    checkpoint: Literal["best", "latest"] = "best"  # 'best' (best.pt, the lowest val loss) or 'latest' (latest.pt)
    hf_dir: str = ""  # folder to write config.json and model.safetensors to

    def __post_init__(self):
        if not self.hf_dir:
            raise ValueError("pass the folder to write with --hf_dir=DIR")
        if Path(self.hf_dir).exists() and not Path(self.hf_dir).is_dir():
            raise ValueError(f"--hf_dir={self.hf_dir} exists and is not a folder")


def main(argv=None):
    cfg = parse_config(ExportConfig, sys.argv[1:] if argv is None else argv, prog="export.py")
    from gptkit.interop.hf import check_hf_dir, save_hf  # `transformers` is imported only where it writes

    check_hf_dir(cfg.hf_dir)
    model, tok = load_model(cfg.out_dir, "cpu", cfg.checkpoint)

    eot = getattr(tok, "eot_token", None)  # <|endoftext|> for BPE; char vocabularies have none
    replaced = save_hf(model, cfg.hf_dir, eos_token_id=eot if eot is not None and eot < model.config.vocab_size
                       else None)
    if replaced:
        print(f"note: replaced {cfg.hf_dir}'s {', '.join(replaced)}, an earlier export's")
    c = model.config
    print(f"wrote {cfg.hf_dir}: GPT-2 with {c.n_layer} layer{'s' * (c.n_layer != 1)}, {c.n_head} "
          f"head{'s' * (c.n_head != 1)}, {c.n_embd} wide, "
          f"{c.block_size} positions, vocab {c.vocab_size:,} ({model.num_params(False) / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    run_main(main)
