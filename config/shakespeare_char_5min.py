# the default's model trained for five minutes on a 2-core CPU, wall time start-up included:
# val ~1.44 on the whole val split, below nanoGPT's 1.4697 from its 10.7M-parameter GPT on an A100
# prepare the data first: python data/prepare.py

out_dir = 'out-5min'
eval_interval = 100
eval_iters = 2
log_interval = 100

wandb_log = False  # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'cpu-5min'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 32
block_size = 128

# config/shakespeare_char.py's model: 0.8M parameters, rotary, QK-norm, ReLU^2, untied head
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0  # dropout costs ~40% of the steps on a CPU; weight decay regularises for free
bias = False
pos_emb = 'rope'
norm = 'layernorm'
qk_norm = True
mlp_act = 'relu2'
tie_weights = False
zero_init_proj = True

optimizer = 'muon'
muon_lr = 0.02
# ~15 epochs in five minutes overfit this model: in two eager 300 s runs, without decay train/val
# ended at 1.07/1.54 (whole split 1.509), with 0.3 at 1.16/1.47 (whole split 1.450)
muon_weight_decay = 0.3
learning_rate = 3e-3
embedding_lr = 0.03
beta2 = 0.95

lr_schedule = 'wsd'
warmup_iters = 10
warmdown_frac = 0.8
min_lr = 0.0
max_iters = 100000  # out of reach: the clock ends the run
max_time = 285  # seconds of training; start-up, compilation and the final whole-split score fit in 300

# per-block compilation: ~8 s the first time (a second or two with a warm cache), then ~25% faster steps
compile = True
