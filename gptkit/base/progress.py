"""Progress of long work, told wherever its output goes: a tqdm bar on a terminal; where the output is a file or
a pipe (a log, a batch job's output), whose reader sees no bar's redraws, a plain line every LINE_EVERY_S
seconds while the work goes on. Work that ends sooner adds no line to a log."""

import sys
import time

from tqdm import tqdm

LINE_EVERY_S = 20  # a line at the first update this long after the last: within 30 s while updates come often


def progress(iterable=None, *, total=None, desc, unit, file=None, initial=0, unit_scale=False, **bar):
    """A progress bar written to file (stderr unless given): tqdm's on a terminal, with `bar` its other options
    (leave, delay, bar_format); Lines elsewhere. Either takes update, set_postfix_str, write, close, with and
    iteration over `iterable`."""
    file = file or sys.stderr
    if file.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, file=file, initial=initial,
                    unit_scale=unit_scale, dynamic_ncols=True, **bar)
    return Lines(iterable, total, desc, unit, file, initial, unit_scale)


class Lines:
    """Progress as plain lines, `desc: 39/195 step (20%), 00:40 elapsed, about 02:40 left, postfix`: the first
    LINE_EVERY_S seconds in, then every LINE_EVERY_S seconds (at the first update past them)."""

    def __init__(self, iterable, total, desc, unit, file, initial=0, unit_scale=False):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.unit, self.file = iterable, total, desc, unit, file
        self.n = self.initial = initial
        self.unit_scale, self.postfix = unit_scale, ""
        self.start = self.last = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, n=1):
        self.n += n
        if time.monotonic() - self.last >= LINE_EVERY_S:
            self.line()

    def set_postfix_str(self, s="", refresh=True):
        self.postfix = s

    def write(self, s, file=None, end="\n"):
        print(s, end=end, file=file or self.file, flush=True)

    def close(self):
        """Nothing to take back: a log keeps its lines, and what the work says next tells its end."""

    def line(self):
        now = time.monotonic()
        elapsed, done = now - self.start, self.n - self.initial
        parts = [self.count(), f"{tqdm.format_interval(elapsed)} elapsed"]
        if self.total and 0 < done and self.n < self.total:
            parts.append(f"about {tqdm.format_interval(elapsed / done * (self.total - self.n))} left")
        if self.postfix:
            parts.append(self.postfix)
        print(f"{self.desc}: {', '.join(parts)}", file=self.file, flush=True)
        self.last = now

    def count(self):
        """How far the work is: '39/195 step (20%)', '45%' for a bar counting percent, '1.2MB/5.0MB (24%)'."""
        if self.unit == "%":
            return f"{self.n:.0f}%"
        unit = "" if self.unit_scale else f" {self.unit}"

        def shown(n):
            return tqdm.format_sizeof(n) + self.unit if self.unit_scale else f"{n:,}"
        if not self.total:
            return f"{shown(self.n)}{unit}"
        return f"{shown(self.n)}/{shown(self.total)}{unit} ({self.n / self.total:.0%})"
