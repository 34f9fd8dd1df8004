"""gptkit/base/progress.py: a bar on a terminal, and where the output is a file a plain line every LINE_EVERY_S
seconds of long work (none for short work); every bar of the package made by it."""

import io

from tqdm import tqdm

from conftest import REPO
from gptkit.base import progress
from gptkit.base.progress import Lines


class Clock:
    """time.monotonic as the test sets it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_file_gets_a_line_every_interval_of_long_work_and_none_of_short(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    bar = progress.progress(total=10, desc="training an SAE", unit="step", file=out, leave=False)
    assert isinstance(bar, Lines)
    for t in (5, 15, 21, 30, 45):  # a step at each of these seconds
        clock.now = 1000.0 + t
        bar.update(1)
    bar.set_postfix_str("dead 0.0%")
    clock.now = 1000.0 + 66
    bar.update(1)
    bar.close()
    assert out.getvalue().splitlines() == [
        "training an SAE: 3/10 step (30%), 00:21 elapsed, about 00:49 left",
        "training an SAE: 5/10 step (50%), 00:45 elapsed, about 00:45 left",
        "training an SAE: 6/10 step (60%), 01:06 elapsed, about 00:44 left, dead 0.0%",
    ]
    short = io.StringIO()
    with progress.progress(range(3), desc="ablating heads", unit="pass", file=short) as passes:
        assert list(passes) == [0, 1, 2]
    assert short.getvalue() == ""


def test_bytes_and_percent_read_as_such(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    read = progress.progress(total=5_000_000, desc="tokenizing", unit="B", unit_scale=True, file=out)
    trained = progress.progress(total=100, desc="training", unit="%", file=out)
    clock.now += 30
    read.update(1_200_000)
    trained.update(45.3)
    assert out.getvalue().splitlines() == ["tokenizing: 1.20MB/5.00MB (24%), 00:30 elapsed, about 01:35 left",
                                           "training: 45%, 00:30 elapsed, about 00:36 left"]


def test_a_terminal_gets_tqdms_bar():
    bar = progress.progress(total=3, desc="evaluating", unit="batch", file=Terminal(), leave=False)
    assert isinstance(bar, tqdm)
    bar.close()


def test_every_bar_of_the_package_is_made_by_the_helper():
    """A tqdm made elsewhere would be silent (or redraw \\r-lines) in a log: only progress.py makes one."""
    makers = [p.relative_to(REPO).as_posix() for p in (REPO / "gptkit").rglob("*.py")
              if "tqdm" in p.read_text(encoding="utf-8")]
    assert makers == ["gptkit/base/progress.py"]
