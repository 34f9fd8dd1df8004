# the default's recipe (config/shakespeare_char.py: Muon, rotary positions, QK-norm, ReLU^2, token shift,
# weight averaging) at nanoGPT's baby-GPT shape, for 30 seconds on a GPU, wall time start-up included. On an
# H200 it passed nanoGPT's 1.4697 2.8-3.5x sooner than nanoGPT's own code did, and on an H100 3.8-4.2x sooner
# than nanoGPT's own code reached its best (1.4701), one run after the other on the same machine, each from
# cold compile caches; figures: docs/speed.md#on-a-gpu
# prepare the data first: python data/prepare.py
base = 'shakespeare_char.py'

out_dir = 'out-gpu-30s'
wandb_run_name = 'gpu-30s'
eval_interval = 100  # each evaluation with its checkpoint writes took about 0.7 s on the H200, as long as 25 steps
eval_iters = 20
log_interval = 50

# nanoGPT's baby GPT: 10.7M parameters, 64 x 256 tokens a step
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
dropout = 0.2  # about 500 steps see the training text eight times over: it overfits without

max_iters = 100000  # out of reach: the clock ends the run
max_time = 30  # seconds for the whole run: start-up and the final whole-split score included
min_tokens_per_param = 0  # the configured shape, untimed: a GPU has time for it

# eager: from a cold cache, compiling took longer than the whole budget (one step in 32 s on the H200); eager
# steps took about twice as long there (25-35 ms against 17 ms), and the run needs only 300-400 of them
compile = False
