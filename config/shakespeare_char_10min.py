# a wider model trained for ten minutes on a 2-core CPU, wall time start-up included: the five-minute
# preset with a 192-wide block; figures and how the settings were found: docs/speed.md
# prepare the data first: python data/prepare.py
base = 'shakespeare_char_5min.py'

out_dir = 'out-10min'
wandb_run_name = 'cpu-10min'

n_embd = 192  # with twice the time, a wider model pays
muon_weight_decay = 0.6  # a wider model overfits sooner: more decay
# where the 192-wide model would see too few tokens per parameter in 600 s, a 128-wide one 5 layers deep, with
# the 5-minute preset's decay, then a layer fewer at a time (docs/speed.md); a shape you set yourself is what trains
fit_shapes = '4x192, 5x128, 4x128, 3x128, 2x128'
smaller_muon_weight_decay = 0.3  # a narrower model overfits later: less decay (docs/speed.md#what-was-tried)

max_time = 600  # seconds for the whole run idle, planned as steps (compiled steps run faster than the eager ones timed)
