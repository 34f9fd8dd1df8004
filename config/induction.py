# induction heads forming on a laptop: a two-layer attention-only model (no MLP, no token shift) learns to copy
# random letter strings written twice, with a previous-token head in layer 0 and an induction head in layer 1, in
# a phase change a few hundred steps in. A minute or three on a 2-core CPU; figures: docs/watch_it_learn.md
# prepare the data first: python data/prepare.py --synthetic=repeats

out_dir = 'out-induction'
# the timeline (analyze.py timeline) may record at steps 1, 2, 4, ... up to the first evaluation and then at each,
# where the run can afford it (its records take at most 3% of its time): every 25 steps gives the records steps to
# land on in the phase change (steps 150 to 300 or so); two batches an evaluation keep their cost as it was
eval_interval = 25
eval_iters = 2
log_interval = 50
wandb_run_name = 'induction'

dataset = 'repeats'
batch_size = 16
block_size = 128  # the longest pair (48 letters) and what came before it; the induction score reads 52 tokens
batch_order = 'epochs'

# one head a layer: with two, two layer-1 heads shared the copying (induction scores 0.46 and 0.35); with four,
# 16 wide each, none had formed by step 3,000 (docs/corpora.md#synthetic-text)
n_layer = 2
n_head = 1
n_embd = 64
mlp = False
token_shift = False  # it would hand layer 1 the previous letter itself, the job a layer-0 head is to learn
dropout = 0.0
bias = False
pos_emb = 'rope'
norm = 'layernorm'
qk_norm = True
tie_weights = False
zero_init_proj = True

# the default's recipe (config/shakespeare_char.py)
optimizer = 'muon'
muon_lr = 0.02
muon_weight_decay = 0.3
learning_rate = 3e-3
embedding_lr = 0.03
beta2 = 0.95
lr_schedule = 'wsd'
warmup_iters = 0
warmdown_frac = 0.8
min_lr = 0.0
ema_decay = 0.98

# steps, not seconds: the same command trains the same model; and the shape stays as set here (no fit_shapes,
# no min_tokens_per_param)
max_iters = 3000
max_time = 0
# weights kept at 10 of the steps recorded, dense where the timeline moves fastest (the phase change) and early
# on: the explorer's slider passes through the change; analyze.py and explore.py open them with iter:N
snapshots = 10

compile = False  # a minute's run would spend much of it compiling
# one thread: the same command gives the same model bit for bit. threads=0 may change its thread count as the
# run goes, which changes the sums' rounding (two runs ended at val loss 2.2140 and 2.2142); one costs ~20% time
threads = 1
