# the default's recipe (config/shakespeare_char.py: Muon, rotary positions, QK-norm, ReLU^2, token shift,
# weight averaging) at nanoGPT's baby-GPT shape, for 30 seconds on a GPU, wall time start-up included: it
# passes nanoGPT's 1.4697 well before nanoGPT's own code reaches its best, one run after the other on the same
# machine, each from cold compile caches; figures: docs/speed.md#on-a-gpu
# prepare the data first: python data/prepare.py
base = 'shakespeare_char.py'

out_dir = 'out-gpu-30s'
wandb_run_name = 'gpu-30s'
eval_interval = 100  # an evaluation with its checkpoint writes costs the time of many steps: fewer leave more
eval_iters = 20
log_interval = 50

# nanoGPT's baby GPT: 10.7M parameters, 64 x 256 tokens a step
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
dropout = 0.2  # 30 s of steps see the training text several times over: it overfits without

max_iters = 100000  # out of reach: the clock ends the run
max_time = 30  # seconds for the whole run: start-up and the final whole-split score included
wall_clock = True  # a race against nanoGPT's own code: the clock ends the run, whatever the steps
min_tokens_per_param = 0  # the configured shape, untimed: a GPU has time for it

# eager: from a cold cache, compiling took longer than the whole budget; eager steps are slower, but the run
# needs only a few hundred of them (docs/speed.md#on-a-gpu)
compile = False
