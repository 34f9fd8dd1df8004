# config/chat_sft.py stopped early, at 950 steps whatever the machine: the sums half learned (held-out pass@1
# about 60% sampling at temperature 1, the greedy answer right about 87% of the time), where RL has something to
# sharpen. config/chat_rl.py starts from it. Figures: docs/chat.md#rl-as-sharpening
base = 'chat_sft.py'

out_dir = 'out-chat-early'
wandb_run_name = 'sft-early'
max_time = 0  # steps, not seconds: the half-learned point is a number of steps
max_iters = 950
snapshots = 0
