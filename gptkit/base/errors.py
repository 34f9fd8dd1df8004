"""Errors a user can cause, and the entry-point wrapper that prints them as one line."""

import re
import signal
import sys


class UserError(Exception):
    """A mistake in input, config or environment: shown as one line, never a traceback."""

    exit_code = 1


class RunStopped(UserError):
    """The run was asked to stop by a signal and saved its state: exit status 128 + the signal's number, as
    shells report a process the signal ended (130 for Ctrl-C's SIGINT, 143 for SIGTERM, 138 for SIGUSR1)."""

    exit_code = 128 + signal.SIGINT

    def __init__(self, message, signum=signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + signum


def first_line(e):
    """The first line (and sentence) of an exception's message, or its type when it has none:
    library errors can run to paragraphs, and a user error is one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0].split(". ")[0].rstrip(".") if lines else type(e).__name__


def run_main(main, memory_settings=()):
    """Run an entry script's main(), turning a UserError into `error: ...` and its exit status
    (1, or 128 + signal for a stopped run), Ctrl-C outside a training loop into status 130, a file
    the system refused into one line naming it, and a failed allocation into one line naming
    memory_settings, the script's settings that size its memory."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(RunStopped.exit_code)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.exit(0)
    except OSError as e:  # a path no check foresaw: a full disk, a folder where a file goes, no permission
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror or first_line(e)}", file=sys.stderr)
        sys.exit(1)
    except (MemoryError, RuntimeError) as e:
        asked = failed_allocation(e)
        if asked is None:
            raise
        print(f"error: {out_of_memory(asked, memory_settings)}", file=sys.stderr)
        sys.exit(1)


# how torch's CPU, CUDA and MPS allocators say what they were asked for
ALLOCATION = re.compile(r"[Tt]ried to allocate ([0-9.]+) ?(bytes|[KMGTPE]iB)")
UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def failed_allocation(e):
    """The bytes an allocation that failed asked for, 0 where the error does not say, or None when e is not
    a failed allocation. The size tells a mistyped setting (petabytes) from a run a little too large."""
    torch = sys.modules.get("torch")  # only torch raises its own kind, and then it has been imported
    ran_out = isinstance(e, MemoryError) or torch is not None and isinstance(e, torch.OutOfMemoryError)
    message = str(e)
    # (a size whose byte count overflows 64 bits fails before any allocator is asked: no memory holds it either)
    if not ran_out and not any(s in message for s in ("can't allocate memory", "out of memory", "std::bad_alloc",
                                                      "Storage size calculation overflowed")):
        return None
    m = ALLOCATION.search(message)
    return float(m.group(1)) * 1024 ** UNITS.index(m.group(2)) if m else 0


def out_of_memory(asked, settings):
    """The line for a failed allocation: how much was asked for, and which settings to lower."""
    size = f": tried to allocate {in_units(asked)}" if asked else ""
    if settings:
        return f"out of memory{size}; lower the sizes of this run ({', '.join(settings)})"
    return f"out of memory{size}; free some memory, or use a machine with more"


def in_units(n):
    """A byte count in the largest binary unit it fills at least once, e.g. 7.1 PiB."""
    unit = 0
    while n >= 1024 and unit < len(UNITS) - 1:
        n, unit = n / 1024, unit + 1
    return f"{n:,.0f} bytes" if unit == 0 else f"{n:,.1f} {UNITS[unit]}"
