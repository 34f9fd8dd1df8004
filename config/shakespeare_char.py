# a small character-level GPT on tinyshakespeare that trains in two and a half minutes on a 2-core CPU;
# on a GPU it simply finishes its max_iters sooner. Figures, and how these settings were found, are in
# docs/speed.md. nanoGPT's 6-layer baby GPT is config/shakespeare_char_gpu.py; longer budgets build on
# this file: config/shakespeare_char_5min.py and config/shakespeare_char_10min.py.
# prepare the data first: python data/prepare.py

out_dir = 'out'
# evaluations (2 fixed batches per split) come out of the budget: every 50 steps costs less than every 25, and
# ended as low (docs/speed.md#what-was-tried); the log still shows the loss every 25
eval_interval = 50
eval_iters = 2
log_interval = 25
# the weights at 5 log-spaced steps, about 3.3 MB each for the 4 x 128 model: any tool opens the run as it was
# then with --checkpoint=iter:N (docs/analysis.md#python-analyzepy-timeline)
snapshots = 5

wandb_log = False  # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'cpu-3min'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 32  # 4,096 tokens per step: more, cheaper steps beat fewer big ones in a 150-second budget
block_size = 128
batch_order = 'epochs'  # every window once an epoch: lower than nanoGPT's random offsets, at equal steps and timed

# small and modern: rotary positions, QK-norm, ReLU^2, untied head, residual projections starting at zero;
# on a CPU, a small model seeing more text wins (docs/speed.md#what-was-tried)
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0  # in a budget this short it loses more than it gives back; Muon weight decay (below) regularises for free
bias = False
pos_emb = 'rope'
norm = 'layernorm'  # it normalises in one fused kernel on an eager CPU, where RMSNorm runs several: more steps
qk_norm = True
mlp_act = 'relu2'
tie_weights = False
zero_init_proj = True
# each block also reads the previous character's stream (RWKV's token shift, a learned share per channel): a
# character-level model learns most from the character just before (docs/speed.md#what-was-tried)
token_shift = True

# Muon on the hidden matrices, AdamW on embeddings, head and gains
optimizer = 'muon'
muon_lr = 0.02
muon_weight_decay = 0.3  # several epochs in 150 s begin to overfit: decay holds val loss down
learning_rate = 3e-3
embedding_lr = 0.03  # each step touches only the rows of the characters it saw: let them move faster
beta2 = 0.95

# no warmup, a short stable phase, then a linear decay to zero over the last 80% of the time budget
lr_schedule = 'wsd'
warmup_iters = 0  # a short run cannot spare steps at a low rate (docs/speed.md#what-was-tried)
warmdown_frac = 0.8  # the longest decay tried ended lowest (docs/speed.md#what-was-tried)
min_lr = 0.0
# seconds for the whole run on this machine idle, the final score included: planned as steps from this machine's
# measured idle speed (kept with its wisdom), so the same command trains the same steps however busy the machine
# is; a busy machine takes longer, and the run says so. wall_clock = True stops at the clock instead
max_time = 150
# evaluations, checkpoints and the final score take a moving average of the weights, over about 50 steps by
# the end of the decay, which smooths the last steps' noise (docs/speed.md#what-was-tried)
ema_decay = 0.98

# the shapes this preset may train, its own first: the largest that sees min_tokens_per_param tokens per
# parameter in max_time on this machine (measured once, then read). A shape you set yourself, here or on the
# command line, is what trains (docs/configuration.md#keys-worth-knowing)
fit_shapes = '4x128, 3x128, 2x128'
min_tokens_per_param = 8

# compiling the blocks costs seconds before the first step and then makes steps faster: worth it in the
# 5- and 10-minute presets, not in a 150 s budget that should show a good loss within seconds; laptops
# may also lack the C++ compiler it needs
compile = False
