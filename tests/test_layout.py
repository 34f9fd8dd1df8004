"""The shape of the house: at the root only what a user runs (and model.py), the machinery in gptkit/ in
layers that import only downwards, no import cycles, no script imported by anything, and the model importing
nothing of the project."""

import ast

from conftest import REPO

# the commands at the root (and data/prepare.py)
SCRIPTS = {"train", "sample", "plot", "export", "bench", "lab", "explore", "analyze"}
# gptkit/benchmarks/: one module per `bench.py` subcommand, and what several of them share
BENCHMARKS = ["common", "sample", "train", "presets", "busy", "throughput", "dropout", "hooks", "explore", "prepare",
              "analyze", "tokenizers", "startup"]
# the package's layers, lowest first: a module may import its own layer or those below, never one above
LAYERS = {
    "foundations": {"gptkit.errors", "gptkit.config", "gptkit.prompts", "gptkit.locks"},
    "the model": {"model"},
    "parts": {"gptkit.tokenizer", "gptkit.bpe_training", "gptkit.corpus", "gptkit.dataset", "gptkit.metrics", "gptkit.checkpoint",
              "gptkit.hf_interop", "gptkit.decoding", "gptkit.inspection", "gptkit.flops", "gptkit.optim",
              "gptkit.signals", "gptkit.sources", "gptkit.shards", "gptkit.dataset_folder", "gptkit.kernels",
              "gptkit.lens_interop"},
    "measured choices, processes and settings": {"gptkit.timing", "gptkit.choices", "gptkit.runtime",
                                                 "gptkit.train_config", "gptkit.wisdom"},
    "a run": {"gptkit.rundir", "gptkit.resume", "gptkit.training", "gptkit.reporting", "gptkit.pictures",
              "gptkit.experiments"},
    "what the lab, the explorer and the benchmarks do": {"gptkit.lab", "gptkit.explorer", "gptkit.explorer_guard",
                                                         "gptkit.explorer_experiments",
                                                         *(f"gptkit.benchmarks.{name}" for name in BENCHMARKS)},
}


def package_modules():
    """{dotted name: path} of every module of the package, a subpackage's named as 'gptkit.benchmarks.train'."""
    return {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in (REPO / "gptkit").rglob("*.py")
            if p.stem != "__init__"}


def project_imports(path):
    """The project modules a file imports: 'model', 'train', 'gptkit.config', ..."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # from gptkit(.sub) import module
    package = package_modules()
    return {n for n in names if n in package or n in SCRIPTS | {"model"}}


def test_the_root_holds_only_commands_and_the_model():
    root = {p.stem for p in REPO.glob("*.py")}
    assert root <= SCRIPTS | {"model"} and len(root) <= 9, root
    assert not (REPO / "gptkit" / "config").exists() and not (REPO / "config" / "__init__.py").exists()


def test_nothing_imports_a_script_and_the_model_imports_nothing_of_the_project():
    files = [*REPO.glob("*.py"), *(REPO / "gptkit").rglob("*.py"), REPO / "data" / "prepare.py"]
    for path in files:
        assert not project_imports(path) & SCRIPTS, (path, project_imports(path))
    assert project_imports(REPO / "model.py") == set()


def test_the_package_has_no_import_cycles():
    graph = {module: project_imports(path) for module, path in package_modules().items()}
    graph["model"] = project_imports(REPO / "model.py")

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ()))

    assert not [m for m in graph if reaches(m, m)], "import cycle"


def test_every_module_imports_only_its_own_layer_or_those_below():
    level = {module: i for i, layer in enumerate(LAYERS.values()) for module in layer}
    package = package_modules()
    assert set(package) | {"model"} == set(level), "every module belongs to one layer"
    for module in level:
        path = package.get(module, REPO / "model.py")
        above = [m for m in project_imports(path) if level.get(m, -1) > level[module]]
        assert not above, f"{module} imports {above}, from a layer above its own"
