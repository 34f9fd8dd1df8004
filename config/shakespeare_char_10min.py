# a wider model trained for ten minutes on a 2-core CPU, wall time start-up included: the five-minute
# preset with a 192-wide block (1.8M parameters); figures and how the settings were found: docs/speed.md
# prepare the data first: python data/prepare.py
base = 'shakespeare_char_5min.py'

out_dir = 'out-10min'
wandb_run_name = 'cpu-10min'

n_embd = 192  # with twice the time, a wider model pays
muon_weight_decay = 0.6  # a wider model overfits sooner: more decay
# where the 192-wide model would see too few tokens per parameter in 600 s (config/shakespeare_char.py),
# a 128-wide one trains instead, 5 layers deep (1.0M parameters), with the 5-minute preset's decay: paired
# on such a machine, a fifth layer ended lower than the 5-minute preset's 4 (docs/speed.md)
smaller_n_layer = 5
smaller_n_embd = 128
smaller_muon_weight_decay = 0.3  # 0.6 ended higher for the 128-wide model over ten minutes (docs/speed.md)

max_time = 600  # seconds for the whole run: start-up, compilation and the final whole-split score included
