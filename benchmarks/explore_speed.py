"""`bench.py explore`: the explorer as a browser uses it, against a server started as a user starts it
(python explore.py): the page's load, the first streamed token, streaming tokens/s against `bench.py sample`'s
cached decoding of the same model, and the analysis panels' answers on a long text; then the same server under
load on loopback: many clients streaming at once, slow readers, clients that go away, models loaded again and
again, and the server's memory over a few hundred mixed requests."""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks import sample_speed
from benchmarks.common import REPO
from gptkit.base.errors import UserError, first_line
from gptkit.base.settings import comma_items, parse_config, require
from gptkit.data.tokenizer import CharTokenizer
from gptkit.run.checkpoint import save_checkpoint
from model import GPT, GPTConfig

# the page and every file it loads: its modules, one per panel, and the vendored plotting library
MODULES = sorted((REPO / "gptkit" / "explorer" / "static").glob("*.js"))
PAGE_FILES = ["/", *(f"/static/{p.name}" for p in MODULES), "/static/explorer.css",
              "/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.min.css", "/api/runs"]


@dataclass
class ExploreBenchConfig:
    out_dir: str = "out"  # the run the explorer serves ('' = a small random-weight model, for a quick check)
    parts: str = "speed,load"  # speed: page, first token, streaming, analysis; load: many clients (comma-separated)
    max_tokens: int = 1000  # tokens streamed in the timed generation
    text_tokens: int = 256  # length of the text the analysis panels are timed on
    repeats: int = 5  # timed requests per analysis; the median counts
    stream_rounds: int = 3  # streamed generations, each right after sample.py's decoding of as many tokens
    clients: int = 20  # load: clients streaming at once
    client_tokens: int = 2000  # load: tokens each of them streams
    slow_readers: int = 4  # load: clients reading 512 bytes every 0.2 s, for slow_seconds
    slow_seconds: float = 10.0  # load: how long the slow readers stay
    disconnects: int = 10  # load: clients that go away after a few tokens of a long generation
    loads: int = 12  # load: runs picked in turn, more of them than the explorer keeps loaded
    mixed_requests: int = 300  # load: mixed requests over which the server's memory is measured
    phase_seconds: float = 300.0  # load: the longest one phase may take; what is not done by then fails

    def __post_init__(self):
        require(self, ["max_tokens", "text_tokens", "repeats", "stream_rounds", "clients", "client_tokens", "loads",
                       "mixed_requests"], lambda v: v >= 1, "at least 1")
        require(self, ["slow_readers", "disconnects", "slow_seconds"], lambda v: v >= 0, "at least 0")
        require(self, ["phase_seconds"], lambda v: v > 0, "more than 0")
        if not self.part_list() or set(self.part_list()) - {"speed", "load"}:
            raise ValueError(f"parts must be 'speed', 'load' or both, comma-separated (got {self.parts!r})")

    def part_list(self):
        return comma_items(self.parts)


def main(argv):
    """The explorer as a browser uses it, against a server started as a user starts it (python explore.py):
    the page's load from a cold start, the first streamed token after the request, streaming tokens/s against
    bench.py sample's cached decoding of the same model, and the analysis panels' answers on a long text; then
    the load benchmark (load_main)."""
    cfg = parse_config(ExploreBenchConfig, argv, prog="bench.py explore")
    with tempfile.TemporaryDirectory(prefix="bench-explore-") as tmp:
        folder = cfg.out_dir or small_random_run(Path(tmp) / "small")
        if "speed" in cfg.part_list():
            speed_main(cfg, folder)
        if "load" in cfg.part_list():
            load_main(cfg, folder, Path(tmp) / "load")


