# reinforcement learning on a chat model's own answers: it samples 16 answers to each of 64 training problems a step,
# a program checks them, and REINFORCE pushes up the right ones (the group's mean reward as the baseline, as
# nanochat). It sharpens what the model can already sample, so it starts from a fine-tune that is right about
# half the time. Figures: docs/chat.md#rl-as-sharpening
# first: python train.py config/chat_sft_early.py; then python rl.py config/chat_rl.py

init_from = 'out-chat-early'  # an SFT run's folder
init_checkpoint = 'latest'  # where it ended (its score's stop); or 'best' (its lowest val loss), or a snapshot, iter:N
out_dir = 'out-rl'
tasks = 'addition'
problems_per_step = 64
samples = 16
temperature = 1.0
max_new_tokens = 16
learning_rate = 4e-4
max_iters = 150
eval_interval = 50
eval_problems = 200
eval_samples = 8
wandb_log = False
wandb_project = 'chat'
wandb_run_name = 'rl'
