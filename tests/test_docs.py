"""The README and the docs/ pages: every relative link and picture points at a file (and heading) that exists,
every docs page is linked from the README, every command shown names a script that exists, and the README's
test command is the one CI runs."""

import re
from collections import Counter

from conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target) and ![alt](target)
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.IGNORECASE)

# `python X.py` (not `python -m` / `python -c`) and `torchrun [options] X.py`; config files anywhere
PYTHON_SCRIPT = re.compile(r"\bpython3?\s+([\w./-]+\.py)\b")
TORCHRUN_SCRIPT = re.compile(r"\btorchrun(?:\s+-[-\w]*(?:=\S+)?)*\s+([\w./-]+\.py)\b")
CONFIG_FILE = re.compile(r"(?<![\w/])(config/[\w.-]+\.py)\b")


def prose(text):
    """The page without code blocks and inline code, where a `](...)` or `# ...` is not markdown."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(page):
    """Every anchor the page's headings make, with GitHub's -1, -2, ... for repeated ones."""
    seen, found = Counter(), set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def targets(page):
    """The relative link and picture targets of a page: [(path part, anchor or '')]."""
    text = prose(page.read_text(encoding="utf-8"))
    found = LINK.findall(text) + IMG_SRC.findall(text)
    return [tuple(t.partition("#")[::2]) for t in found if not EXTERNAL.match(t)]


def test_every_relative_link_and_picture_exists():
    """Each `](path)`, `](path#anchor)` and `<img src=...>` target of README.md and docs/*.md is a file or
    folder relative to the page; an anchor into a markdown page names one of its headings."""
    missing = []
    for page in PAGES:
        for path, anchor in targets(page):
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                missing.append(f"{page.relative_to(REPO)}: {path}#{anchor} (no such heading)")
    assert not missing, "\n".join(missing)


def test_the_readme_links_every_docs_page_and_every_page_links_back():
    """Every docs/*.md is linked from README.md, and begins with a back-link to it."""
    docs = PAGES[1:]
    assert docs, "no docs/*.md pages"
    linked = {(REPO / path).resolve() for path, _ in targets(README) if path}
    assert not [p.name for p in docs if p.resolve() not in linked]
    for page in docs:
        first = page.read_text(encoding="utf-8").lstrip().splitlines()[0]
        assert "](../README.md)" in first, (page.name, first)


def test_every_command_names_a_script_that_exists():
    """Every `python X.py`, `torchrun ... X.py` and `config/*.py` named in README.md or docs/*.md (code blocks
    included) is a file in the repo; `python -m ...` is left alone."""
    named, missing = set(), []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for script in PYTHON_SCRIPT.findall(text) + TORCHRUN_SCRIPT.findall(text) + CONFIG_FILE.findall(text):
            named.add(script)
            if not (REPO / script).is_file():
                missing.append(f"{page.relative_to(REPO)}: {script}")
    assert not missing, "\n".join(missing)
    assert {"data/prepare.py", "train.py", "sample.py", "config/shakespeare_char.py"} <= named, named


def test_the_readme_shows_the_test_command_ci_runs():
    """The pytest line of .ci/run appears, as it is, in README.md."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [line for line in ci if line.startswith("python -m pytest")]
    assert commands, ci
    readme = README.read_text(encoding="utf-8")
    assert all(command in readme for command in commands), commands
