"""Pictures written whole: gptkit/interp/pictures.py's save."""

import subprocess
import sys

import matplotlib.pyplot as plt
from PIL import Image

from conftest import REPO

OTHER = """
import sys
import matplotlib.pyplot as plt
from gptkit.interp import pictures
fig, ax = plt.subplots(figsize=(2, 2))
ax.plot(range(100))
pictures.save(fig, sys.argv[1], dpi=50)
"""


def test_two_commands_drawing_one_picture_at_once_leave_it_whole(tmp_path, capsys):
    """Another command (a second analyze.py heads on the run) writes the same picture while this one writes it:
    each command's picture goes aside in a file of its own, so both end, and the picture is one of theirs, whole."""
    from gptkit.interp import pictures

    path = tmp_path / "heads.png"
    fig, ax = plt.subplots(figsize=(8, 8))
    ax.imshow([[i * j for j in range(200)] for i in range(200)])
    savefig = fig.savefig

    def meanwhile_another(f, **how):  # the other command draws and writes it while this one writes its own
        subprocess.run([sys.executable, "-c", OTHER, str(path)], cwd=REPO, check=True, capture_output=True)
        savefig(f, **how)

    fig.savefig = meanwhile_another
    pictures.save(fig, path, dpi=50)
    assert capsys.readouterr().out == f"wrote {path}\n"
    with Image.open(path) as image:
        image.load()
        assert image.size == (400, 400)  # this command's, the last to be renamed in
    assert [p.name for p in tmp_path.iterdir()] == ["heads.png"]
