"""The shape of the house: at the root only what a user runs (and model.py), the machinery in gptkit/ in
layers that import only downwards, no import cycles, no script imported by anything, and the model importing
nothing of the project but the optimizers its configure_optimizers builds."""

import ast

from conftest import REPO

# the commands at the root (and data/prepare.py)
SCRIPTS = {"train", "sample", "plot", "export", "bench", "lab", "explore", "analyze", "chat", "rl"}
# the package's folders, one concern each, in layers, lowest first: a module may import its own layer or those
# below, never one above; the benchmarks, outside the package, sit on top
LAYERS = {
    "foundations, and the optimizers model.py builds": {"base", "optim"},
    "the model": {"model"},
    "parts: data, sampling, other tools' models, the machine": {"data", "sampling", "interop", "machine"},
    "a run's files": {"run"},
    "training, interpretability, and chat": {"training", "interp", "chat"},
    "the lab and the explorer": {"lab", "explorer"},
    "the benchmarks": {"benchmarks"},
}


def folder_of(module):
    """'gptkit.machine.choices' -> 'machine', 'benchmarks.train_speed' -> 'benchmarks', 'model' -> 'model'."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gptkit" and len(parts) > 2 else parts[0] if parts[0] != "gptkit" else None


def package_modules():
    """{dotted name: path} of every module of the package and of the benchmarks: 'gptkit.machine.choices',
    'benchmarks.train_speed'."""
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
    assert root <= SCRIPTS | {"model"} and len(root) <= 11, root
    assert not (REPO / "gptkit" / "config").exists() and not (REPO / "config" / "__init__.py").exists()


def test_nothing_imports_a_script_and_the_model_imports_only_the_optimizers_it_builds():
    files = [*REPO.glob("*.py"), *(REPO / "gptkit").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
             REPO / "data" / "prepare.py"]
    for path in files:
        assert not project_imports(path) & SCRIPTS, (path, project_imports(path))
    assert project_imports(REPO / "model.py") == {"gptkit.optim.optimizers"}
    assert project_imports(REPO / "gptkit" / "optim" / "optimizers.py") == set()


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
    """bench.py's COMMANDS maps each subcommand to its module's entry function: a module of its own in benchmarks/,
    which says which subcommand it is."""
    import bench
    assert not (REPO / "gptkit" / "benchmarks").exists()
    modules = {name: run.__module__ for name, (run, _) in bench.COMMANDS.items()}
    assert len(set(modules.values())) == len(modules), modules
    for name, module in modules.items():
        assert module.startswith("benchmarks."), (name, module)
        path = REPO / "benchmarks" / f"{module.removeprefix('benchmarks.')}.py"
        assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))).startswith(f"`bench.py {name}`"), path


def test_no_two_modules_share_a_name_and_no_benchmark_is_named_like_a_script():
    """A module's file name says what it holds: one name, one module (gptkit/ and benchmarks/ together), and a
    benchmark is never taken for the script it measures."""
    names = [path.name for path in package_modules().values()]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    scripts = SCRIPTS | {p.stem for p in REPO.glob("*.py")} | {"prepare"}
    assert sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem in scripts) == []
