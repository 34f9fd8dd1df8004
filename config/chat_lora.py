# the fine-tune of config/chat_sft.py with LoRA: low-rank adapters on attention's q, k, v, the MLP's first matrix,
# the token table and the head train (the new characters' rows learn through the table's); every weight of the
# base run stays as it left it (model.py's LoRALinear and LoRAEmbedding).
# Figures: docs/chat.md#lora
base = 'chat_sft.py'

out_dir = 'out-lora'
wandb_run_name = 'lora'
lora_rank = 8
lora_alpha = 16.0
optimizer = 'adamw'  # the adapters are low-rank by construction: Muon's orthogonal steps are for full matrices
learning_rate = 1e-2  # adapters learn best at about ten times full fine-tuning's rate (Thinking Machines, 2025)
