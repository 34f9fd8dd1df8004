"""Generating text from a model: decoding with a KV cache, and the prompts it starts from."""
