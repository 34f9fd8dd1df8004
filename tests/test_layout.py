"""The shape of the house: at the root only what a user runs (and model.py), the machinery in gptkit/ in
layers that import only downwards, no import cycles, no script imported by anything, and the model importing
nothing of the project."""

import ast

from conftest import REPO

# the commands at the root (and data/prepare.py)
SCRIPTS = {"train", "sample", "plot", "export", "bench", "lab", "explore", "analyze"}
# the package's folders, one concern each, in layers, lowest first: a module may import its own layer or those
# below, never one above; the benchmarks, outside the package, sit on top
LAYERS = {
    "foundations": {"base"},
    "the model": {"model"},
    "parts: data, sampling, other tools' models, the machine": {"data", "sampling", "interop", "machine"},
    "a run's files": {"run"},
    "training, and interpretability": {"training", "interp"},
    "the lab and the explorer": {"lab", "explorer"},
    "the benchmarks": {"benchmarks"},
}


def folder_of(module):
    """'gptkit.machine.choices' -> 'machine', 'benchmarks.train' -> 'benchmarks', 'model' -> 'model'."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gptkit" and len(parts) > 2 else parts[0] if parts[0] != "gptkit" else None


def package_modules():
    """{dotted name: path} of every module of the package and of the benchmarks: 'gptkit.machine.choices',
    'benchmarks.train'."""
    return {".".join(p.relative_to(REPO).with_suffix("").parts): p
            for p in [*(REPO / "gptkit").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")] if p.stem != "__init__"}


def project_imports(path):
    """The project modules a file imports: 'model', 'train', 'gptkit.base.settings', ..."""
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
    files = [*REPO.glob("*.py"), *(REPO / "gptkit").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
             REPO / "data" / "prepare.py"]
    for path in files:
        assert not project_imports(path) & SCRIPTS, (path, project_imports(path))
    assert project_imports(REPO / "model.py") == set()


def test_the_package_has_no_import_cycles():
    graph = {module: project_imports(path) for module, path in package_modules().items()}
    graph["model"] = project_imports(REPO / "model.py")

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ()))

    assert not [m for m in graph if reaches(m, m)], "import cycle"


def test_every_module_sits_in_a_folder_of_one_concern_and_imports_only_its_layer_or_those_below():
    level = {folder: i for i, layer in enumerate(LAYERS.values()) for folder in layer}
    package = package_modules()
    assert {folder_of(m) for m in package} == set(level) - {"model"}, "every module sits in a folder of a layer"
    for module, path in [*package.items(), ("model", REPO / "model.py")]:
        mine = level[folder_of(module)]
        above = [m for m in project_imports(path) if level.get(folder_of(m), -1) > mine]
        assert not above, f"{module} imports {above}, from a layer above its own"


def test_benchmarks_live_outside_the_package_one_module_per_subcommand():
    import bench
    assert not (REPO / "gptkit" / "benchmarks").exists()
    assert set(bench.COMMANDS) <= {p.stem for p in (REPO / "benchmarks").glob("*.py")}
