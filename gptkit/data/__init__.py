"""Data and tokenizers: reading a corpus, training a BPE, preparing a dataset, and the dataset a run reads."""
