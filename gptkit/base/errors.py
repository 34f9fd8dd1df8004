"""Errors a user can cause, and the entry-point wrapper that prints them as one line; and the hook that makes a
learner's model.py that does not run (or no longer takes the arguments it is called with) one line too, wherever it
fails, in a script's imports as well, and a Ctrl-C there. Every script imports this module before torch, whose
loading takes a second."""

import atexit
import inspect
import os
import re
import signal
import sys
import traceback
from pathlib import Path


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


def what_does_not_fit(e, width=160):
    """What a failed load_state_dict found, the keys missing, unexpected or of another size (torch's first line
    names only the model, its next what does not fit), cut to width; for another error its first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    found = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict") else first_line(e)
    return found[:width] + "…" * (len(found) > width)


class Terminated(BaseException):
    """SIGTERM where no run's own stop handling holds it (scoring, sampling, a run's start-up): the command ends at
    once, in one line. Not an Exception, so that no `except Exception` takes it for an error to pass over."""


def terminated(signum, frame):
    raise Terminated


def run_main(main, memory_settings=()):
    """Run an entry script's main(), turning a UserError into `error: ...` and its exit status
    (1, or 128 + signal for a stopped run), Ctrl-C outside a training loop into status 130 and SIGTERM into 143,
    each in one line, a file the system refused into one line naming it, and a failed allocation into one line
    naming memory_settings, the script's settings that size its memory."""
    # a run's StopSignals takes SIGTERM over while it trains, then gives it back
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        main()
    except UserError as e:
        say_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        say_error("interrupted")
        sys.exit(RunStopped.exit_code)
    except Terminated:
        say_error("stopped by SIGTERM")
        sys.exit(128 + signal.SIGTERM)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.exit(0)
    except OSError as e:  # a path no check foresaw: a full disk, a folder where a file goes, no permission
        if e.filename is None:
            raise
        say_error(f"{e.filename}: {e.strerror or first_line(e)}")
        sys.exit(1)
    except (MemoryError, RuntimeError) as e:
        asked = failed_allocation(e)
        if asked is None:
            raise
        say_error(out_of_memory(asked, memory_settings))
        sys.exit(1)
    else:
        atexit.unregister(stop_signals_ignored)  # once, however many scripts a process runs (the tests' run_here)
        atexit.register(stop_signals_ignored)  # after torch's: the first to run as the interpreter exits
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_signals_ignored():
    """At the exit of a script whose work is done: a stop signal then (a scheduler's, as the job ends) broke off
    torch's own clean-up with a traceback and gave a finished job a stopped one's status."""
    for name in ("SIGINT", "SIGTERM", "SIGUSR1"):
        if hasattr(signal, name):  # Windows has no SIGUSR1
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def say_error(line):
    """`error: line` on stderr, after what stdout holds: where both go to one file or pipe, the error comes last,
    on a line of its own."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a reader that went away, or stdout closed: the error still goes out
        pass
    print(f"error: {line}", file=sys.stderr)


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


# ----------------------------------------------------------------------------------------- the learner's model.py

MODEL_PY = Path(__file__).resolve().parents[2] / "model.py"  # the learner's, at the project's root beside gptkit/
# how CPython says a function refused the arguments of a call
CALL_REFUSED = re.compile(r"([\w.]+)\(\) (?:takes|got|missing) ")
# how CPython says `from model import X` found no X
IMPORTED_NAME = re.compile(r"cannot import name '(\w+)'")
# how CPython, and torch's Module.__getattr__, say an object lacks an attribute
MISSING_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")


def model_py_error(e):
    """The one line for an exception that comes of the learner's model.py not running as the tools need it: its
    file, the line and what is wrong, where it does not compile or import, or where a function of it no longer
    takes the arguments it is called with (by the tools or by model.py itself); None for anything else. An error
    inside a function's body keeps its traceback, which shows the learner their own code."""
    if isinstance(e, SyntaxError) and is_model_py(e.filename):
        text = (e.text or "").strip()
        return f"{in_model_py(e.lineno)}: {type(e).__name__}: {e.msg}" + (f" ({text})" if text else "")
    frames = list(traceback.walk_tb(e.__traceback__))
    if isinstance(e, ImportError) and e.name == "model" and (e.path is None or is_model_py(e.path)):
        return missing_from_model_py(e, frames)
    importing = [line for frame, line in frames if frame.f_code.co_name == "<module>" and
                 is_model_py(frame.f_code.co_filename)]
    if importing:
        return f"{in_model_py(importing[-1])}: {type(e).__name__}: {first_line(e)}"
    if isinstance(e, AttributeError):
        return missing_attribute(e, frames)
    return refused_call(e, frames) if isinstance(e, TypeError) else None