@contextmanager
def explorer(folder, stderr=None):
    """explore.py serving folder on a free port of 127.0.0.1: (its address, the process)."""
    server = subprocess.Popen([sys.executable, str(REPO / "explore.py"), str(folder), "--port=0", "--device=cpu"],
                              stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        address = server.stdout.readline()
        if not address.startswith("explorer: "):
            raise UserError(f"explore.py did not start: {address.strip() or 'no output'}")
        yield address.split()[1].rstrip("/"), server
    finally:
        server.terminate()
        server.wait()


def speed_main(cfg, folder):
    import httpx  # the explorer's own dependency, needed by this benchmark alone

    decode = in_process_decoding(folder, cfg.max_tokens)
    with explorer(folder) as (url, _), httpx.Client(base_url=url, timeout=120) as http:
        page_s = timed(lambda: [http.get(f).raise_for_status() for f in PAGE_FILES])
        run = http.get("/api/runs").json()["runs"][0]["name"]
        streams = []
        for _ in range(cfg.stream_rounds):  # in turns: a noisy machine slows both sides of each pair alike
            cached_rate = decode()
            streams.append((*time_stream(http, run, cfg.max_tokens), cached_rate))
        analysis = time_analysis(http, run, cfg)
    print_explore_table(page_s, streams, analysis)


def in_process_decoding(folder, max_tokens):
    """A function timing sample.py's cached decoding of the run's model, in this process: tokens/s."""
    bench_cfg = parse_config(sample_speed.SampleBenchConfig, [f"--out_dir={folder}", f"--max_new_tokens={max_tokens}"],
                             prog="bench.py sample")
    model, _ = sample_speed.bench_model(bench_cfg, "cpu")
    cached, *_ = sample_speed.cached_decoder(bench_cfg, model, "cpu")
    prompt = torch.zeros((1, 1), dtype=torch.long)
    return lambda: max_tokens / sample_speed.time_generation(cached, prompt, bench_cfg, True, "cpu")[0]


def small_random_run(folder):
    """A run folder holding a small model with random weights (2 layers, 2 heads, width 64, context 64) and
    tinyshakespeare's 65 characters: the load benchmark in a minute, without training first."""
    chars = "\n !$&',-.3:;?" + "".join(map(chr, range(65, 91))) + "".join(map(chr, range(97, 123)))
    torch.manual_seed(1337)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=len(chars), bias=False,
                          dropout=0.0))
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config),
                     "tokenizer": CharTokenizer(chars).to_meta()}, Path(folder) / "best.pt")
    return str(folder)


