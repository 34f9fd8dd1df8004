"""Talking to a chat model, scoring its answers on held-out problems, and reinforcement learning on them."""
