"""The benchmarks behind `python bench.py NAME`: one module per benchmark, each with its options (a config
dataclass), its entry function main(argv) and its table, and `common` for what several of them share."""
