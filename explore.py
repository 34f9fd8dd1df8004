"""
Open your trained models in a browser: watch one write, and see every probability and every head.

    python explore.py out                # one run folder
    python explore.py out-lab            # a folder of run folders, e.g. the attention lab's
    python explore.py out --port=8001 --device=cpu

It prints the page's address; Ctrl-C stops it. The page works offline and writes nothing into the runs. Where
another program has port 8000, the explorer takes the next free port and says so; a --port given is that port
or an error.
"""

import errno
import ipaddress
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gptkit.base.errors import UserError, run_main
from gptkit.base.settings import given_values, make, require
from gptkit.machine.runtime import check_device_name, pick_device


@dataclass
class ExploreConfig:
    folder: str = "out"  # a run folder, or a folder of run folders (also the first argument: explore.py FOLDER)
    port: int = 8000  # the port to serve on (0 = any free one); the default, if taken, moves to the next free one
    host: str = "127.0.0.1"  # where to listen; anything but this machine's loopback makes the page reachable by others
    device: str = "auto"  # 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # decoding precision, chosen as sample.py does

    def __post_init__(self):
        require(self, ["port"], lambda v: 0 <= v < 65536, "a port number, 0 to 65535")
        check_device_name(self.device)


def folder_first(argv):
    """`explore.py FOLDER --key=value ...`: a first argument that is not an option names the folder (one ending
    in .py is a config file, as for every script)."""
    if argv and not argv[0].startswith("--") and not argv[0].endswith(".py"):
        return [f"--folder={argv[0]}", *argv[1:]]
    return argv


PORT_TRIES = 20  # the default port taken, the explorer tries the ones after it, as Jupyter does: 8000 to 8019


def listen(host, port, moves=False):
    """A listening socket on host (an address or a name of this machine; IPv4 first, as browsers try it) at port,
    or, with moves (the port is the default, not one the user chose) where port is another program's, at the first
    free one of the PORT_TRIES from it; else one line saying what to change."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"cannot listen on {host}: no address of that name ({e.strerror}); give --host an address "
                        "of this machine, e.g. 127.0.0.1 (the default: this machine only)") from None
    family, *_, address = min(found, key=lambda info: info[0] != socket.AF_INET)
    last = min(port + PORT_TRIES - 1, 65535) if moves and port else port
    for at in range(port, last + 1):
        try:
            return bound(family, address, at)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or at == last:
                raise UserError(cannot_listen(host, port, at, e)) from None


def bound(family, address, port):
    """A socket listening at address and port. Where address is this machine's loopback, the port counts as taken
    also when another program listens at its twin in the other family (::1 for 127.0.0.1): a browser asked for
    localhost may reach that one first."""
    sock = socket.create_server((address[0], port, *address[2:]), family=family)
    if port and twin_taken(address[0], port):
        sock.close()
        raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
    sock.set_inheritable(True)
    return sock


def twin_taken(address, port):
    """Whether another program listens at port on the loopback address of the other family than address."""
    twin = {"127.0.0.1": ("::1", socket.AF_INET6), "::1": ("127.0.0.1", socket.AF_INET)}.get(address)
    if twin is None:
        return False
    try:
        socket.create_server((twin[0], port), family=twin[1]).close()
    except OSError as e:  # another error (no IPv6 on this machine): nothing listens there
        return e.errno == errno.EADDRINUSE
    return False


def cannot_listen(host, port, at, e):
    """The line for a socket that could not be had at port (at: the last port tried), saying what to change."""
    if e.errno != errno.EADDRINUSE:
        return f"cannot listen on {host}:{at} ({os.strerror(e.errno) if e.errno else e}); {listen_advice(e.errno)}"
    if at != port:
        return (f"cannot listen on {host}: ports {port} to {at} are all other programs'; pick a free one with --port "
                "(--port=0 takes any)")
    return (f"cannot listen on {host}:{port}: port {port} is another program's, so what answers at "
            f"{address_url(host, port)} is not this explorer; pick another with --port (--port=0 takes any free one)")


def address_url(host, port):
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def open_socket(cfg, given):
    """(the explorer's listening socket, a note or None): at cfg's port, or where that is the default (not in given,
    the settings the user gave) and another program's, at the next free one, with a note saying so plainly: a
    browser pointed at the default port reaches that other program, not this explorer."""
    sock = listen(cfg.host, cfg.port, moves="port" not in given)
    port = sock.getsockname()[1]
    if not cfg.port or port == cfg.port:
        return sock, None
    return sock, f"port {cfg.port} is another program's, not this explorer's: this explorer is at port {port}"


def listen_advice(code):
    if code == errno.EADDRNOTAVAIL:
        return "that is not an address of this machine: give --host one of its own, e.g. 127.0.0.1"
    if code == errno.EACCES:
        return "ports below 1024 need administrator rights: pick another with --port, e.g. --port=8000"
    return "pick another --host or --port"


def reachable_from_network(address):
    """Whether a socket bound to address (e.g. 0.0.0.0, or a network card's address) takes connections from other
    machines: anything but the loopback network (127.0.0.0/8, ::1) does."""
    return not ipaddress.ip_address(address.split("%")[0]).is_loopback


def main(argv=None):
    given = given_values(ExploreConfig, folder_first(sys.argv[1:] if argv is None else argv), prog="explore.py")
    cfg = make(ExploreConfig, given)
    root = Path(cfg.folder)
    if not root.is_dir():
        raise UserError(f"{root} is not a folder; pass a run folder (e.g. out) or a folder of runs (e.g. out-lab)")
    import uvicorn

    from gptkit.explorer.app import make_app
    from gptkit.explorer.runs import ApiError
    from gptkit.explorer.shelf import Shelf

    shelf = Shelf(root, pick_device(cfg.device), cfg.dtype)
    try:
        runs = shelf.summaries()
    except ApiError as e:
        raise UserError(str(e)) from None
    if not runs:
        raise UserError(f"no runs in {root} (a run folder holds best.pt or latest.pt); train one with "
                        "`python train.py config/shakespeare_char.py` or run `python lab.py`")
    first = next((s.name for s in runs if s.error is None), None)
    if first is not None:
        try:
            shelf.get(first)  # loaded before the address is printed: the page's first answers come at once
        except ApiError:
            pass  # the page says why when it is picked
    sock, moved = open_socket(cfg, given)
    host, port = sock.getsockname()[:2]
    if reachable_from_network(host):
        where = cfg.host if cfg.host == host else f"{cfg.host} ({host})"
        print(f"warning: listening on {where}: the page is reachable from the network, and anyone who reaches it "
              "can run these models", file=sys.stderr)
    app = make_app(shelf, cfg.host, port, bound=host)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    openable = sum(s.error is None for s in runs)
    for signum in (signal.SIGINT, signal.SIGTERM):  # before uvicorn takes them over, and after it hands them back
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    print(f"explorer: {address_url(host, port)}  ({moved + '; ' if moved else ''}{openable} of {len(runs)} runs in "
          f"{root} can be opened; Ctrl-C stops it)", flush=True)
    server.run(sockets=[sock])
    print("explorer stopped")


if __name__ == "__main__":
    run_main(main)
