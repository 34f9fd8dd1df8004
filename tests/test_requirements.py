"""What the README's set-up installs is what the tools need: every third-party module the tools import is listed in
requirements.txt (the benchmarks': requirements-bench.txt), or is one of the optional packages whose install
command the docs give and which the tools import only inside the functions that need them; and in a fresh virtual
environment built by the README's set-up commands alone, every lesson runs on a tiny run."""

import ast
import functools
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import EXTRA_TEXT, REPO, check_ok, make_text, train_args

TOOLS = [*REPO.glob("*.py"), REPO / "data" / "prepare.py", *(REPO / "gptkit").rglob("*.py")]
BENCHMARKS = list((REPO / "benchmarks").rglob("*.py"))
PROJECT = {"gptkit", "benchmarks", "model", *(p.stem for p in REPO.glob("*.py"))}
# what the set-up leaves out (TransformerLens, for the comparison with it), with the command the docs give
OPTIONAL = {"transformer_lens": "pip install transformer-lens"}


def imports_of(path):
    """(top-level module, whether imported at module level rather than in a function) of each import in a file
    of a module outside the standard library and the project."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_functions = {id(node) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for node in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for top in {name.split(".")[0] for name in names} - PROJECT - set(sys.stdlib_module_names):
            yield top, id(node) not in in_functions


def normalised(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path):
    """The packages a requirements file lists, with those of the files it includes (-r), their names normalised."""
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r"):
            names |= listed(path.parent / line[2:].strip())
        elif line:
            names.add(normalised(re.match(r"[A-Za-z0-9._-]+", line).group()))
    return names


@functools.cache
def installers():
    return importlib.metadata.packages_distributions()


def packages_of(module):
    """The packages that install an import name (yaml: PyYAML) where this environment has it; else the name."""
    return {normalised(name) for name in installers().get(module, [module])}


@pytest.mark.parametrize("files, requirements", [(TOOLS, "requirements.txt"),
                                                 (BENCHMARKS, "requirements-bench.txt")], ids=["tools", "benchmarks"])
def test_every_third_party_module_imported_is_a_requirement(files, requirements):
    """pydantic and starlette, which the explorer imports itself, once came only as fastapi's; and httpx, which
    bench.py explore imports, only as the test requirements'."""
    wanted = listed(REPO / requirements)
    missing = sorted({f"{module} ({path.relative_to(REPO)})" for path in files for module, _ in imports_of(path)
                      if module not in OPTIONAL and not packages_of(module) & wanted})
    assert not missing, f"imported, and not in {requirements}: {', '.join(missing)}"


def test_optional_packages_have_their_install_command_in_the_docs_and_are_imported_only_where_used():
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert [command for command in OPTIONAL.values() if command not in docs] == []
    at_start = sorted({f"{module} ({path.relative_to(REPO)})" for path in TOOLS
                       for module, at_module_level in imports_of(path) if module in OPTIONAL and at_module_level})
    assert not at_start, f"imported as the module loads, so every tool importing it needs it: {at_start}"


# ----------------------------------------------------------------------------------------- a fresh environment

def pip(python, *args):
    """pip of the environment `python` runs, configured as this machine's pip is (its index, or a local one);
    without compiling what it installs, which only takes time."""
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, PIP_NO_COMPILE="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))


@pytest.fixture(scope="session")
def fresh_env(tmp_path_factory):
    """A virtual environment holding what the README's set-up installs, by its own commands, as written: its
    python. Skipped where no package index here (nor a local one pip is configured with) holds torch."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^## Set up\n+```sh\n(.*?)^```", readme, re.S | re.M).group(1)
    commands = [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.split("#")[0].strip()]
    assert commands and all(command[:2] == ["pip", "install"] for command in commands), commands
    folder = tmp_path_factory.mktemp("venv")
    check_ok(subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True,
                            timeout=300))
    python = folder / "bin" / "python"
    for command in commands:
        proc = pip(python, *command[1:])
        # no index here holds the CPU wheel, said either way (a pip constraint on torch turns it into a conflict)
        unavailable = ("No matching distribution found for torch", "ResolutionImpossible")
        if proc.returncode and command == commands[0] and any(said in proc.stderr for said in unavailable):
            pytest.skip(f"no package index here holds what `{' '.join(command)}` asks for")
        check_ok(proc)
    return python


def notebook_imports(notebook):
    """Every import statement of a notebook's code cells, in order, as one program."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    cells = [cell for cell in cells if cell["cell_type"] == "code"]
    return "\n".join(ast.unparse(node) for cell in cells for node in ast.parse("".join(cell["source"])).body
                     if isinstance(node, (ast.Import, ast.ImportFrom)))


SMALL_SAE = ["--layer=0", "--tokens=4096", "--batch=256", "--features=64", "--k=4", "--eval_tokens=256", "--show=5"]


@pytest.mark.slow
def test_every_lesson_runs_after_the_readme_s_set_up(fresh_env, tmp_path):
    """In the fresh environment: a tiny run prepared and trained; analyze.py features and timeline on it; every
    import of both notebooks; and export.py, which writes the Hugging Face folder."""
    def run(*args, cwd=REPO):
        return subprocess.run([str(fresh_env), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                              timeout=300)

    (tmp_path / "input.txt").write_text(make_text() + EXTRA_TEXT, encoding="utf-8")
    data, out, hf = tmp_path / "data", tmp_path / "out", tmp_path / "hf"
    check_ok(run("data/prepare.py", f"--input={tmp_path / 'input.txt'}", "--name=tiny", f"--data_dir={data}"))
    check_ok(run("train.py", *train_args(data, out, "--max_iters=20", "--eval_interval=10", "--eval_iters=1",
                                         "--snapshots=3", "--attention_path=fused")))
    assert "every feature's contexts:" in check_ok(run("analyze.py", "features", out, *SMALL_SAE)).stdout
    assert "L0H0" in check_ok(run("analyze.py", "timeline", out)).stdout
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        check_ok(run("-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{notebook_imports(notebook)}",
                     cwd=notebook.parent))
    assert check_ok(run("export.py", f"--out_dir={out}", f"--hf_dir={hf}")).stdout.startswith(f"wrote {hf}: GPT-2")
