# the fine-tune of config/chat_sft.py with LoRA: low-rank adapters on the blocks' matrices train, with the token
# table and head (the new characters' rows must learn); every other weight stays as the base run left it.
# Figures: docs/chat.md#lora
base = 'chat_sft.py'

out_dir = 'out-lora'
wandb_run_name = 'lora'
lora_rank = 8
lora_alpha = 16.0
optimizer = 'adamw'  # the adapters are low-rank by construction: Muon's orthogonal steps are for full matrices
learning_rate = 1e-2  # adapters learn best at about ten times full fine-tuning's rate (Thinking Machines, 2025)
