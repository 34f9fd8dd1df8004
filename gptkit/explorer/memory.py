"""The memory of the explorer's process: glibc's arenas kept few, and a dropped model's memory given back."""

import ctypes
import sys


def glibc():
    """The C library when it is glibc (Linux), whose malloc_trim and mallopt the shelf uses; else None."""
    try:
        libc = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


GLIBC = glibc()
M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def bound_freed_memory():
    """Keep the memory glibc holds freed but not given back bounded. It gives each thread that allocates an arena
    of its own, which keeps what was freed there, and the server's worker threads (dozens, under load) take turns
    on the models (the shelf's lock): two arenas serve them as well."""
    if GLIBC is not None:
        GLIBC.mallopt(M_ARENA_MAX, 2)


def give_back_memory():
    """Hand the memory of a model just dropped back to the system: glibc would keep it for reuse, and each load
    of another run would leave megabytes behind (bench.py explore measures the server's memory under load)."""
    if GLIBC is not None:
        GLIBC.malloc_trim(0)

