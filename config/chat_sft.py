# teach the main job's model to answer: supervised fine-tuning (SFT) on conversations of problems a program checks,
# starting from the run in out/ (its best weights), nanoGPT's way of fine-tuning; about three minutes on a 2-core
# CPU.
# Figures and what each setting does: docs/chat.md
# prepare the data first (data/shakespeare_char/input.txt is the text `python data/prepare.py` downloads):
#   python data/prepare.py --synthetic=tasks --mix=data/shakespeare_char/input.txt
# then talk to it with python chat.py --out_dir=out-chat, and score it with --eval

init_from = 'out'  # a run's folder: its model's shape and best weights; the vocabulary grows to the new characters
out_dir = 'out-chat'
dataset = 'tasks'
train_on = 'answers'  # the loss counts the assistant's answers and the text mixed in, not the questions
eval_interval = 50
eval_iters = 2
log_interval = 25
snapshots = 5  # earlier states of the fine-tune, for rl.py to start from one (--init_checkpoint=iter:N)
wandb_log = False
wandb_project = 'chat'
wandb_run_name = 'sft'

batch_size = 32
block_size = 128
batch_order = 'epochs'

# the base run's optimizers; Muon's rate a quarter above the base run's (the tables' a tenth of theirs): at the
# base's 0.02 the sums came in so late from some bases that 1,700 steps missed them, and lower rates learned them
# later still; what keeps the text is how much of it the fine-tune reads (prepare's --mix_share), and a table that
# moves the rows of the text's characters less (figures in docs/chat.md#sft-fine-tuning-your-own-run)
optimizer = 'muon'
muon_lr = 0.025
learning_rate = 3e-3
embedding_lr = 0.003  # a tenth of the base run's
beta2 = 0.95
lr_schedule = 'wsd'
warmup_iters = 0
warmdown_frac = 0.5
min_lr = 0.0
ema_decay = 0.98
# steps, not seconds: the sums are learned in a sudden change after a number of steps, and a budget in seconds,
# planned at a step's measured speed, moved them with the measurement (docs/chat.md#sft-fine-tuning-your-own-run)
max_time = 0
max_iters = 1700
final_eval_tokens = 65536  # the run's final score on a sample of val: chat.py --eval is the stage's score
compile = False
