# a small character-level GPT on tinyshakespeare that trains in two and a half minutes on a 2-core CPU
# (val ~1.47 on the whole val split; nanoGPT's CPU recipe takes ~80 s here to end at 1.90). On a GPU it
# simply finishes its max_iters sooner. nanoGPT's 6-layer baby GPT is config/shakespeare_char_gpu.py;
# longer budgets: config/shakespeare_char_5min.py and config/shakespeare_char_10min.py.
# prepare the data first: python data/prepare.py

out_dir = 'out'
eval_interval = 25  # evaluations are cheap (2 fixed batches per split) and show progress often
eval_iters = 2
log_interval = 25

wandb_log = False  # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'cpu-3min'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 32  # 4,096 tokens per step: more, cheaper steps beat fewer big ones in a 150-second budget
block_size = 128

# small and modern: 0.8M parameters, rotary positions, QK-norm, ReLU^2, untied head,
# residual projections starting at zero; on a CPU, a small model seeing more text wins
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0  # costs ~40% of the steps on a CPU; Muon weight decay (below) regularises for free
bias = False
pos_emb = 'rope'
norm = 'layernorm'  # eager CPU: one fused kernel, ~6x faster than RMSNorm's; 703 steps in 150 s vs 642
qk_norm = True
mlp_act = 'relu2'
tie_weights = False
zero_init_proj = True

# Muon on the hidden matrices, AdamW on embeddings, head and gains
optimizer = 'muon'
muon_lr = 0.02
# six epochs in 150 s begin to overfit: with decay two runs ended at 1.464 and 1.468 on the whole val
# split, one without at 1.486; in a 65 s budget it made no difference (1.548 against 1.543)
muon_weight_decay = 0.3
learning_rate = 3e-3
embedding_lr = 0.03  # each step touches only the rows of the characters it saw: let them move faster
beta2 = 0.95

# warmup, a short stable phase, then a linear decay to zero over the last 80% of the time budget
lr_schedule = 'wsd'
warmup_iters = 10
warmdown_frac = 0.8  # decay over the last 40/60/80%: 1.60 at 137/130/125 s, final 1.567/1.559/1.557
min_lr = 0.0
max_iters = 2000
max_time = 150  # seconds; the schedule follows whichever runs out first, iterations or time

# compiling the blocks costs ~8 s before the first step (a few with a warm cache) and then makes steps
# ~20% faster: worth it in the 5- and 10-minute presets, not in a 150 s budget that should show a good
# loss within seconds; laptops may also lack the C++ compiler it needs
compile = False
