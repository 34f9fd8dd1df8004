"""`bench.py explore`: the explorer as a browser uses it, against a server started as a user starts it
(python explore.py): the page's load, the first streamed token, streaming tokens/s against `bench.py sample`'s
cached decoding of the same model, and the analysis panels' answers on a long text."""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from gptkit.benchmarks import sample
from gptkit.benchmarks.common import REPO
from gptkit.config import parse_config, require
from gptkit.errors import UserError

# the page and every file it loads: its modules, one per panel, and the vendored plotting library
MODULES = sorted((REPO / "gptkit" / "explorer_static").glob("*.js"))
PAGE_FILES = ["/", *(f"/static/{p.name}" for p in MODULES), "/static/explorer.css",
              "/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.min.css", "/api/runs"]


@dataclass
class ExploreBenchConfig:
    out_dir: str = "out"  # the run the explorer serves (e.g. the default's, after python train.py config/...)
    max_tokens: int = 1000  # tokens streamed in the timed generation
    text_tokens: int = 256  # length of the text the analysis panels are timed on
    repeats: int = 5  # timed requests per analysis; the median counts

    def __post_init__(self):
        require(self, ["max_tokens", "text_tokens", "repeats"], lambda v: v >= 1, "at least 1")


def main(argv):
    """The explorer as a browser uses it, against a server started as a user starts it (python explore.py):
    the page's load from a cold start, the first streamed token after the request, streaming tokens/s against
    bench.py sample's cached decoding of the same model, and the analysis panels' answers on a long text."""
    import httpx  # the explorer's own dependency, needed by this benchmark alone

    cfg = parse_config(ExploreBenchConfig, argv, prog="bench.py explore")
    rates = sample.main([f"--out_dir={cfg.out_dir}", "--modes=cache", f"--max_new_tokens={cfg.max_tokens}",
                         "--repeats=3", "--device=cpu"])
    server = subprocess.Popen([sys.executable, str(REPO / "explore.py"), cfg.out_dir, "--port=0", "--device=cpu"],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline()
        if not address.startswith("explorer: "):
            raise UserError(f"explore.py did not start: {address.strip() or 'no output'}")
        with httpx.Client(base_url=address.split()[1].rstrip("/"), timeout=120) as http:
            page_s = timed(lambda: [http.get(f).raise_for_status() for f in PAGE_FILES])
            run = http.get("/api/runs").json()["runs"][0]["name"]
            first_s, stream_rate = time_stream(http, run, cfg.max_tokens)
            analysis = time_analysis(http, run, cfg)
    finally:
        server.terminate()
        server.wait()
    print_explore_table(page_s, first_s, stream_rate, rates["cache"], analysis)


def print_explore_table(page_s, first_s, stream_rate, cached_rate, analysis):
    print(f"page and its files from a cold server start: {page_s * 1e3:.0f} ms")
    print(f"first streamed token after the request: {first_s * 1e3:.0f} ms")
    print(f"streaming: {stream_rate:.1f} tokens/s, {stream_rate / cached_rate:.0%} of bench.py sample's "
          f"{cached_rate:.1f} cached tokens/s")
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
    return {name: [timed(lambda: http.post(path, json=body).raise_for_status()) for _ in range(cfg.repeats)]
            for name, (path, body) in requests.items()}
