# the default's model (config/shakespeare_char.py) trained for five minutes on a 2-core CPU, wall time
# start-up included, compiled; figures and how the settings were found: docs/speed.md
# prepare the data first: python data/prepare.py
base = 'shakespeare_char.py'

out_dir = 'out-5min'
eval_interval = 100
log_interval = 100
wandb_run_name = 'cpu-5min'

max_time = 300  # seconds for the whole run idle, planned as steps (compiled steps run faster than the eager ones timed)
ema_decay = 0.99  # a longer run scored lower averaging over about 100 steps than over 50 (docs/speed.md)
# the default's warmup and shape threshold before they changed for its 150 s, as this preset and the
# 10-minute one were measured with (docs/speed.md)
warmup_iters = 10
min_tokens_per_param = 6

# compiling the blocks costs seconds up front and makes every step faster: worth it over five minutes
compile = True
