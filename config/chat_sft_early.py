# config/chat_sft.py stopped early, where the sums are half learned: RL sharpens what a model can already sample,
# so config/chat_rl.py starts from a fine-tune right about half the time. Sums are learned in a sudden change a
# few hundred steps long, whose place moves with the base model, so the run stops by the score, not the step: at
# each evaluation (every 50 steps, at a constant rate) it scores the sums' held-out pass@1, 8 answers to each of 200
# problems at temperature 1, and ends at the first that reaches 40%:
#   python train.py config/chat_sft_early.py
#   python chat.py --out_dir=out-chat-early --checkpoint=latest --eval --tasks=addition --samples=8 --temperature=1
# Figures: docs/chat.md#rl-as-sharpening
base = 'chat_sft.py'

out_dir = 'out-chat-early'
wandb_run_name = 'sft-early'
stop_task = 'addition'
stop_pass_at_1 = 0.4
max_iters = 3000  # at most: the sums' pass@1 has passed 40% by 1,250 steps from every base measured
decay_lr = False  # a constant rate: the run may end at any evaluation
snapshots = 0
