# config/chat_sft.py stopped early, where the sums are half learned: RL sharpens what a model can already sample,
# so config/chat_rl.py starts from a fine-tune right about half the time. Sums are learned in a sudden change a
# few hundred steps long, whose place moves with the base model, so stop by the score, not the step: train 700
# steps at a constant rate, then see held-out pass@1 and continue 50 steps at a time while it is under 40%:
#   python train.py config/chat_sft_early.py
#   python chat.py --out_dir=out-chat-early --eval --tasks=addition --samples=8 --temperature=1
#   python train.py config/chat_sft_early.py --init_from=auto --max_iters=750   # and so on
# Figures: docs/chat.md#rl-as-sharpening
base = 'chat_sft.py'

out_dir = 'out-chat-early'
wandb_run_name = 'sft-early'
max_iters = 700
decay_lr = False  # a constant rate, so that continuing it 50 steps at a time trains as one run would
snapshots = 0
