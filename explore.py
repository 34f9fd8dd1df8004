"""
Open your trained models in a browser: watch one write, and see every probability and every head.

    python explore.py out                # one run folder
    python explore.py out-lab            # a folder of run folders, e.g. the attention lab's
    python explore.py out --port=8001 --device=cpu

It prints the page's address; Ctrl-C stops it. The page works offline and writes nothing into the runs.
"""

import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gptkit.config import parse_config, require
from gptkit.errors import UserError, run_main
from gptkit.runtime import check_device_name, pick_device


@dataclass
class ExploreConfig:
    folder: str = "out"  # a run folder, or a folder of run folders (also the first argument: explore.py FOLDER)
    port: int = 8000  # the port to serve on (0 = any free one)
    host: str = "127.0.0.1"  # where to listen; anything but this machine's loopback makes the page reachable by others
    device: str = "auto"  # 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # decoding precision, chosen as sample.py does

    def __post_init__(self):
        require(self, ["port"], lambda v: 0 <= v < 65536, "a port number, 0 to 65535")
        check_device_name(self.device)


def folder_first(argv):
    """`explore.py FOLDER --key=value ...`: a first argument that is not an option names the folder."""
    if argv and not argv[0].startswith("--"):
        return [f"--folder={argv[0]}", *argv[1:]]
    return argv


def listen(host, port):
    """A listening socket, or one clear line when the address cannot be had."""
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another with --port") from None
    sock.set_inheritable(True)
    return sock


def main(argv=None):
    cfg = parse_config(ExploreConfig, folder_first(sys.argv[1:] if argv is None else argv), prog="explore.py")
    root = Path(cfg.folder)
    if not root.is_dir():
        raise UserError(f"{root} is not a folder; pass a run folder (e.g. out) or a folder of runs (e.g. out-lab)")
    import uvicorn

    from gptkit.explorer import Shelf, make_app

    shelf = Shelf(root, pick_device(cfg.device), cfg.dtype)
    if not shelf.summaries:
        raise UserError(f"no runs in {root} (a run folder holds best.pt or latest.pt); train one with "
                        "`python train.py config/shakespeare_char.py` or run `python lab.py`")
    first = next((name for name, s in shelf.summaries.items() if s.error is None), None)
    if first is not None:
        shelf.get(first)  # loaded before the address is printed: the page's first answers come at once
    sock = listen(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {cfg.host}: the page is reachable from the network, and anyone who reaches "
              "it can run these models", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(make_app(shelf), log_level="warning"))
    openable = sum(s.error is None for s in shelf.summaries.values())
    for signum in (signal.SIGINT, signal.SIGTERM):  # before uvicorn takes them over, and after it hands them back
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    print(f"explorer: http://{'[' + host + ']' if ':' in host else host}:{port}/  ({openable} of "
          f"{len(shelf.summaries)} runs in {root} can be opened; Ctrl-C stops it)", flush=True)
    server.run(sockets=[sock])
    print("explorer stopped")


if __name__ == "__main__":
    run_main(main)
