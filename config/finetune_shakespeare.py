# finetune GPT-2 on tinyshakespeare (BPE), nanoGPT's finetune_shakespeare recipe
# prepare the data first (the GPT-2 tokenizer, so the pretrained embeddings apply):
#   python data/prepare.py --input=data/shakespeare_char/input.txt --name=shakespeare --tokenizer=gpt2
# (data/shakespeare_char/input.txt is what an online `python data/prepare.py` downloads; offline, pass your
# own copy of the text as --input)
# then: python train.py config/finetune_shakespeare.py

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft'

dataset = 'shakespeare'

# 'gpt2' (124M) runs on a CPU; on a GPU pick a bigger one: 'gpt2-medium' (350M),
# 'gpt2-large' (774M) or 'gpt2-xl' (1558M, nanoGPT's choice); or a folder saved with save_pretrained
init_from = 'gpt2'

# val loss bottoms out within an epoch or two: best.pt keeps that model, latest.pt where the run ended

# the number of examples per iter:
# 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter
# shakespeare has 304,222 train tokens, so 1 epoch ~= 9.3 iters
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
