# the default's recipe (config/shakespeare_char.py) on tinyshakespeare cut into a byte-level BPE of 512 tokens
# trained on it, on a CPU: the same model and 150-second budget. Of characters and BPEs of 257 to 4,096 tokens,
# trained for equal time, 512 read held-out text in the fewest bits per character (docs/tokenizers.md).
# prepare the data first (data/shakespeare_char/input.txt is the tinyshakespeare `python data/prepare.py` fetches):
#   python data/prepare.py --input=data/shakespeare_char/input.txt --name=shakespeare_bpe --tokenizer=bpe --vocab_size=512
# GPT-2's 50,257 tokens on the same text take this preset too, with the block that reads as much text:
#   python data/prepare.py --input=data/shakespeare_char/input.txt --name=shakespeare_gpt2 --tokenizer=gpt2
#   python train.py config/shakespeare_bpe.py --dataset=shakespeare_gpt2 --block_size=40 --out_dir=out-gpt2
# it then notes that most of its parameters are embeddings, slow to train on a CPU: true, and the reason to train
# a smaller vocabulary of your own here.
base = 'shakespeare_char.py'

out_dir = 'out-bpe'
wandb_run_name = 'cpu-bpe'
dataset = 'shakespeare_bpe'
# 512 tokens average about 1.9 characters of this text, so 64 tokens read about the 128 characters the
# char-level default reads; a step's 32 windows then hold as much text as the default's, in half the tokens
block_size = 64

# the shape stays as configured (no threshold: no shape fitted, no note): tokens per parameter were tuned on the
# char-level model, and a BPE's embedding rows are each trained by few steps (docs/tokenizers.md)
min_tokens_per_param = 0
# train.py notes overfitting near the end on this 1 MB text (val 26% above train, still falling); dropout 0.1 or
# twice the Muon weight decay end higher (docs/tokenizers.md), so the recipe stays as it is