def missing_attribute(e, frames):
    """The line for a tool that reads a method or attribute of a model.py class an edit renamed or removed
    (GPT.num_params, GPT.flops_per_token): the class, the name, and the tool's line that reads it. None where
    model.py's own code read it (a slip in the learner's code keeps its traceback) or the class is not model.py's."""
    m, model_py = MISSING_ATTRIBUTE.match(str(e)), sys.modules.get("model")
    cls = getattr(model_py, m.group(1), None) if m and model_py else None
    if not (inspect.isclass(cls) and cls.__module__ == "model"):
        return None
    caller = reading_frame(frames)
    if caller is None or is_model_py(caller[0].f_code.co_filename):
        return None
    return (f"{shown_file(MODEL_PY)}: {m.group(1)} has no {m.group(2)}, which {shown_frame(*caller)} reads: an edit "
            f"renamed or removed it; keep it (a renamed method may keep its old name too, as `{m.group(2)} = "
            "new_name`)")


def reading_frame(frames):
    """(frame, line) of the last call outside torch (whose Module.__getattr__ raises for a missing attribute), or
    None."""
    torch = sys.modules.get("torch")
    inside_torch = os.path.dirname(torch.__file__) + os.sep if torch else None
    calls = [(frame, line) for frame, line in frames
             if not (inside_torch and frame.f_code.co_filename.startswith(inside_torch))]
    return calls[-1] if calls else None


def shown_frame(frame, line):
    """A call's file and line, with its code: `gptkit/training/reporting.py, line 39 (`m.flops_per_token(T)`)`."""
    text = " ".join((inspect.getframeinfo(frame).code_context or [""])[0].split())
    return f"{shown_file(frame.f_code.co_filename)}, line {line}" + \
        (f" (`{text[:60]}{'…' * (len(text) > 60)}`)" if text else "")


def missing_from_model_py(e, frames):
    """The line for model.py gone, or without a name the tools import from it (a class renamed, say)."""
    if isinstance(e, ModuleNotFoundError):
        return f"{shown_file(MODEL_PY)} is missing: every tool builds its model from it; put it back"
    name = IMPORTED_NAME.search(str(e))
    importer = shown_file(frames[-1][0].f_code.co_filename) if frames else "a tool"
    return (f"{shown_file(MODEL_PY)} has no {name.group(1) if name else 'name the tools need'}, which {importer} "
            "imports from it: the tools use the model through that name; keep it (a renamed class may keep its old "
            "name too, as `OldName = NewName`)")


def refused_call(e, frames):
    """The line for a TypeError raised where a model.py function was called with arguments its signature no longer
    takes: its definition, and the call that expects the old one. None where the function is not model.py's, or
    the error was raised inside it."""
    m, model_py = CALL_REFUSED.match(str(e)), sys.modules.get("model")
    function = model_py if m and model_py else None
    for part in m.group(1).split(".") if function else ():
        function = getattr(function, part, None)
    code = getattr(function, "__code__", None)
    if code is None or not is_model_py(code.co_filename) or any(frame.f_code is code for frame, _ in frames):
        return None
    # nn.Module's call passes the arguments on: the call outside torch is the one that made it
    calling = reading_frame(frames)
    caller = shown_frame(*calling) if calling else "its caller"
    return (f"{in_model_py(code.co_firstlineno)}: {m.group(1)}{inspect.signature(function)} cannot take what "
            f"{caller} gives it: {e}; keep its parameters, or give a new one a default")


def is_model_py(filename):
    return bool(filename) and Path(filename).resolve() == MODEL_PY


def in_model_py(line):
    return f"{shown_file(MODEL_PY)}, line {line}"


def shown_file(filename):
    """A file's path from the current folder where it lies below it (model.py, from the project's root), else
    whole."""
    path = Path(filename).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def one_line_hook(previous):
    """An excepthook for what is raised before run_main takes over (in the scripts' imports): an exception that
    comes of the learner's model.py (model_py_error) is one line and exit status 1, and a Ctrl-C while torch loads
    `error: interrupted` (the interpreter then exits by the signal, status 130, as run_main's does); anything else
    goes on to `previous`."""
    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            say_error("interrupted")
            return
        try:
            line = model_py_error(value) if isinstance(value, Exception) else None
        except Exception:  # the learner's error, not this hook's, is what must show
            line = None
        if line is None:
            return previous(kind, value, tb)
        say_error(line)
    return hook


sys.excepthook = one_line_hook(sys.excepthook)
