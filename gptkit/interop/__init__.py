"""Other tools' models: GPT-2 weights from and to Hugging Face transformers, and TransformerLens."""
