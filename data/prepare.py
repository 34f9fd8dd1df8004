"""
Prepare a text corpus for training.

    python data/prepare.py                                   # tinyshakespeare -> data/shakespeare_char/
    python data/prepare.py --input=my.txt --name=mine        # any UTF-8 text, char-level
    python data/prepare.py --input=my.txt --name=mine_bpe --tokenizer=gpt2
    python data/prepare.py --input=my.txt --name=mine_512 --tokenizer=bpe --vocab_size=512 --show_merges=10  # trained
    python data/prepare.py --input=corpus/ --name=web --tokenizer=gpt2     # .jsonl(.gz/.zst), .parquet, text
    python data/prepare.py --input=my.txt --name=mine --tokenizer=gpt2 --start_over=True  # replace dataset 'mine'
    python data/prepare.py --synthetic=repeats                 # random strings, each written twice -> data/repeats/

A dataset made from other text or with another tokenizer is replaced only with --start_over=True: runs trained on
it need its token ids (docs/corpora.md#preparing-a-dataset-again).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the gptkit package lives one level up

from gptkit.base.errors import run_main  # noqa: E402
from gptkit.base.settings import parse_config  # noqa: E402
from gptkit.data.preparing import PrepareConfig, prepare, shown  # noqa: E402


def main(argv=None):
    cfg = parse_config(PrepareConfig, sys.argv[1:] if argv is None else argv, prog="data/prepare.py")
    out_dir, meta = prepare(cfg)
    shards = len(meta["train_shards"]) + len(meta["val_shards"])
    skipped = meta["skipped"]
    print(f"wrote {shown(out_dir)}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens"
          f"{f' in {shards} shards' if shards > 2 else ''}, vocab {meta['vocab_size']:,} ({meta['tokenizer']}), "
          f"{meta['dtype']}; {meta['documents']:,} document{'s' if meta['documents'] != 1 else ''}, split {meta['split']}"
          + (f"; skipped {skipped['empty']:,} empty and {skipped['bad']:,} bad" if any(skipped.values()) else ""))


if __name__ == "__main__":
    run_main(main)