def print_explore_table(page_s, streams, analysis):
    print(f"page and its files from a cold server start: {page_s * 1e3:.0f} ms")
    for first_s, stream_rate, cached_rate in streams:
        print(f"first streamed token after the request: {first_s * 1e3:.0f} ms; streaming: {stream_rate:.1f} "
              f"tokens/s, {stream_rate / cached_rate:.0%} of sample.py's cached decoding just before "
              f"({cached_rate:.1f} tokens/s)")
    share = statistics.median(stream / cached for _, stream, cached in streams)
    print(f"streaming, median of {len(streams)}: {share:.0%} of sample.py's cached decoding")
    for name, seconds in analysis.items():
        print(f"{name}: {statistics.median(seconds) * 1e3:.0f} ms (median of {len(seconds)})")


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def time_stream(http, run, max_tokens):
    """Seconds from the request to the first token event, and tokens/s from the first token to the last."""
    start, first, count = time.perf_counter(), None, 0
    body = {"run": run, "prompt": "\n", "max_tokens": max_tokens, "seed": 1337}
    with http.stream("POST", "/api/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[len("data: "):])["type"] == "token":
                count += 1
                first = first or time.perf_counter()
    return first - start, (count - 1) / (time.perf_counter() - first)


def time_analysis(http, run, cfg):
    """Each analysis request, timed repeats times on a text of text_tokens tokens that the model wrote (its last
    context window for the per-position panels)."""
    model = http.get(f"/api/runs/{run}").json()
    body = {"run": run, "prompt": "\n", "max_tokens": cfg.text_tokens - 1, "seed": 1}
    with http.stream("POST", "/api/generate", json=body) as r:
        done = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")][-1]
    text = "\n" + done["text"]
    ids = [t["id"] for t in http.post("/api/read", json={"run": run, "text": text}).json()["tokens"]]
    window = ids[-model["block_size"]:]
    requests = {"read a text (surprise of every token)": ("/api/read", {"run": run, "text": text}),
                "why this token, where it looked, logit lens": ("/api/position",
                                                                {"run": run, "ids": window,
                                                                 "position": len(window) - 1}),
                "one head's full map": ("/api/attention_map", {"run": run, "ids": window, "layer": 0, "head": 0})}
    off = ["L0H0", "MLP0"] if model.get("mlp", True) else ["L0H0"]  # the page's switches: every panel asks again
    requests.update({f"{name}, {' and '.join(off)} off": (path, {**body, "off": off})
                     for name, (path, body) in list(requests.items())})
    return {name: [timed(lambda: http.post(path, json=body).raise_for_status()) for _ in range(cfg.repeats)]
            for name, (path, body) in requests.items()}


# ----------------------------------------------------------------------------- under load

RUNS_SERVED = 6  # runs the load benchmark serves: more than the explorer keeps loaded (4), so picks load models
FIRST_TOKEN_S = 1.0  # each streaming client's first token within this
MEMORY_GROWTH_MB = 50  # the server's memory growth over the mixed requests within this


@dataclass
class Stream:
    """One streaming client: its status, seconds from its request to its first token, tokens, and seconds from
    its first token to its last."""

    status: int = 0
    first_s: float = None
    tokens: int = 0
    span_s: float = 0.0
    error: str = None

    def rate(self):
        return (self.tokens - 1) / self.span_s if self.tokens > 1 and self.span_s > 0 else None


def load_main(cfg, folder, work):
    """The server under load on loopback: cfg.clients streaming cfg.client_tokens tokens each at once, slow
    readers, clients that go away, models loaded again and again, and its memory over cfg.mixed_requests
    mixed requests; each phase bounded by cfg.phase_seconds. Prints the figures and PASS or FAIL for each
    criterion: no 5xx (nor a traceback on its console), every client's first token within 1 s, memory growing
    at most 50 MB over the mixed requests."""
    import httpx

    root = runs_to_load(Path(folder), work / "runs")
    console = work / "server.err"
    with open(console, "w") as err, explorer(root, stderr=err) as (url, server):
        statuses = Counter()
        with httpx.Client(base_url=url, timeout=60) as http:
            text, window = warm_up(http, statuses)
        streams = phase_streams(url, cfg, statuses)
        slow = phase_slow_readers(url, cfg, statuses)
        gone = phase_disconnects(url, cfg, statuses, server.pid)
        loads = phase_loads(url, cfg, statuses)
        memory = phase_mixed(url, cfg, statuses, server.pid, text, window)
    tracebacks = console.read_text(errors="replace").count("Traceback")
    print_load_report(cfg, streams, slow, gone, loads, memory, statuses, tracebacks)


def runs_to_load(source, root):
    """root holding RUNS_SERVED runs, each the source run's checkpoint and metrics (hard links where the file
    system allows, else copies)."""
    checkpoint = next((source / n for n in ("best.pt", "ckpt.pt", "latest.pt") if (source / n).is_file()), None)
    if checkpoint is None:
        raise UserError(f"no checkpoint in {source}; train one first, or pass --out_dir= for a small random model")
    for i in range(RUNS_SERVED):
        (root / f"run{i}").mkdir(parents=True)
        for path in (checkpoint, source / "metrics.jsonl"):
            if path.is_file():
                try:
                    os.link(path, root / f"run{i}" / path.name)
                except OSError:
                    shutil.copy(path, root / f"run{i}" / path.name)
    return root


def warm_up(http, statuses):
    """Every run loaded once, and a text the model wrote with the token ids of its last context window: what
    the mixed requests read and analyse."""
    for i in range(RUNS_SERVED):
        statuses[http.get(f"/api/runs/run{i}").status_code] += 1
    block = http.get("/api/runs/run0").json()["block_size"]
    body = {"run": "run0", "prompt": "\n", "max_tokens": 256, "seed": 1}
    with http.stream("POST", "/api/generate", json=body) as r:
        statuses[r.status_code] += 1
        text = "\n" + [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")][-1]["text"]
    read = http.post("/api/read", json={"run": "run0", "text": text})
    statuses[read.status_code] += 1
    return text, [t["id"] for t in read.json()["tokens"]][-block:]


def stream(url, body, deadline, stop_after=None, progress=None, together=None):
    """One client streaming a generation to its end, its stop_after-th token or the deadline; with together (a
    threading.Barrier), asking at the same moment as the other clients waiting on it."""
    import httpx

    out = Stream()
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            if together is not None:
                together.wait(timeout=60)
            start = time.perf_counter()
            with http.stream("POST", "/api/generate", json=body) as r:
                out.status = r.status_code
                read_tokens(r, out, start, deadline, stop_after, progress)
    except httpx.HTTPError as e:
        out.error = first_line(e)
    return out


def read_tokens(r, out, start, deadline, stop_after, progress):
    """Count a streamed generation's tokens into out, as they come, until its end, stop_after or deadline."""
    for line in r.iter_lines():
        if not line.startswith("data: ") or json.loads(line[6:])["type"] != "token":
            continue
        now = time.perf_counter() - start
        out.first_s = now if out.first_s is None else out.first_s
        out.tokens, out.span_s = out.tokens + 1, now - out.first_s
        if progress is not None:
            progress.update()
        if out.tokens == stop_after or time.perf_counter() > deadline:
            break


def phase_streams(url, cfg, statuses):
    """cfg.clients clients asking at the same moment for cfg.client_tokens tokens each."""
    deadline, together = time.perf_counter() + cfg.phase_seconds, threading.Barrier(cfg.clients)
    with tqdm(total=cfg.clients * cfg.client_tokens, desc=f"{cfg.clients} clients streaming", unit="token",
              leave=False) as progress, ThreadPoolExecutor(cfg.clients) as pool:
        streams = list(pool.map(lambda i: stream(url, {"run": "run0", "prompt": "\n", "seed": i,
                                                       "max_tokens": cfg.client_tokens}, deadline,
                                                 progress=progress, together=together), range(cfg.clients)))
    statuses.update(s.status for s in streams)
    return streams


def slow_reader(url, deadline, seconds):
    """A client that reads 512 bytes of its generation every 0.2 s for seconds, then goes away: its status."""
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"run": "run0", "prompt": "\n", "max_tokens": 2000}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server must wait
        sock.settimeout(30)
        sock.connect((host, int(port)))
        sock.sendall(f"POST /api/generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = sock.recv(512)
        end = min(deadline, time.perf_counter() + seconds)
        while time.perf_counter() < end and sock.recv(512):
            time.sleep(0.2)
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def phase_slow_readers(url, cfg, statuses):
    """A client streaming beside cfg.slow_readers slow readers: it, and the readers' statuses."""
    deadline = time.perf_counter() + cfg.phase_seconds
    with ThreadPoolExecutor(cfg.slow_readers + 1) as pool:
        readers = [pool.submit(slow_reader, url, deadline, cfg.slow_seconds) for _ in range(cfg.slow_readers)]
        time.sleep(min(1.0, cfg.slow_seconds))  # the readers have asked, and their buffers are filling
        beside = stream(url, {"run": "run0", "prompt": "\n", "max_tokens": 500, "seed": 7}, deadline)
        statuses.update([beside.status, *(r.result() for r in readers)])
    return beside


def cpu_seconds(pid):
    """The process's CPU time so far (user + system), from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def phase_disconnects(url, cfg, statuses, pid):
    """cfg.disconnects clients that go away after 20 tokens of 2,000: the server's CPU share over the 2 s after
    (near 0 when their generations stopped), and the first token of the client after them."""
    deadline = time.perf_counter() + cfg.phase_seconds
    with ThreadPoolExecutor(max(1, cfg.disconnects)) as pool:
        gone = list(pool.map(lambda i: stream(url, {"run": "run0", "prompt": "\n", "max_tokens": 2000, "seed": i},
                                              deadline, stop_after=20), range(cfg.disconnects)))
    before = cpu_seconds(pid)
    time.sleep(2.0)
    after = cpu_seconds(pid)
    share = None if before is None or after is None else (after - before) / 2.0
    nxt = stream(url, {"run": "run0", "prompt": "\n", "max_tokens": 5}, deadline)
    statuses.update([*(s.status for s in gone), nxt.status])
    return {"cpu_share": share, "next_first_s": nxt.first_s}


def phase_loads(url, cfg, statuses):
    """cfg.loads picks of the runs in turn: each loads its model, the explorer keeping only four. Seconds each."""
    import httpx

    seconds, deadline = [], time.perf_counter() + cfg.phase_seconds
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(cfg.loads):
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            statuses[http.get(f"/api/runs/run{(i + 1) % RUNS_SERVED}").status_code] += 1
            seconds.append(time.perf_counter() - start)
    return seconds


def rss_mb(pid):
    """The process's resident memory in MB, from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def mixed_kinds(url, http, text, window, deadline):
    """The requests of the mixed phase, taken in turn: each a function of the request's number returning its
    status. Generations whole and abandoned, every analysis panel, the list, the curves, and picks that load."""
    position = {"run": "run0", "ids": window, "position": len(window) - 1}
    return [
        lambda i: stream(url, {"run": "run0", "prompt": "\n", "max_tokens": 50, "seed": i}, deadline).status,
        lambda i: stream(url, {"run": "run0", "prompt": "\n", "max_tokens": 2000, "seed": i}, deadline,
                         stop_after=5).status,
        lambda i: http.post("/api/read", json={"run": "run0", "text": text}).status_code,
        lambda i: http.post("/api/position", json=position).status_code,
        lambda i: http.post("/api/attention_map", json={"run": "run0", "ids": window, "layer": 0,
                                                        "head": 0}).status_code,
        lambda i: http.get("/api/runs").status_code,
        lambda i: http.get("/api/runs/run0/metrics").status_code,
        lambda i: http.get(f"/api/runs/run{1 + i % (RUNS_SERVED - 1)}").status_code,
    ]


def phase_mixed(url, cfg, statuses, pid, text, window):
    """cfg.mixed_requests mixed requests from four clients at once, after two untimed rounds of each kind: the
    server's memory before and after them, and its peak between."""
    import httpx

    deadline, peak, done = time.perf_counter() + cfg.phase_seconds, [], threading.Event()

    def sample_peak():
        while not done.wait(0.2):
            peak.append(rss_mb(pid) or 0.0)

    with httpx.Client(base_url=url, timeout=120) as http, ThreadPoolExecutor(4) as pool:
        kinds = mixed_kinds(url, http, text, window, deadline)
        list(pool.map(lambda i: kinds[i % len(kinds)](i), range(2 * len(kinds))))
        before = rss_mb(pid)
        sampler = threading.Thread(target=sample_peak)
        sampler.start()
        with tqdm(total=cfg.mixed_requests, desc="mixed requests", leave=False) as progress:
            def one(i):
                status = kinds[i % len(kinds)](i) if time.perf_counter() < deadline else 0
                progress.update()
                return status
            statuses.update(pool.map(one, range(cfg.mixed_requests)))
        done.set()
        sampler.join()
    return {"before": before, "after": rss_mb(pid), "peak": max(peak, default=None)}


def ms(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e3:.0f} ms"


def print_load_report(cfg, streams, slow, gone, loads, memory, statuses, tracebacks):
    print(f"\nunder load, on loopback ({RUNS_SERVED} runs of this model, explore.py --device=cpu):")
    print(f"{cfg.clients} clients streaming {cfg.client_tokens:,} tokens each, at once:")
    print("  client  first token  tokens  tokens/s")
    for i, s in enumerate(streams, 1):
        rate = "n/a" if s.rate() is None else f"{s.rate():.1f}"
        print(f"  {i:>6}  {ms(s.first_s):>11}  {s.tokens:>6,}  {rate:>8}" + (f"  ({s.error})" if s.error else ""))
    wall = max((s.first_s + s.span_s for s in streams if s.first_s is not None), default=0.0)
    total = sum(s.tokens for s in streams)
    print(f"  together: {total:,} tokens in {wall:.1f} s ({total / wall if wall else 0:.0f} tokens/s)")
    beside = "n/a" if slow.rate() is None else f"{slow.rate():.0f} tokens/s"
    print(f"beside {cfg.slow_readers} slow readers (512 bytes every 0.2 s, {cfg.slow_seconds:g} s): a client "
          f"streamed {slow.tokens} tokens at {beside}, its first token after {ms(slow.first_s)}")
    share = "n/a" if gone["cpu_share"] is None else f"{gone['cpu_share']:.0%} of a core"
    print(f"{cfg.disconnects} clients gone after 20 tokens of 2,000: the server's CPU over the next 2 s {share}; "
          f"the next client's first token after {ms(gone['next_first_s'])}")
    if loads:
        print(f"{len(loads)} model loads (picks of {RUNS_SERVED} runs in turn, 4 kept loaded): median "
              f"{ms(statistics.median(loads))}, slowest {ms(max(loads))}")
    growth = None if None in (memory["before"], memory["after"]) else memory["after"] - memory["before"]
    if growth is not None:
        print(f"the server's memory over {cfg.mixed_requests} mixed requests: {memory['before']:.0f} MB -> "
              f"{memory['after']:.0f} MB ({growth:+.1f} MB; peak {memory['peak']:.0f} MB)")
    print("answers: " + ", ".join(f"{n} x {code or 'none (no answer)'}" for code, n in sorted(statuses.items())))
    print_criteria(cfg, streams, statuses, tracebacks, growth)


def print_criteria(cfg, streams, statuses, tracebacks, growth):
    failed = sum(n for code, n in statuses.items() if code == 0 or code >= 500)
    slowest = max((s.first_s for s in streams if s.first_s is not None), default=None)
    late = [s for s in streams if s.first_s is None or s.first_s > FIRST_TOKEN_S]
    short = sum(s.tokens < cfg.client_tokens for s in streams)
    checks = [
        (failed == 0 and tracebacks == 0, f"no 5xx and no request unanswered ({failed}), no traceback on the "
                                          f"server's console ({tracebacks})"),
        (not late, f"first token within {FIRST_TOKEN_S:g} s for each of the {cfg.clients} clients (slowest "
                   f"{ms(slowest)}; {len(late)} later)"),
        (short == 0, f"each client streamed its {cfg.client_tokens:,} tokens within {cfg.phase_seconds:g} s "
                     f"({short} did not)"),
        (growth is not None and growth <= MEMORY_GROWTH_MB,
         f"memory grew {'n/a' if growth is None else f'{growth:.1f} MB'} over {cfg.mixed_requests} mixed requests "
         f"(at most {MEMORY_GROWTH_MB} MB)"),
    ]
    for ok, line in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {line}")
