"""The explorer's server: every number it sends is the model's own (probabilities, attention, the logit lens,
surprise), its streamed text is sample.py's, each endpoint refuses bad requests with one JSON line, and it opens
only the runs inside its folder. In-process through FastAPI's test client, plus a real server for streaming."""

import errno
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import asdict

import httpx
import pytest
import torch
import torch.nn.functional as F

from conftest import MODEL, REPO, check_ok, partial_tokens, run_script, sum_tolerance, tiny_model
from gptkit.data.conversations import MARKERS, prompt_text
from gptkit.data.tokenizer import CharTokenizer
from gptkit.explorer.app import make_app
from test_checkpoints import rewrite
from test_settings import DEEP
from gptkit.explorer.shelf import Shelf
from gptkit.interp.hooks import attention_maps, token_label
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.run.metrics import read_metrics
from gptkit.run.run_folder import RunDir
from gptkit.sampling.decoding import shaped_probs
from gptkit.training.train_config import TrainConfig

TestClient = pytest.importorskip("fastapi.testclient").TestClient

CHARS = sorted(set("abcdefghij klmnop\n:ROMEJULIT."))
SHAPE = dict(block_size=24, vocab_size=len(CHARS), n_layer=2, n_head=2, n_embd=16, bias=False)
VARIANTS = {"scaled": {}, "uniform": dict(attention="uniform"), "additive": dict(attention="additive"),
            "bigram": dict(n_layer=0), "encoder": dict(causal=False), "rope": dict(pos_emb="rope", qk_norm=True)}


def fake_run(folder, seed=0, tok=None, final=None, **overrides):
    """A run folder as train.py leaves it (best.pt with its keys, a metrics.jsonl), with random weights; tok: its
    tokenizer (CHARS' by default), final: more fields of its final record."""
    tok = tok or CharTokenizer(CHARS)
    model = tiny_model(seed, **dict(SHAPE, vocab_size=tok.vocab_size, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # far from uniform, so every number the tests compare means something
    folder.mkdir(parents=True)
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": asdict(TrainConfig()),
                     "tokenizer": tok.to_meta(), "iter_num": 20, "val_loss": 2.5}, folder / "best.pt")
    records = [{"kind": "eval", "iter": 0, "train_loss": 3.4, "val_loss": 3.4, "elapsed_s": 1.0},
               {"kind": "train", "iter": 10, "loss": 3.0, "lr": 1e-3, "tokens": 100, "elapsed_s": 2.0},
               {"kind": "eval", "iter": 20, "train_loss": 2.6, "val_loss": 2.7, "elapsed_s": 3.0},
               {"kind": "final", "iter": 20, "val_loss": 2.65, "val_tokens": 50, "elapsed_s": 4.0, **(final or {})}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return model.eval()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A folder of runs like the lab's, one per attention variant ('scaled' with an SAE), and one damaged run."""
    root = tmp_path_factory.mktemp("explorer") / "runs"
    models = {name: fake_run(root / name, i, **opts) for i, (name, opts) in enumerate(VARIANTS.items())}
    with_sae(root / "scaled", models["scaled"])
    (root / "damaged").mkdir()
    (root / "damaged" / "best.pt").write_bytes(b"not a checkpoint")
    return root, models


HOOK = "blocks.1.hook_resid_post"  # where the lab's 'scaled' run has an SAE
D_SAE = 32


def with_sae(folder, model, seed=0, fingerprint=None):
    """An SAE at HOOK of the run in folder, saved as analyze.py features saves one (SAELens's files, every
    feature's row of the table from the run's windows of TEXT, the metrics measured, the weights it read, or
    fingerprint), its weights random: the explorer reads it as it reads a trained one."""
    from gptkit.interp.features import feature_rows, measure, save_sae, weights_fingerprint
    from gptkit.interp.sae import SparseAutoencoder

    sae = SparseAutoencoder(model.config.n_embd, D_SAE, 4, torch.Generator().manual_seed(seed))
    ids = ids_of(TEXT * 2)
    idx = torch.tensor([ids[i:i + SHAPE["block_size"] + 1] for i in (0, 20)])
    table = feature_rows(model, CharTokenizer(CHARS), sae, HOOK, idx[:, :-1], D_SAE)
    metrics = measure(model, sae, HOOK, idx[:, :-1], idx[:, 1:], 0.0).to_json()
    save_sae(folder / "sae" / HOOK, sae, HOOK, folder.name,
             {"metrics": metrics, "run_weights": fingerprint or weights_fingerprint(model)}, table)


def app_over(root):
    """The explorer's app over root's runs, asked as its page asks it: at its own address and port."""
    return TestClient(make_app(Shelf(root, "cpu", "float32")), base_url="http://127.0.0.1:8000")


@pytest.fixture(scope="module")
def client(lab):
    return app_over(lab[0])


def ids_of(text):
    return CharTokenizer(CHARS).encode(text)


TEXT = "ROMEO:\nabc def ghi.\nJULIET:\nklm nop"


def test_runs_list_every_run_in_words_and_a_damaged_one_as_one_line(client):
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert set(runs) == {*VARIANTS, "damaged"}
    assert runs["scaled"]["settings"].startswith("2 layers, 2 heads, width 16, scaled dot-product attention, "
                                                 "causal (a decoder), learned positions")
    assert "not causal (an encoder)" in runs["encoder"]["settings"] and "bigram" in runs["bigram"]["settings"]
    assert runs["scaled"]["iterations"] == 20 and runs["scaled"]["final_val_loss"] == 2.65
    # char-level, a token is a character: bits per character is the loss over ln 2
    assert runs["scaled"]["bits_per_char"] == pytest.approx(2.65 / math.log(2))
    assert runs["damaged"]["error"] and "\n" not in runs["damaged"]["error"]
    assert client.get("/api/runs/damaged").status_code == 409  # and the others still open
    assert client.get("/api/runs/scaled").json()["n_layer"] == 2
    metrics = client.get("/api/runs/scaled/metrics").json()
    assert [e["val_loss"] for e in metrics["eval"]] == [3.4, 2.7] and metrics["train"][0]["loss"] == 3.0


@pytest.mark.parametrize("setting, value, held", [("n_embd", 2 ** 40, 16), ("n_layer", 10 ** 9, 2)])
def test_a_run_whose_settings_ask_for_another_shape_than_its_weights_is_listed_as_one_that_cannot_open(
        tmp_path, setting, value, held):
    """A hand edit of best.pt's model_args: the list says so in its one line, as opening it would, and counts
    it among the runs that cannot open, instead of offering a run that would fill the memory when clicked."""
    fake_run(tmp_path / "good")
    fake_run(tmp_path / "edited")
    ckpt = load_checkpoint(tmp_path / "edited" / "best.pt")
    ckpt["model_args"][setting] = value
    save_checkpoint(ckpt, tmp_path / "edited" / "best.pt")
    runs = {r["name"]: r for r in app_over(tmp_path).get("/api/runs").json()["runs"]}
    assert runs["good"].get("error") is None
    assert runs["edited"]["error"] == f"edited/best.pt's weights do not fit its model settings: {setting}={value}, " \
                                      f"its weights {held}"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_position_report_is_the_models_own_numbers(client, lab, name):
    """Candidates = softmax of the logits that predicted the token (and the sampler's shaped distribution);
    attention = the weights the forward pass applies; the lens's last layer = the model's prediction."""
    model = lab[1][name]
    ids, pos = ids_of(TEXT)[:20], 11
    knobs = dict(temperature=0.7, top_k=5, top_p=0.9)
    got = client.post("/api/position", json=dict(run=name, ids=ids, position=pos, k=len(CHARS), **knobs)).json()
    idx = torch.tensor([ids])
    with torch.no_grad():
        logits = model(idx, idx)[0][0]
    probs = torch.softmax(logits[pos - 1], -1)
    # the page's model computes attention on another path than this one's: sums in another order
    tol = sum_tolerance(probs, terms=len(ids) * model.config.n_embd)["atol"]
    raw = {c["id"]: c["p"] for c in got["why"]["raw"]}
    assert raw == pytest.approx({i: probs[i].item() for i in range(len(CHARS))}, abs=tol)
    shaped = shaped_probs(logits[pos - 1][None], **knobs)[0]
    # only what sampling can draw: top-k and top-p leave the rest at 0, which the page would list as 0%
    assert {c["id"]: c["p"] for c in got["why"]["shaped"]} == \
        pytest.approx({i: shaped[i].item() for i in range(len(CHARS)) if shaped[i] > 0}, abs=tol)
    surprise = -math.log2(probs[ids[pos]].item())
    assert got["why"]["surprise_bits"] == pytest.approx(surprise, abs=tol / min(probs[ids[pos]].item(), 1.0))
    lens_last = torch.softmax(logits[pos], -1)
    assert [c["id"] for c in got["lens"][-1]["top"]] == lens_last.topk(5).indices.tolist()
    assert [c["p"] for c in got["lens"][-1]["top"]] == pytest.approx(lens_last.topk(5).values.tolist(), abs=tol)
    assert len(got["lens"]) == model.config.n_layer + 1
    maps = attention_maps(model, idx)
    assert got["attention"]["layers"] == len(maps)
    for layer, m in enumerate(maps):
        for head in range(model.config.n_head):
            assert got["attention"]["rows"][layer][head] == pytest.approx(m[0, head, pos].tolist(), abs=tol)


def test_attention_notes_say_what_a_learner_sees(client):
    def report(name):
        return client.post("/api/position", json=dict(run=name, ids=ids_of("abc def"), position=4)).json()

    assert report("bigram")["attention"] == {"note": report("bigram")["attention"]["note"], "layers": 0,
                                             "heads": 0, "rows": []}
    assert "no attention" in report("bigram")["attention"]["note"]
    encoder = report("encoder")["attention"]
    assert "cheating" in encoder["note"]
    assert max(sum(row[5:]) for layer in encoder["rows"] for row in layer) > 0.01  # it looks ahead
    uniform = report("uniform")["attention"]
    assert "same weight" in uniform["note"] and uniform["rows"][0][0] == pytest.approx([0.2] * 5 + [0.0] * 2)
    assert report("scaled")["attention"]["note"] is None
    assert report("scaled")["why"]["note"] is None
    first = client.post("/api/position", json=dict(run="scaled", ids=ids_of("abc"), position=0)).json()["why"]
    assert first["raw"] == [] and "first token" in first["note"]


def test_a_mask_taken_out_by_hand_is_said_to_see_the_future(tmp_path, monkeypatch):
    """The notes' encoder, "just delete the single line that does masking", its settings still causal: the page
    said "causal (sees only the past)", with no note, of a model whose attention reaches the tokens after each
    one. Now it is not causal on the page, with the encoder's note on why that is cheating, saying what did it."""
    import model as model_py

    monkeypatch.setattr(model_py.SelfAttention, "sdpa", lambda self, q, k, v: F.scaled_dot_product_attention(q, k, v))
    fake_run(tmp_path / "runs" / "unmasked")
    client = app_over(tmp_path / "runs")
    info = client.get("/api/runs/unmasked").json()
    attention = client.post("/api/position", json=dict(run="unmasked", ids=ids_of("abc def"), position=4)).json()
    assert info["causal"] is False and info["note"] == attention["attention"]["note"]
    assert info["note"].startswith("model.py's attention lets each position see the tokens after it, though this "
                                   "model's settings say causal=True (an edit took out or changed the mask): each "
                                   "token also attends to the tokens after it") and "cheating" in info["note"]


def test_a_run_trained_before_model_py_changed_says_what_changed_on_its_card(tmp_path, capsys):
    """model.py edited since the run trained: the explorer said so on its console only, and the learner, who looks
    at the page, saw no word of it. Now the run's card carries the console's note, naming the pieces that changed,
    by its run's folder, never a path of this machine; a run whose code is as it was says nothing."""
    from gptkit.machine.stand_ins import model_code

    root = tmp_path / "runs"
    for name in ("same", "edited"):
        fake_run(root / name)
        rewrite(root / name / "best.pt", ["model_code"], dict(model_code()))
    rewrite(root / "edited" / "best.pt", ["model_code", "relu_squared"], "0" * 16)  # what an edit since made of it
    client = app_over(root)
    assert client.get("/api/runs/same").json()["code_note"] is None
    note = client.get("/api/runs/edited").json()["code_note"]
    assert note == ("model.py has changed since edited/best.pt was trained (relu_squared): the model runs the code "
                    "as it is now, which may not be what it learned with")
    assert f"since {root / 'edited' / 'best.pt'} was trained (relu_squared)" in capsys.readouterr().err  # as ever


def test_an_edit_the_panels_watching_hooks_cannot_run_is_said_on_the_page(tmp_path, capsys, monkeypatch):
    """An edited sdpa runs in the model, but the panels that watch the attention pattern (where it looked, the head
    maps, the labels) write the attention out in their own code: the explorer said so on its console only. Now the
    run's answer carries the console's note (unwatched_edits), for the page to show in those panels; unedited, none."""
    import model as model_py
    from gptkit.machine.stand_ins import unwatched_edits

    fake_run(tmp_path / "run")
    assert app_over(tmp_path / "run").get("/api/runs/run").json()["watch_note"] is None
    sdpa = model_py.SelfAttention.sdpa

    def doubled(self, q, k, v):
        return 2 * sdpa(self, q, k, v)
    monkeypatch.setattr(model_py.SelfAttention, "sdpa", doubled)
    capsys.readouterr()
    note = app_over(tmp_path / "run").get("/api/runs/run").json()["watch_note"]
    assert note == unwatched_edits().removeprefix("note: ") and note.startswith("model.py's SelfAttention.sdpa is ")
    assert capsys.readouterr().err.endswith(unwatched_edits() + "\n")  # the console's, as ever


def test_a_text_is_read_by_a_model_whose_attention_passes_no_pattern_hook(tmp_path, monkeypatch):
    """The notes' averaging loop in uniform attention, past self.hook_pattern: "Read a text" needs no attention
    weights, and refused the run in one line ("model.py's forward never passes through the hook point
    blocks.0.attn.hook_pattern"). Now it reads the text, each token's surprise the model's own loss."""
    import model as model_py

    def averaged(self, q, k, v):  # the mean of each position's past, without the pattern's hook
        return v.cumsum(2) / torch.arange(1, v.size(2) + 1).view(1, 1, -1, 1)
    monkeypatch.setattr(model_py.SelfAttention, "written", averaged)
    model = fake_run(tmp_path / "runs" / "loop", attention="uniform")
    got = app_over(tmp_path / "runs").post("/api/read", json=dict(run="loop", text="abc def")).json()
    ids = torch.tensor([ids_of("abc def")])
    with torch.no_grad():
        loss = model(ids[:, :-1], ids[:, 1:])[1].item()
    assert got["loss"] == pytest.approx(loss, rel=1e-5)


def test_a_heads_full_map_is_the_forward_pass_weights(client, lab):
    ids = ids_of(TEXT)[:12]
    got = client.post("/api/attention_map", json=dict(run="rope", ids=ids, layer=1, head=1)).json()
    want = attention_maps(lab[1]["rope"], torch.tensor([ids]))[1][0, 1]
    assert torch.tensor(got["weights"]) == pytest.approx(want, abs=1e-6)
    assert got["labels"][:7] == ["R", "O", "M", "E", "O", ":", "↵"]


def test_surprise_summed_is_the_models_loss_on_the_text(client, lab):
    model, short = lab[1]["scaled"], TEXT[:SHAPE["block_size"] + 1]  # one window: every token after the first
    got = client.post("/api/read", json=dict(run="scaled", text=short)).json()
    idx = torch.tensor([ids_of(short)])
    with torch.no_grad():
        loss = model(idx[:, :-1], idx[:, 1:])[1].item()
    bits = [t["surprise_bits"] for t in got["tokens"]]
    assert bits[0] is None and len(bits) == len(short) and got["chars"] == len(short)
    assert sum(bits[1:]) == pytest.approx(got["total_bits"]) and got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["total_bits"] * math.log(2) / (len(short) - 1) == pytest.approx(loss, rel=1e-5)
    # per character the model predicted: char-level, each token after the first is one
    assert got["predicted_chars"] == len(short) - 1
    assert got["bits_per_char"] == pytest.approx(loss / math.log(2), rel=1e-5)
    # a text longer than the context: consecutive windows, each token scored once, as the val split is scored
    long = TEXT * 2
    got = client.post("/api/read", json=dict(run="scaled", text=long)).json()
    ids, T, nats = ids_of(long), SHAPE["block_size"], 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, T):
            y = torch.tensor([ids[start + 1:start + 1 + T]])
            nats += model(torch.tensor([ids[start:start + y.size(1)]]), y)[1].item() * y.size(1)
    assert got["total_bits"] * math.log(2) == pytest.approx(nats, rel=1e-5)


def events(response_lines):
    return [json.loads(line[len("data: "):]) for line in response_lines if line.startswith("data: ")]


def test_generation_streams_the_prompt_then_tokens_with_their_probabilities(client):
    with client.stream("POST", "/api/generate", json=dict(run="scaled", prompt="ROMEO:\n", max_tokens=15,
                                                          seed=3)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = events(r.iter_lines())
    assert got[0]["type"] == "prompt" and [t["text"] for t in got[0]["tokens"]] == list("ROMEO:\n")
    tokens = [e for e in got if e["type"] == "token"]
    assert len(tokens) == 15 and all(0 < t["p"] <= 1 and 0 < t["p_shaped"] <= 1 for t in tokens)
    assert got[-1] == {"type": "done", "reason": "max_tokens", "text": "".join(t["text"] for t in tokens)}


def test_a_stop_string_ends_the_generation(client):
    body = dict(run="scaled", prompt="a", max_tokens=200, seed=1, temperature=0)
    full = events(client.post("/api/generate", json=body).iter_lines())[-1]["text"]
    stop = full[5:7]
    got = events(client.post("/api/generate", json=dict(body, stop=stop)).iter_lines())[-1]
    assert got == {"type": "done", "reason": "stop", "text": full[:full.index(stop)]}


@pytest.mark.slow
def test_streamed_text_is_sample_pys_for_the_same_seed_and_settings(lab, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lab[0] / "rope", run)
    settings = dict(temperature=0.9, top_k=7, top_p=0.8, seed=42, max_tokens=40)
    app = app_over(run)
    streamed = events(app.post("/api/generate", json=dict(run="run", prompt="ROMEO:", **settings)).iter_lines())
    proc = check_ok(run_script("sample.py", f"--out_dir={run}", "--start=ROMEO:", "--num_samples=1",
                               "--dtype=float32", "--device=cpu", *[f"--{k}={v}" for k, v in settings.items()
                                                                    if k != "max_tokens"],
                               f"--max_new_tokens={settings['max_tokens']}"))
    assert proc.stdout.split("\n---------------")[0] == "ROMEO:" + streamed[-1]["text"]


@pytest.mark.parametrize("path,body,status,message", [
    ("/api/generate", dict(run="scaled", prompt="xyz"), 400, "outside the training vocabulary: 'x'"),
    ("/api/generate", dict(run="scaled", prompt=""), 422, "prompt"),
    ("/api/generate", dict(run="scaled", prompt="a" * 20_001), 422, "prompt"),
    ("/api/generate", dict(run="scaled", max_tokens=10**6), 422, "max_tokens"),
    ("/api/generate", dict(run="scaled", temperature=-1), 422, "temperature"),
    ("/api/generate", dict(run="scaled", temperature=1e-9), 422, "temperature: must be 0 (greedy) or at least 0.001"),
    ("/api/read", dict(run="scaled", text="a", checkpoint="iter:"), 422, "checkpoint: checkpoint must be 'best'"),
    ("/api/generate", dict(run="scaled", top_p=0), 422, "top_p"),
    ("/api/generate", dict(run="scaled", top_k=-1), 422, "top_k"),
    ("/api/generate", dict(run="scaled", seed=2 ** 31), 422, "seed"),
    ("/api/generate", dict(run="../etc"), 404, "no run named"),
    ("/api/generate", dict(run="/tmp"), 404, "no run named"),
    ("/api/generate", dict(run="damaged"), 409, "cannot be opened"),
    ("/api/read", dict(run="scaled", text="a" * 20_001), 422, "text"),
    ("/api/position", dict(run="scaled", ids=[0] * 25, position=0), 400, "more than the model's context of 24"),
    ("/api/position", dict(run="scaled", ids=[0, 1], position=2), 400, "past the last"),
    ("/api/position", dict(run="scaled", ids=[0, 999], position=1), 400, "outside the vocabulary"),
    ("/api/attention_map", dict(run="scaled", ids=[0, 1], layer=2, head=0), 400, "no head 0 in layer 2"),
    ("/api/attention_map", dict(run="scaled", ids=[0, 1], layer="one", head=0), 422, "layer"),
])
def test_bad_requests_get_one_json_line_and_a_4xx(client, path, body, status, message):
    r = client.post(path, json=body)
    assert r.status_code == status and message in r.json()["error"], r.text
    assert "Traceback" not in r.text and "\n" not in r.json()["error"]


def test_only_runs_inside_the_folder_open(lab, tmp_path):
    """A run named with '..', an absolute path, or a link leading out of the folder is not served."""
    root = tmp_path / "root"
    shutil.copytree(lab[0] / "scaled", root / "inside")
    (root / "escape").symlink_to(lab[0] / "uniform", target_is_directory=True)
    app = app_over(root)
    assert [r["name"] for r in app.get("/api/runs").json()["runs"]] == ["inside"]
    for name in ("escape", "../root/inside", str(lab[0] / "uniform"), "..", "%2e%2e"):
        assert app.get(f"/api/runs/{name}").status_code == 404, name


def test_nothing_is_written_into_the_runs(lab, client):
    before = {p: p.stat().st_mtime_ns for p in lab[0].rglob("*")}
    client.post("/api/read", json=dict(run="scaled", text="abc"))
    events(client.post("/api/generate", json=dict(run="rope", prompt="a", max_tokens=3)).iter_lines())
    assert {p: p.stat().st_mtime_ns for p in lab[0].rglob("*")} == before


REMOTE = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import|fetch\(\s*["'`]https?:""")


def test_the_page_and_its_files_are_served_with_nothing_from_the_internet(client):
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    static = REPO / "gptkit" / "explorer" / "static"
    files = [p for p in static.rglob("*") if p.is_file() and p.suffix in (".html", ".js", ".css")]
    assert {"index.html", "explorer.js", "explorer.css"} <= {p.name for p in files}
    for path in files:
        assert client.get(f"/static/{path.relative_to(static)}").status_code == 200
        assert not REMOTE.search(path.read_text(encoding="utf-8")), path


# ----------------------------------------------------------------------------- only its own page


@pytest.mark.parametrize("host,status", [
    ("127.0.0.1:8000", 200), ("localhost:8000", 200), ("[::1]:8000", 200), ("LOCALHOST:8000", 200),
    ("attacker.example:8000", 400),  # a name rebound to 127.0.0.1: the browser sends the page's own name
    ("127.0.0.1:9000", 400), ("localhost", 400), ("10.1.2.3:8000", 400), ("", 400), ("127.0.0.1:x", 400),
])
def test_only_its_own_names_at_its_own_port_are_answered(client, host, status):
    for path in ("/", "/static/explorer.js", "/api/runs", "/api/runs/scaled"):
        r = client.get(path, headers={"host": host})
        assert r.status_code == status, (path, host)
    if status != 200:
        assert "answers only at its own address" in r.json()["error"] and "\n" not in r.json()["error"]
        assert client.post("/api/read", json=dict(run="scaled", text="abc"), headers={"host": host}).status_code == 400


def test_a_wildcard_bind_answers_this_machines_own_name(lab):
    app = TestClient(make_app(Shelf(lab[0], "cpu", "float32"), "0.0.0.0", 8000), base_url="http://127.0.0.1:8000")
    assert app.get("/api/runs", headers={"host": f"{socket.gethostname()}:8000"}).status_code == 200
    assert app.get("/api/runs", headers={"host": "attacker.example:8000"}).status_code == 400


@pytest.mark.parametrize("origin,status", [
    (None, 200),  # not a browser (curl, a script): no page to forge a request from
    ("http://127.0.0.1:8000", 200), ("http://attacker.example", 403), ("http://localhost:8000", 403),
    ("http://127.0.0.1:9000", 403), ("null", 403), ("https://127.0.0.1:8000", 403),
])
def test_a_request_that_acts_is_taken_only_from_the_explorers_own_page(client, origin, status):
    headers = {} if origin is None else {"origin": origin}
    for path, body in (("/api/read", dict(run="scaled", text="abc")),
                       ("/api/generate", dict(run="scaled", prompt="a", max_tokens=2))):
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == status, (path, origin, r.text)
    if status == 403:
        assert "another site" in r.json()["error"]


def test_no_other_sites_page_reaches_the_api_but_a_link_opens_the_page(client):
    cross = {"sec-fetch-site": "cross-site"}
    assert client.get("/api/runs", headers=cross).status_code == 403
    assert client.get("/api/runs/scaled", headers=cross).status_code == 403  # no loading models from <img src>
    assert client.get("/", headers=cross).status_code == 200
    assert client.get("/api/runs", headers={"sec-fetch-site": "same-origin"}).status_code == 200


def test_every_response_says_nosniff_and_no_framing(client):
    answers = [client.get("/"), client.get("/static/explorer.js"), client.get("/api/runs"), client.get("/nothing"),
               client.post("/api/read", json={}), client.get("/", headers={"host": "attacker.example"}),
               client.post("/api/generate", json=dict(run="scaled", prompt="a", max_tokens=2))]
    for r in answers:
        assert r.headers["x-content-type-options"] == "nosniff", r.url
        assert r.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in \
            r.headers["content-security-policy"], r.url


# ----------------------------------------------------------------------------- one bad run never breaks the others


def strict_json(response):
    """The body as JSON, refusing NaN and Infinity, which JSON has not and the page's JSON.parse throws on."""
    def refuse(constant):
        raise ValueError(f"{constant} in {response.url}")
    return json.loads(response.text, parse_constant=refuse)


def with_records(folder, *records):
    with open(folder / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def copies(lab, root, *names):
    """root holding a copy of the lab's 'scaled' run under each name."""
    for name in names:
        shutil.copytree(lab[0] / "scaled", root / name)
    return root


def listed_runs(app):
    return {r["name"]: r for r in strict_json(app.get("/api/runs"))["runs"]}


def test_runs_whose_metrics_hold_what_no_run_writes_still_list_and_open(lab, tmp_path):
    """A record missing a field, NaN, Infinity or text where a number goes: the run's numbers are left out, its
    curves have a gap there, and the runs after it are listed as ever."""
    root = copies(lab, tmp_path / "runs", "good", "no_field", "nan", "infinity", "text", "bad_health", "deep", "zz")
    with_records(root / "no_field", {"kind": "final", "iter": 30})
    with_records(root / "nan", '{"kind": "eval", "iter": 30, "val_loss": NaN, "elapsed_s": 5.0}',
                 '{"kind": "final", "iter": 30, "val_loss": NaN, "elapsed_s": NaN}')
    with_records(root / "infinity", '{"kind": "train", "iter": 30, "loss": Infinity, "elapsed_s": 5.0}',
                 '{"kind": "final", "iter": 30, "val_loss": -Infinity}')
    with_records(root / "text", {"kind": "run", "elapsed_s": "soon"}, {"kind": "final", "iter": 30, "val_loss": "x"})
    with_records(root / "bad_health", {"kind": "health", "iter": 20, "overfitting": "yes"})
    with_records(root / "deep", "[" * DEEP + "]" * DEEP)
    app = app_over(root)
    runs = listed_runs(app)
    assert len(runs) == 8 and all(r["error"] is None for r in runs.values())
    for name, r in runs.items():
        if name != "deep":  # what is a number is shown, as ever
            assert r["final_val_loss"] == 2.65 and r["iterations"] in (20, 30), r
        assert r["health"] is None and (r["metrics_error"] is None) == (name != "deep"), r
        curves = app.get(run_url(name, "/metrics"))
        assert curves.status_code == (409 if name == "deep" else 200), (name, curves.text)
        points = strict_json(curves)
        if name != "deep":
            assert all(p["time"] is not None for p in points["train"] + points["eval"])
    assert "nested too deeply" in runs["deep"]["metrics_error"] and "\n" not in runs["deep"]["metrics_error"]
    assert [p["loss"] for p in strict_json(app.get("/api/runs/infinity/metrics"))["train"]] == [3.0, None]
    assert app.get("/api/runs/nan").status_code == 200


def test_a_last_record_still_being_written_is_left_out_and_the_run_keeps_its_curves(lab, timed, tmp_path):
    """A run training as the page looks (or one killed while it wrote) ends its metrics.jsonl with a line cut
    short: the records before it are the list's, the curves' and the timeline's, as a resume keeps them; a whole
    line that is not JSON is still one line saying so."""
    root = copies(lab, tmp_path / "runs", "torn", "bad")
    shutil.copytree(timed / "timed", root / "timed")
    app = app_over(root)
    whole = {name: (listed_runs(app)[name], strict_json(app.get(run_url(name, "/metrics"))),
                    strict_json(app.get(run_url(name, "/timeline")))) for name in ("torn", "timed")}
    for name in ("torn", "timed"):
        with open(root / name / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write('{"kind": "train", "iter": 40, "lo')
        got = (listed_runs(app)[name], strict_json(app.get(run_url(name, "/metrics"))),
               strict_json(app.get(run_url(name, "/timeline"))))
        assert got == whole[name] and got[0]["metrics_error"] is None, got
    with_records(root / "bad", '{"kind": "train", "iter": 40, "lo')
    assert "has a line that is not JSON" in listed_runs(app)["bad"]["metrics_error"]
    assert app.get("/api/runs/bad/metrics").status_code == 409


def test_an_rl_runs_curves_say_it_logs_rewards_not_losses(lab, tmp_path):
    """rl.py logs a reward a step and held-out scores, no loss: its curves say so and where its picture is, rather
    than that it has logged no losses yet; a run that logs losses has no such note."""
    root = copies(lab, tmp_path / "runs", "rl", "plain")
    (root / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"kind": "rl_eval", "iter": 0, "pass_at_1": 0.4, "accuracy": 0.5, "elapsed_s": 1.0},
        {"kind": "rl", "iter": 1, "reward": 0.45, "answer_tokens": 4.5, "elapsed_s": 2.0})), encoding="utf-8")
    app = app_over(root)
    rl = strict_json(app.get("/api/runs/rl/metrics"))
    assert rl["train"] == rl["eval"] == [] and rl["note"] == (
        "an rl.py run logs a reward a step and its held-out pass@1, not losses: python plot.py loss "
        "--out_dir=RUN_FOLDER draws them")
    assert strict_json(app.get("/api/runs/plain/metrics"))["note"] is None


def test_a_run_without_its_metrics_jsonl_says_so_rather_than_that_it_logged_nothing(timed, tmp_path):
    """A run folder whose metrics.jsonl is gone (deleted, or only the checkpoint copied) still opens, and its curves
    and timeline say that the file is missing, not that it has logged no losses yet or was trained before runs
    recorded a timeline; its snapshots still move the slider."""
    root = tmp_path / "runs"
    shutil.copytree(timed / "timed", root / "bare")
    (root / "bare" / "metrics.jsonl").unlink()
    app = app_over(root)
    missing = "its folder has no metrics.jsonl, where train.py records it (deleted, or not copied with the checkpoint)"
    curves = strict_json(app.get("/api/runs/bare/metrics"))
    assert curves["train"] == curves["eval"] == [] and curves["note"] == f"no curves: {missing}"
    timeline = strict_json(app.get("/api/runs/bare/timeline"))
    assert timeline["records"] == [] and timeline["note"] == f"this run has no timeline: {missing}"
    assert timeline["snapshots"] == RunDir(root / "bare").kept_snapshots() != []


def test_a_checkpoint_or_metrics_linked_out_of_its_folder_is_refused(lab, tmp_path):
    root = copies(lab, tmp_path / "runs", "good", "link", "metrics_link")
    (root / "link" / "best.pt").unlink()
    (root / "link" / "best.pt").symlink_to(lab[0] / "uniform" / "best.pt")  # a good checkpoint, outside the folder
    (root / "metrics_link" / "metrics.jsonl").unlink()
    (root / "metrics_link" / "metrics.jsonl").symlink_to(lab[0] / "uniform" / "metrics.jsonl")
    app = app_over(root)
    runs = listed_runs(app)
    assert "best.pt is a link leading out of the run's folder" in runs["link"]["error"]
    assert app.get("/api/runs/link").status_code == 409
    assert app.post("/api/read", json=dict(run="link", text="abc")).status_code == 409
    assert "link leading out" in runs["metrics_link"]["metrics_error"]
    assert app.get("/api/runs/metrics_link/metrics").status_code == 409
    assert app.get("/api/runs/good").status_code == 200


def test_a_folder_name_of_any_characters_opens_or_is_one_line(lab, tmp_path):
    """The page asks for a run by its name percent-encoded as one path segment (api.js's runUrl): a newline, '%',
    '#' or '?' in it still reach it. A name that is not UTF-8 (Linux allows any bytes) is listed, and says why
    it cannot be opened."""
    root = copies(lab, tmp_path / "runs", "a\nnewline", "50% #?&=+", os.fsdecode(b"caf\xe9"), "zz")
    app = app_over(root)
    runs = listed_runs(app)
    assert set(runs) == {"a\nnewline", "50% #?&=+", "caf\ufffd", "zz"}
    assert "not UTF-8" in runs["caf\ufffd"]["error"] and app.get(run_url("caf\ufffd")).status_code == 404
    for name in ("a\nnewline", "50% #?&=+"):
        assert app.get(run_url(name)).json()["name"] == name
        assert app.get(run_url(name, "/metrics")).status_code == 200
        assert app.post("/api/generate", json=dict(run=name, prompt="a", max_tokens=3)).status_code == 200


def run_url(name, suffix=""):
    """The page's runUrl (api.js): the name percent-encoded as one path segment."""
    return "/api/runs/" + urllib.parse.quote(name, safe="") + suffix


@pytest.fixture
def unreadable(monkeypatch):
    """Make a folder unreadable to this process (mode 000), as it is to any user but root; under root, whom modes
    do not stop, os.stat is refused inside it as the kernel refuses others."""
    def lock(folder):
        folder.chmod(0)
        monkeypatch.setattr(os, "stat", refusing(os.stat, str(folder) + os.sep))
    yield lock


def refusing(stat, prefix):
    def fake(path, *args, **kwargs):
        if os.geteuid() == 0 and os.fspath(path).startswith(prefix):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return stat(path, *args, **kwargs)
    return fake


def test_an_unreadable_run_folder_is_one_line_and_the_rest_serve(lab, tmp_path, unreadable):
    shutil.copytree(lab[0] / "scaled", tmp_path / "runs" / "fine")
    shutil.copytree(lab[0] / "scaled", tmp_path / "runs" / "locked")
    unreadable(tmp_path / "runs" / "locked")
    try:
        app = app_over(tmp_path / "runs")
        runs = {r["name"]: r for r in app.get("/api/runs").json()["runs"]}
        assert "cannot read" in runs["locked"]["error"] and "Permission denied" in runs["locked"]["error"]
        assert app.get("/api/runs/locked").status_code == 409 and app.get("/api/runs/fine").status_code == 200
    finally:
        (tmp_path / "runs" / "locked").chmod(0o755)


# ----------------------------------------------------------------------------- the list is live


def test_the_list_shows_the_folder_as_it_is_now(lab, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(lab[0] / "scaled", root / "first")
    app = app_over(root)
    assert [(r["name"], r["step"]) for r in app.get("/api/runs").json()["runs"]] == [("first", 20)]
    assert app.get("/api/runs/first").json()["n_layer"] == 2
    fake_run(root / "later", 7)  # trained after start-up
    assert [r["name"] for r in app.get("/api/runs").json()["runs"]] == ["first", "later"]
    assert app.post("/api/read", json=dict(run="later", text="abc")).status_code == 200
    other = tmp_path / "other"  # another model, with another vocabulary, replaces first's checkpoint
    model = tiny_model(3, **dict(SHAPE, n_layer=1, vocab_size=5))
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config),
                     "tokenizer": CharTokenizer("abcde").to_meta()}, other / "best.pt")
    os.replace(other / "best.pt", root / "first" / "best.pt")
    first = next(r for r in app.get("/api/runs").json()["runs"] if r["name"] == "first")
    assert first["settings"].startswith("1 layer,") and first["tokenizer"] == "a vocabulary of 5 characters"
    picked = app.get("/api/runs/first").json()
    assert picked["n_layer"] == 1 and picked["vocab_size"] == 5
    shutil.rmtree(root / "later")
    assert app.get("/api/runs/later").status_code == 404


def test_a_lora_runs_entry_says_lora_at_its_rank_and_counts_the_merged_models_parameters(tmp_path, capsys):
    """A fine-tune with lora_rank=2: the list never said LoRA, and counted the adapters among the parameters of a
    model the explorer runs merged. Now it counts the merged model's (model.py's merge_lora), and says what the
    adapters trained in the very line train.py prints as the fine-tune starts."""
    from gptkit.training.starting import build_model
    from model import count_params, merge_lora

    model = fake_run(tmp_path / "runs" / "lora", lora_rank=2, tie_weights=False)  # LoRA adapts head and table apart
    fake_run(tmp_path / "runs" / "plain", tie_weights=False)
    build_model(TrainConfig(), model.config, {"vocab_size": len(CHARS)})  # as train.py starts a LoRA fine-tune
    said = capsys.readouterr().out.splitlines()[0]
    assert said.startswith("LoRA rank 2: ")
    runs = {r["name"]: r for r in app_over(tmp_path / "runs").get("/api/runs").json()["runs"]}
    merged, config = merge_lora(model.state_dict(), model.config)
    assert runs["lora"]["params"] == count_params(merged, config) < count_params(model.state_dict(), model.config)
    assert runs["lora"]["lora"] == said
    assert runs["plain"]["lora"] is None and runs["plain"]["params"] == runs["lora"]["params"]


def test_a_run_trained_again_to_the_same_step_is_listed_as_another_write_of_its_checkpoint(lab, tmp_path):
    """Trained again into its folder to the same step, a run's entry held the same settings and step as before,
    which is all the page compared: it went on showing the old model. Now the entry says which write of the
    checkpoint file it is, the same while the file is, another once the run is trained again, and the run picked
    then is the new model."""
    root = tmp_path / "runs"
    fake_run(root / "run", 0)
    app = app_over(root)
    first = app.get("/api/runs").json()["runs"][0]
    assert first["written"] and app.get("/api/runs").json()["runs"][0]["written"] == first["written"]
    fake_run(tmp_path / "again", 1)
    os.replace(tmp_path / "again" / "best.pt", root / "run" / "best.pt")
    now = app.get("/api/runs").json()["runs"][0]
    assert now["step"] == first["step"] and now["settings"] == first["settings"] and now["written"] != first["written"]
    read = app.post("/api/read", json=dict(run="run", text="abc def")).json()
    ids = torch.tensor([ids_of("abc def")])
    with torch.no_grad():
        loss = fake_run(tmp_path / "third", 1)(ids[:, :-1], ids[:, 1:])[1].item()
    assert read["loss"] == pytest.approx(loss, rel=1e-5)


def test_a_run_without_best_pt_opens_its_latest_state_and_says_so(lab, tmp_path):
    run = tmp_path / "runs" / "young"
    shutil.copytree(lab[0] / "scaled", run)
    shutil.copy(run / "best.pt", run / "latest.pt")
    app = app_over(tmp_path / "runs")
    assert app.get("/api/runs/young").status_code == 200 and \
        app.get("/api/runs").json()["runs"][0]["checkpoint"] == "best.pt"
    (run / "best.pt").unlink()  # gone while the explorer runs: the latest state is what there is to show
    assert app.get("/api/runs").json()["runs"][0]["checkpoint"] == "latest.pt"
    r = app.get("/api/runs/young")
    assert r.status_code == 200 and "--" not in r.text


# ----------------------------------------------------------------------------- every error in one shape


@pytest.mark.parametrize("method,path,body,headers,status,message", [
    pytest.param("POST", "/api/read", b'{"run": "scaled", "text": ', "application/json", 400, "not JSON",
                 id="malformed"),
    pytest.param("POST", "/api/read", b"[" * DEEP + b"]" * DEEP, "application/json", 400, "nested too deeply",
                 id="nested"),
    pytest.param("POST", "/api/read", '{"run": "scaled", "text": "é"}'.encode("latin-1"), "application/json", 400,
                 "not UTF-8", id="latin-1"),
    pytest.param("GET", "/api/read", None, None, 405, "does not take GET", id="method"),
    pytest.param("GET", "/api/nothing/here", None, None, 404, "nothing at /api/nothing/here", id="route"),
    pytest.param("GET", "/static/nothing.js", None, None, 404, "nothing at", id="static"),
])
def test_every_refusal_is_one_json_line_never_detail(client, method, path, body, headers, status, message):
    r = client.request(method, path, content=body, headers={"content-type": headers} if headers else {})
    assert r.status_code == status and set(r.json()) == {"error"}, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


# ----------------------------------------------------------------------------- a real server


@pytest.fixture
def server(lab):
    """explore.py serving the lab folder on a free port: (its address, the process)."""
    proc = subprocess.Popen([sys.executable, str(REPO / "explore.py"), str(lab[0]), "--port=0", "--device=cpu",
                             "--dtype=float32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("explorer: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
    yield line.split()[1].rstrip("/"), proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_client_that_goes_away_stops_its_generation(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/api/generate", json=dict(run="scaled", prompt="a", max_tokens=2000)) as r:
            next(r.iter_lines())  # the prompt event: generation has begun
        # the client is gone: a new generation gets the model (the lock is free) and the server still answers
        done = events(http.post("/api/generate", json=dict(run="scaled", prompt="a", max_tokens=3)).iter_lines())
        assert done[-1]["type"] == "done"


@pytest.mark.slow
def test_ten_clients_streaming_at_once_are_all_served(server):
    url, _ = server
    results = []

    def one(seed):
        with httpx.Client(base_url=url, timeout=60) as http:
            got = events(http.post("/api/generate", json=dict(run="rope", prompt="ab", max_tokens=50,
                                                              seed=seed)).iter_lines())
            results.append((seed, got[-1]))

    threads = [threading.Thread(target=one, args=(seed,)) for seed in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 10 and all(done["type"] == "done" for _, done in results)
    texts = dict(results)
    solo = events(httpx.post(f"{url}/api/generate", json=dict(run="rope", prompt="ab", max_tokens=50, seed=3),
                             timeout=60).iter_lines())[-1]
    assert texts[3] == solo  # interleaved with nine others, a generation is the one it is alone


@pytest.mark.slow
def test_ctrl_c_stops_the_server_cleanly(server):
    _, proc = server
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err and "explorer stopped" in out, (out, err)


def start(folder, *options):
    """explore.py serving folder on a free port: the process and the line with its address."""
    proc = subprocess.Popen([sys.executable, str(REPO / "explore.py"), str(folder), "--port=0", "--device=cpu",
                             "--dtype=float32", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline()


def stop(proc):
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=30)


@pytest.mark.slow
def test_listening_beyond_this_machine_warns_in_one_line_and_answers_this_machines_names(lab):
    proc, line = start(lab[0] / "scaled", "--host=0.0.0.0")
    try:
        assert line.startswith("explorer: http://0.0.0.0:"), line
        port = int(line.split()[1].rstrip("/").rsplit(":", 1)[1])
        # an address a connection arrives at is this machine's own (on Linux all of 127.0.0.0/8 is), and so is
        # its host name; a name rebound to it is not
        for host, status in ((f"127.0.0.2:{port}", 200), (f"{socket.gethostname()}:{port}", 200),
                             (f"attacker.example:{port}", 400)):
            assert httpx.get(f"http://127.0.0.2:{port}/api/runs", headers={"host": host}).status_code == status, host
    finally:
        _, err = stop(proc)
    assert err.startswith("warning: listening on 0.0.0.0: the page is reachable from the network"), err


@pytest.mark.slow
def test_a_loopback_address_does_not_warn_and_a_name_that_does_not_resolve_is_one_line(lab):
    proc, line = start(lab[0] / "scaled", "--host=127.0.0.2")  # 127.0.0.0/8 is this machine's loopback
    try:
        assert line.startswith("explorer: http://127.0.0.2:"), line
        assert httpx.get(line.split()[1] + "api/runs").status_code == 200
    finally:
        _, err = stop(proc)
    assert "warning" not in err, err
    from conftest import assert_one_error_line

    failed = run_script("explore.py", lab[0] / "scaled", "--host=nosuch.invalid", "--device=cpu")
    line = assert_one_error_line(failed.stderr)
    assert "no address of that name" in line and "--host" in line and "--port" not in line


@pytest.mark.slow
def test_no_request_is_a_500_or_a_traceback_on_the_console(lab, tmp_path):
    root = copies(lab, tmp_path / "runs", "good", "nan", "a\nnewline", "link")
    with_records(root / "nan", '{"kind": "final", "iter": 30, "val_loss": NaN, "elapsed_s": "x"}')
    (root / "link" / "best.pt").unlink()
    (root / "link" / "best.pt").symlink_to(lab[0] / "uniform" / "best.pt")
    proc, line = start(root)
    try:
        url, answers = line.split()[1].rstrip("/"), []
        with httpx.Client(base_url=url, timeout=30) as http:
            answers += [http.get("/api/runs"), http.get("/api/runs", headers={"host": "attacker.example"}),
                        http.post("/api/read", content=b"[" * 5000, headers={"content-type": "application/json"}),
                        http.post("/api/read", content=b"\xff", headers={"content-type": "application/json"}),
                        http.post("/api/read", json=dict(run="good", text="a"), headers={"origin": "null"})]
            for r in answers[0].json()["runs"]:
                answers += [http.get(run_url(r["name"])), http.get(run_url(r["name"], "/metrics"))]
        assert all(r.status_code < 500 and set(r.json()) != {"detail"} for r in answers), \
            [(r.url, r.status_code, r.text) for r in answers]
    finally:
        _, err = stop(proc)
    assert "Traceback" not in err and "Error" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["no-such-folder"], "no-such-folder is not a folder"),
    (["--port=70000"], "port must be a port number"),
    (["bad.py", "--folder=."], "bad.py: not a valid config file"),  # a config file, as every script takes one
])
def test_explore_py_refuses_bad_input_in_one_line(args, message, tmp_path):
    from conftest import assert_one_error_line

    (tmp_path / "bad.py").write_text("port = = 1\n")
    proc = run_script("explore.py", *args, cwd=tmp_path)
    assert proc.returncode == 1 and message in assert_one_error_line(proc.stderr)
    empty = run_script("explore.py", str(tmp_path), cwd=tmp_path)
    assert "no runs in" in assert_one_error_line(empty.stderr)


# ----------------------------------------------------------------------------- experiments: parts switched off


def test_with_heads_off_every_number_is_the_experiments_apis(client, lab):
    """Position, head map and read with L0H1 and MLP1 off equal gptkit.interp.experiments.ablated's forward pass; the
    read also carries the intact model's reading."""
    from gptkit.interp.experiments import ablated
    from gptkit.interp.hooks import look_inside, surprise_bits
    model, ids, pos = lab[1]["scaled"], ids_of(TEXT)[:20], 11
    off = ["L0H1", "MLP1"]
    got = client.post("/api/position", json=dict(run="scaled", ids=ids, position=pos, k=len(CHARS), off=off)).json()
    assert got["off"] == {"names": off, "label": "L0H1, MLP1", "note": None}
    idx = torch.tensor([ids])
    with ablated(model, heads=["L0H1"], mlps=[1]), torch.no_grad():
        logits = model(idx, idx)[0][0]
        maps = look_inside(model, idx)[1]
        bits = surprise_bits(model, idx[:, :-1], idx[:, 1:])[0]
    probs = torch.softmax(logits[pos - 1], -1)
    assert {c["id"]: c["p"] for c in got["why"]["raw"]} == \
        pytest.approx({i: probs[i].item() for i in range(len(CHARS))}, abs=1e-6)
    assert [c["p"] for c in got["lens"][-1]["top"]] == \
        pytest.approx(torch.softmax(logits[pos], -1).topk(5).values.tolist(), abs=1e-6)
    assert got["attention"]["rows"][1][0] == pytest.approx(maps[1][0, 0, pos].tolist(), abs=1e-6)
    head_map = client.post("/api/attention_map", json=dict(run="scaled", ids=ids, layer=1, head=1, off=off)).json()
    assert torch.tensor(head_map["weights"]) == pytest.approx(maps[1][0, 1], abs=1e-6)
    read = client.post("/api/read", json=dict(run="scaled", text=TEXT[:20], off=off)).json()
    assert [t["surprise_bits"] for t in read["tokens"][1:]] == pytest.approx(bits.tolist(), abs=1e-5)
    intact = client.post("/api/read", json=dict(run="scaled", text=TEXT[:20])).json()
    assert read["intact"] == intact and "intact" not in intact and read["total_bits"] != intact["total_bits"]


def test_generation_with_a_head_off_is_decoding_under_the_apis_ablation(client, lab):
    """The streamed tokens are decode_steps' on the ablated model, KV cache and all, for the same seed."""
    from gptkit.interp.experiments import ablated
    from gptkit.sampling.decoding import decode_steps
    model, prompt = lab[1]["rope"], "ROMEO:"
    body = dict(run="rope", prompt=prompt, max_tokens=30, seed=5, temperature=1.0, top_k=0, off=["L1H0"])
    streamed = [e["id"] for e in events(client.post("/api/generate", json=body).iter_lines()) if e["type"] == "token"]
    with ablated(model, heads=["L1H0"]):
        steps = decode_steps(model, torch.tensor([ids_of(prompt)]), 30, temperature=1.0,
                             generator=torch.Generator().manual_seed(5), vocab_size=len(CHARS))
        want = [step[0].item() for step in steps]
    intact = [e["id"] for e in events(client.post("/api/generate", json=dict(body, off=[])).iter_lines())
              if e["type"] == "token"]
    assert streamed == want and intact != want


def test_what_is_off_travels_with_each_request_only(client):
    """Requests with different parts off, in any order, do not change one another's answers."""
    ids, body = ids_of(TEXT)[:16], dict(run="scaled", position=9, k=5)
    intact = client.post("/api/position", json=dict(body, ids=ids)).json()
    off = client.post("/api/position", json=dict(body, ids=ids, off=["L0H0", "L1H1"])).json()
    again = client.post("/api/position", json=dict(body, ids=ids)).json()
    assert off["why"] != intact["why"] and again == intact
    every = client.post("/api/position", json=dict(body, ids=ids, off=["L0H0", "L0H1", "L1H0", "L1H1"])).json()
    assert "every head is off" in every["off"]["note"]


@pytest.mark.parametrize("path,body,message", [
    ("/api/position", dict(run="scaled", ids=[0, 1], position=1, off=["L2H0"]), "head L2H0 is out of range"),
    ("/api/position", dict(run="scaled", ids=[0, 1], position=1, off=["L0H7"]), "head L0H7 is out of range"),
    ("/api/read", dict(run="scaled", text="abc", off=["head3"]), "'head3' is not a head"),
    ("/api/read", dict(run="scaled", text="abc", off=["MLP5"]), "MLP5 is out of range"),
    ("/api/generate", dict(run="bigram", prompt="a", off=["L0H0"]), "this model has no attention"),
    ("/api/attention_map", dict(run="uniform", ids=[0, 1], layer=0, head=0, off=["MLP9"]), "MLP9 is out of range"),
    ("/api/scores", dict(run="bigram", ids=[0, 1], position=1, layer=0, head=0), "this model has no attention"),
    ("/api/scores", dict(run="scaled", ids=[0, 1], position=2, layer=0, head=0), "past the last"),
    ("/api/scores", dict(run="scaled", ids=[0, 1], position=1, layer=0, head=2), "no head 2 in layer 0"),
    ("/api/runs/bigram/heads", None, "this model has no attention"),
])
def test_parts_the_model_lacks_are_one_line_and_a_400(client, path, body, message):
    r = client.get(path) if body is None else client.post(path, json=body)
    assert r.status_code == 400 and message in r.json()["error"] and "\n" not in r.json()["error"], r.text


def test_a_heads_scores_before_the_softmax_raw_and_scaled_are_q_dot_k(client, lab):
    """raw = q·k from the hooked queries and keys, scaled = raw / sqrt(d), the weights their masked softmax."""
    from gptkit.interp.hooks import run_with_cache
    model, ids, pos = lab[1]["scaled"], ids_of(TEXT)[:14], 9
    got = client.post("/api/scores", json=dict(run="scaled", ids=ids, position=pos, layer=1, head=1)).json()
    _, cache = run_with_cache(model, torch.tensor([ids]), ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"])
    q, k = cache["blocks.1.attn.hook_q"][0, pos, 1], cache["blocks.1.attn.hook_k"][0, :, 1]
    raw = [sum(q[i].item() * k[j, i].item() for i in range(q.numel())) for j in range(pos + 1)]  # by hand
    d = q.numel()
    assert got["d_head"] == d and got["raw"][:pos + 1] == pytest.approx(raw, abs=1e-4)
    assert got["raw"][pos + 1:] == [None] * (len(ids) - pos - 1)  # the future, masked
    assert got["scaled"][:pos + 1] == pytest.approx([r / math.sqrt(d) for r in raw], abs=1e-4)
    assert got["used"] == pytest.approx(got["scaled"], abs=1e-4)  # scaled attention softmaxes the scaled scores
    assert got["weights"][:pos + 1] == pytest.approx(torch.softmax(torch.tensor(raw) / math.sqrt(d), -1).tolist(),
                                                     abs=1e-5)
    assert got["weights_unscaled"][:pos + 1] == pytest.approx(torch.softmax(torch.tensor(raw), -1).tolist(), abs=1e-5)


def test_each_head_wears_the_label_of_its_strongest_kind(client, lab):
    from gptkit.interp.experiments import chance_scores, head_labels, head_scores, induction_tokens
    got = client.get("/api/runs/scaled/heads").json()
    model = lab[1]["scaled"]
    repeated = induction_tokens(model, len(CHARS))  # the run's dataset is not here: the text scores read these
    scores = head_scores(model, repeated, repeated)
    assert got["labels"] == head_labels(scores, chance_scores(repeated, repeated)) and "random" in got["text"]
    assert torch.tensor(got["scores"]["previous_token"]) == pytest.approx(scores["previous_token"], abs=1e-4)


def test_the_lab_lists_each_rungs_val_loss_curve(lab, tmp_path):
    root = copies(lab, tmp_path / "root", "scaled", "uniform")
    (root / "scaled" / "lab.json").write_text(json.dumps({"rung": "bigram"}), encoding="utf-8")
    got = app_over(root).get("/api/lab").json()["runs"]
    assert [r["name"] for r in got] == ["scaled"] and got[0]["rung"]["name"] == "bigram"
    assert got[0]["eval"] == [{"iter": 0, "val_loss": 3.4}, {"iter": 20, "val_loss": 2.7}]
    assert got[0]["final"] == {"val_loss": 2.65, "bits_per_char": pytest.approx(2.65 / math.log(2))}


def test_a_rung_the_lab_found_seeing_ahead_is_listed_as_cheating(lab, tmp_path):
    """A lab run after the mask was taken out of model.py by hand: its table marks the scaled rung '(cheats)', as the
    encoder's, and the explorer listed it as the plain rung. Now the run list and the lab panel mark it too."""
    root = copies(lab, tmp_path / "root", "scaled", "uniform")
    (root / "scaled" / "lab.json").write_text(json.dumps({"rung": "scaled", "sees_ahead": True}), encoding="utf-8")
    (root / "uniform" / "lab.json").write_text(json.dumps({"rung": "uniform", "sees_ahead": False}), encoding="utf-8")
    client = app_over(root)
    listed = {r["name"]: r["rung"]["cheats"] for r in client.get("/api/runs").json()["runs"]}
    assert listed == {"scaled": True, "uniform": False}
    assert {r["name"]: r["rung"]["cheats"] for r in client.get("/api/lab").json()["runs"]} == listed


# ----------------------------------------------------------------------------- features: an SAE on the run


def api_features(lab):
    """The Python API's run and its features at HOOK, for the lab's 'scaled' run."""
    from gptkit.interp.experiments import open_run

    run = open_run(lab[0] / "scaled")
    return run, run.features(HOOK)


def activations(run, f, ids, heads=()):
    """Every feature's value at every token of ids (one window), as the API gives them: f.encode of the activation
    run_with_cache keeps at HOOK, with heads off."""
    with run.ablated(heads=heads):
        _, cache = run.run_with_cache(torch.tensor([ids]), HOOK)
    return f.encode(cache[HOOK])[0]


def test_a_runs_saes_are_listed_and_each_is_the_apis_own(client, lab):
    """The run's answer lists its SAEs; an SAE's answer is run.features(hook)'s shape, metrics and table."""
    run, f = api_features(lab)
    assert client.get("/api/runs/scaled").json()["saes"] == [HOOK]
    assert client.get("/api/runs/uniform").json()["saes"] == []
    got = strict_json(client.get(f"/api/runs/scaled/sae/{HOOK}"))
    assert (got["hook"], got["d_sae"], got["k"], got["d_in"]) == (HOOK, f.d_sae, f.sae.k, run.config.n_embd)
    assert got["metrics"] == {k: f.metrics[k] for k in got["metrics"]} and "ce_loss_recovered" in got["metrics"]
    assert got["frequent"] == f.table[:16] and len(f.table) == D_SAE


def test_a_tokens_features_are_the_apis_encoding_with_parts_off(client, lab):
    """The features active at a token are every nonzero value of f.encode at HOOK, largest first, each with its
    row of f.table; with a head off, the API's under run.ablated; a feature off at HOOK itself shows the value it
    is switched off at (read as the activation arrives) and says it is off."""
    run, f = api_features(lab)
    rows = {row["index"]: row for row in f.table}
    ids, pos = ids_of(TEXT)[:20], 11
    body = dict(run="scaled", hook=HOOK, ids=ids, position=pos)
    for heads in ([], ["L0H1"]):
        want = activations(run, f, ids, heads)[pos]
        firing = [i for i in want.argsort(descending=True).tolist() if want[i] > 0]
        got = strict_json(client.post("/api/token_features", json=dict(body, off=heads)))
        assert [g["index"] for g in got["features"]] == firing and 0 < len(firing) <= f.sae.k
        assert [g["value"] for g in got["features"]] == pytest.approx(want[firing].tolist(), abs=1e-5)
        assert [g["row"] for g in got["features"]] == [rows[i] for i in firing]
        assert got["token"]["id"] == ids[pos] and not any(g["off"] for g in got["features"])
    off = client.post("/api/token_features", json=dict(body, off=["L0H1", f"{HOOK} F{firing[0]}"])).json()
    assert [(g["index"], g["value"], g["off"]) for g in off["features"]] == \
        [(g["index"], g["value"], g["index"] == firing[0]) for g in got["features"]]
    assert off["off"]["names"] == ["L0H1", f"{HOOK} F{firing[0]}"]


def test_where_a_feature_fires_is_its_value_at_every_token_as_the_api_gives_it(client, lab):
    """One feature's value at every token of a text longer than the context (read in consecutive windows, as read
    a text reads it), and its row of f.table; without a text, the row alone."""
    run, f = api_features(lab)
    index = f.table[0]["index"]  # the most frequent: it fires
    text, T = TEXT * 2, SHAPE["block_size"]
    got = strict_json(client.post("/api/feature", json=dict(run="scaled", hook=HOOK, feature=index, text=text)))
    ids = ids_of(text)
    want = torch.cat([activations(run, f, ids[s:s + T])[:, index] for s in range(0, len(ids), T)])
    assert [t["id"] for t in got["tokens"]] == ids and got["row"] == f.table[0] and got["feature"] == index
    assert [t["value"] for t in got["tokens"]] == pytest.approx(want.tolist(), abs=1e-5)
    assert 0 < sum(v > 0 for v in want.tolist()) < len(ids)
    alone = client.post("/api/feature", json=dict(run="scaled", hook=HOOK, feature=5)).json()
    assert alone["tokens"] == [] and alone["row"] == next(r for r in f.table if r["index"] == 5)


def test_a_feature_switched_off_changes_every_answer_as_the_apis_ablation_does(client, lab):
    """Read a text, why this token and writing with a feature off are run.ablated(features=...)'s forward pass and
    decoding; the read also carries the intact model's reading."""
    from gptkit.interp.hooks import surprise_bits
    from gptkit.sampling.decoding import decode_steps
    run, f = api_features(lab)
    index, off = f.table[0]["index"], [f"{HOOK} F{f.table[0]['index']}"]
    ids, pos = ids_of(TEXT)[:20], 11
    idx = torch.tensor([ids])
    with run.ablated(features={HOOK: [index]}) as ablation, torch.no_grad():
        assert ablation.label == off[0]
        bits = surprise_bits(run.model, idx[:, :-1], idx[:, 1:])[0]
        probs = torch.softmax(run.model(idx, idx)[0][0, pos - 1], -1)
        steps = decode_steps(run.model, torch.tensor([ids_of("ROMEO:")]), 20, temperature=1.0,
                             generator=torch.Generator().manual_seed(5), vocab_size=len(CHARS))
        written = [step[0].item() for step in steps]
    read = client.post("/api/read", json=dict(run="scaled", text=TEXT[:20], off=off)).json()
    assert [t["surprise_bits"] for t in read["tokens"][1:]] == pytest.approx(bits.tolist(), abs=1e-5)
    assert read["off"] == {"names": off, "label": off[0], "note": None}
    assert read["intact"] == client.post("/api/read", json=dict(run="scaled", text=TEXT[:20])).json()
    assert read["intact"]["total_bits"] != pytest.approx(read["total_bits"], abs=1e-3)
    got = client.post("/api/position", json=dict(run="scaled", ids=ids, position=pos, k=len(CHARS), off=off)).json()
    # the page's model reaches the probabilities on another path (look_inside, then the head): sums in another order
    assert {c["id"]: c["p"] for c in got["why"]["raw"]} == \
        pytest.approx({i: probs[i].item() for i in range(len(CHARS))}, abs=1e-5)
    body = dict(run="scaled", prompt="ROMEO:", max_tokens=20, seed=5, temperature=1.0, top_k=0, off=off)
    streamed = [e["id"] for e in events(client.post("/api/generate", json=body).iter_lines()) if e["type"] == "token"]
    assert streamed == written


@pytest.mark.parametrize("path,body,status,message", [
    ("/api/read", dict(text="abc", off=["nowhere F1"]), 400, "'nowhere' is not a hook point of this model"),
    ("/api/read", dict(text="abc", off=["blocks.0.hook_resid_post F1"]), 404,
     "run 'scaled' has no SAE at blocks.0.hook_resid_post"),
    ("/api/position", dict(ids=[0, 1], position=1, off=[f"{HOOK} F{D_SAE}"]), 400,
     f"feature {D_SAE} is out of range: the SAE at {HOOK} has features 0 to {D_SAE - 1}"),
    ("/api/generate", dict(prompt="a", off=[f"{HOOK} F" + "9" * 30]), 400, "is out of range"),
    ("/api/attention_map", dict(ids=[0, 1], layer=0, head=0, off=["F12"]), 400,
     "'F12' is not a head, an MLP or a feature: write L0H3 (layer 0, head 3), MLP1, or a feature of an SAE as "
     "'blocks.1.hook_resid_post F12'"),
    ("/api/read", dict(run="uniform", text="abc", off=[f"{HOOK} F1"]), 404, "run 'uniform' has no SAE at"),
    ("/api/token_features", dict(hook="blocks.0.hook_resid_post", ids=[0, 1], position=1), 404, "has no SAE at"),
    ("/api/token_features", dict(hook=HOOK, ids=[0, 1], position=2), 400, "past the last of 2 tokens"),
    ("/api/token_features", dict(hook="blocks.7.hook_resid_post", ids=[0, 1], position=1), 400,
     "'blocks.7.hook_resid_post' is not a hook point"),
    ("/api/feature", dict(hook=HOOK, feature=D_SAE), 400, f"feature {D_SAE} is out of range"),
    ("/api/feature", dict(hook=HOOK, feature=1, text="xyz"), 400, "outside the training vocabulary"),
    ("/api/runs/scaled/sae/nowhere", None, 400, "'nowhere' is not a hook point"),
    ("/api/runs/uniform/sae/" + HOOK, None, 404, "run 'uniform' has no SAE at " + HOOK),
])
def test_a_feature_that_names_nothing_is_one_line_and_a_4xx(client, path, body, status, message):
    r = client.get(path) if body is None else client.post(path, json=dict(dict(run="scaled"), **body))
    assert r.status_code == status and message in r.json()["error"] and "\n" not in r.json()["error"], r.text


def test_an_sae_is_read_once_again_when_retrained_and_damaged_or_foreign_is_one_409_line(lab, tmp_path,
                                                                                          monkeypatch):
    """The shelf reads an SAE once (run.features), and again when its files are replaced; damaged, trained on
    other weights, or a link leading out of the run, it is a 409 line naming no path of this machine, for the
    features and for a request that switches one of its features off, and the run still serves the rest."""
    from gptkit.interp.experiments import Run
    root = copies(lab, tmp_path / "runs", "run")
    reads, features = [], Run.features
    monkeypatch.setattr(Run, "features", lambda self, hook: reads.append(hook) or features(self, hook))
    app, url = app_over(root), f"/api/runs/run/sae/{HOOK}"
    first = app.get(url).json()
    assert app.get(url).json() == first and reads == [HOOK]
    with_sae(root / "run", lab[1]["scaled"], seed=1)  # trained again
    assert app.get(url).json()["frequent"] != first["frequent"] and reads == [HOOK, HOOK]
    weights = root / "run" / "sae" / HOOK / "sae_weights.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    later = weights.stat().st_mtime_ns + 10 ** 9  # edited a second later: within one tick of the clock, unseen
    os.utime(weights, ns=(later, later))
    with_sae(root / "elsewhere", lab[1]["scaled"])  # beside the run, not in it
    with_sae(root / "foreign", lab[1]["scaled"], fingerprint="0" * 64)
    for problem, change in [("is damaged or was edited", None),
                            ("trained on other weights than this run's checkpoint",
                             lambda sae: shutil.copytree(root / "foreign" / "sae" / HOOK, sae)),
                            ("is a link leading out of the run's folder",
                             lambda sae: sae.symlink_to(root / "elsewhere" / "sae" / HOOK))]:
        sae = root / "run" / "sae" / HOOK
        if change:
            shutil.rmtree(sae)
            change(sae)
        for r in (app.get(url), app.post("/api/read", json=dict(run="run", text="abc", off=[f"{HOOK} F1"]))):
            assert r.status_code == 409 and problem in r.json()["error"], r.text
            assert str(tmp_path) not in r.text and "\n" not in r.json()["error"]
            assert r.json()["error"].startswith(f"the SAE at {HOOK} of run 'run' cannot be read: ")
    assert app.post("/api/read", json=dict(run="run", text="abc")).status_code == 200


# ----------------------------------------------------------------------------- a run cut into BPE tokens


BPE_TEXT = "a coin 🪙 and 🎶\nЛиса нашла"  # holds tokens that are part of a character (conftest's MIXED_LINES)


def label_bytes(label):
    """The bytes a token's label stands for: its text, whitespace drawn as symbols, and ⟨e4⟩ for a byte."""
    pieces = re.split(r"⟨([0-9a-f]{2})⟩", label)  # text, a byte, text, ...
    return b"".join(bytes.fromhex(p) if i % 2 else p.replace("␣", " ").replace("↵", "\n").encode("utf-8")
                    for i, p in enumerate(pieces))


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, bpe_data):
    """A run whose tokenizer is conftest's trained byte-level BPE, its final record with train.py's bits per
    character: (its folder's parent, the model, the tokenizer)."""
    root, tok = tmp_path_factory.mktemp("bpe_runs"), bpe_data[2]
    model = fake_run(root / "bpe", 3, tok=tok, final={"bits_per_char": 1.25})
    return root, model, tok


def test_a_bpe_runs_tokens_come_with_their_ids_and_a_cut_characters_bytes_as_its_label(bpe_run):
    root, model, tok = bpe_run
    got = app_over(root).post("/api/read", json=dict(run="bpe", text=BPE_TEXT)).json()
    ids = tok.encode(BPE_TEXT)
    assert got["tokenizer_kind"] == "bpe" and [t["id"] for t in got["tokens"]] == ids
    cut = partial_tokens(tok, ids)
    assert cut, "the text must hold a token that is part of a character"
    for t in got["tokens"]:
        data = tok.enc.decode_single_token_bytes(t["id"])
        if t["id"] in cut:  # its text alone is no character: U+FFFD; the label writes those bytes
            assert "\ufffd" in t["text"] and "\ufffd" not in t["label"] and "⟨" in t["label"]
        else:
            assert t["text"] == data.decode("utf-8")
        assert label_bytes(t["label"]) == data
    # bits per character: every predicted token's nats, over ln 2 and the characters those tokens spell (a
    # character cut between tokens counted once, where its first byte is)
    T, nats = SHAPE["block_size"], 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, T):
            y = torch.tensor([ids[start + 1:start + 1 + T]])
            nats += model(torch.tensor([ids[start:start + y.size(1)]]), y)[1].item() * y.size(1)
    spelled = b"".join(tok.enc.decode_single_token_bytes(t) for t in ids[1:])
    characters = sum(1 for b in spelled if b & 0xC0 != 0x80)
    assert got["predicted_chars"] == characters and got["chars"] == len(BPE_TEXT)
    assert got["bits_per_char"] == pytest.approx(nats / (math.log(2) * characters), rel=1e-5)
    assert got["loss"] == pytest.approx(nats / (len(ids) - 1), rel=1e-5)


def test_a_bpe_runs_generation_shows_each_token_itself_and_the_text_whole(bpe_run):
    root, _, tok = bpe_run
    client = app_over(root)
    assert client.get("/api/runs/bpe").json()["tokenizer_kind"] == "bpe"
    listed = client.get("/api/runs").json()["runs"][0]
    assert listed["tokenizer_kind"] == "bpe" and listed["bits_per_char"] == 1.25  # what train.py logged
    assert listed["chat"] is False and client.get("/api/runs/bpe").json()["chat"] is False  # no stoi: no markers
    got = events(client.post("/api/generate", json=dict(run="bpe", prompt="🎶 Лиса", max_tokens=12,
                                                        seed=5)).iter_lines())
    prompt = got[0]["tokens"]
    assert [t["id"] for t in prompt] == tok.encode("🎶 Лиса")
    assert [t["label"] for t in prompt] == [token_label(tok, t["id"]) for t in prompt]
    new = [e["id"] for e in got if e["type"] == "token"]
    assert all(e["text"] == tok.decode([e["id"]]) for e in got if e["type"] == "token")
    whole = tok.decode(new)  # the text as sample.py prints it: a character cut at the very end is held back
    assert got[-1]["text"] == whole.removesuffix("\ufffd") or got[-1]["text"] == whole


# ----------------------------------------------------------------------------- a chat run


CHAT_TOK = CharTokenizer(CHARS + list(MARKERS.values()))  # a chat run's vocabulary: the text's, and the markers


@pytest.fixture(scope="module")
def chat_client(tmp_path_factory):
    """The explorer over a chat run (random weights, a vocabulary with the chat markers) and a plain one."""
    root = tmp_path_factory.mktemp("chat_runs")
    fake_run(root / "chat", 5, tok=CHAT_TOK)
    fake_run(root / "plain", 6)
    return app_over(root)


def ending_after(monkeypatch, n):
    """The explorer's sampler, writing the model's own tokens n times and then <|end|>: an answer of n tokens,
    whatever the random weights would write."""
    from gptkit.explorer import answers

    real, end = answers.decode_steps, CHAT_TOK.stoi[MARKERS["end"]]

    def steps(*args, **kwargs):
        for i, (column, logits, shaped) in enumerate(real(*args, **kwargs)):
            yield (torch.full_like(column, end) if i == n else column), logits, shaped
    monkeypatch.setattr(answers, "decode_steps", steps)


def no_marker_characters(answer):
    return not set(json.dumps(answer, ensure_ascii=False)) & set(MARKERS.values())


def test_a_chat_run_says_so_in_its_summary(chat_client):
    runs = {r["name"]: r for r in chat_client.get("/api/runs").json()["runs"]}
    assert runs["chat"]["chat"] is True and runs["plain"]["chat"] is False
    assert chat_client.get("/api/runs/chat").json()["chat"] is True
    assert chat_client.get("/api/runs/plain").json()["chat"] is False


def test_a_question_streams_its_answer_in_the_template_up_to_the_end_marker_and_why_each_token(chat_client,
                                                                                              monkeypatch):
    ending_after(monkeypatch, 4)
    body = dict(run="chat", prompt="abc def", chat=True, max_tokens=50, temperature=0)
    got = events(chat_client.post("/api/generate", json=body).iter_lines())
    prompt = [t["id"] for t in got[0]["tokens"]]
    assert prompt == CHAT_TOK.encode(prompt_text("abc def"))  # <|user|>, the question, <|assistant|>: chat.py's
    assert [t["label"] for t in got[0]["tokens"]] == ["<|user|>", *"abc␣def", "<|assistant|>"]
    assert got[0]["tokens"][0]["text"] == "<|user|>"
    tokens = [e for e in got if e["type"] == "token"]
    assert len(tokens) == 4 and got[-1]["type"] == "done" and got[-1]["reason"] == "end"  # <|end|> itself unsent
    assert got[-1]["text"] == "".join(t["text"] for t in tokens) and no_marker_characters(got)
    # why this token, on the answer as on any written text: the model's candidates from the tokens before it
    ids = prompt + [t["id"] for t in tokens]
    for i, t in enumerate(tokens):
        why = chat_client.post("/api/position", json=dict(run="chat", ids=ids, position=len(prompt) + i,
                                                          temperature=0)).json()
        assert why["token"]["id"] == t["id"] and why["why"]["raw"][0]["id"] == t["id"]  # greedy: the likeliest
        assert why["why"]["raw"][0]["p"] == pytest.approx(t["p"], abs=1e-4) and no_marker_characters(why)
    labels = chat_client.post("/api/attention_map", json=dict(run="chat", ids=ids, layer=0, head=0)).json()["labels"]
    assert labels[0] == "<|user|>" and labels[len(prompt) - 1] == "<|assistant|>"


def test_a_chat_runs_text_is_typed_with_the_markers_names(chat_client):
    """Read and written (not asked: a question is taken as it is), a chat run's text takes the markers by name."""
    text = "<|user|>abc<|assistant|>d"
    ids = CHAT_TOK.encode(MARKERS["user"] + "abc" + MARKERS["assistant"] + "d")
    read = chat_client.post("/api/read", json=dict(run="chat", text=text)).json()
    assert [t["label"] for t in read["tokens"]] == ["<|user|>", "a", "b", "c", "<|assistant|>", "d"]
    got = events(chat_client.post("/api/generate", json=dict(run="chat", prompt=text, max_tokens=2)).iter_lines())
    assert [t["id"] for t in got[0]["tokens"]] == ids


def test_a_chat_runs_stop_string_is_typed_with_the_markers_names(chat_client, monkeypatch):
    """Written as text (not asked), a chat run's stop string takes a marker by its name, as sample.py's --stop does:
    <|end|> stops where the model writes the end marker."""
    ending_after(monkeypatch, 3)
    body = dict(run="chat", prompt="abc", max_tokens=20, temperature=0, stop="<|end|>")
    got = events(chat_client.post("/api/generate", json=body).iter_lines())
    tokens = [e for e in got if e["type"] == "token"]
    assert got[-1] == {"type": "done", "reason": "stop", "text": "".join(t["text"] for t in tokens[:3])}


def test_an_answer_not_ended_stops_at_max_tokens_and_names_any_marker_it_writes(chat_client):
    body = dict(run="chat", prompt="ROMEO", chat=True, max_tokens=60, temperature=2.0, top_k=0, seed=4)
    got = events(chat_client.post("/api/generate", json=body).iter_lines())
    tokens = [e for e in got if e["type"] == "token"]
    assert got[-1]["reason"] in ("end", "max_tokens") and no_marker_characters(got)
    assert len(tokens) == 60 if got[-1]["reason"] == "max_tokens" else len(tokens) < 60
    assert got[-1]["text"] == "".join(t["text"] for t in tokens)
    assert "<|assistant|>" in got[-1]["text"]  # these random weights write a marker mid-answer: by its name


@pytest.mark.parametrize("body,status,message", [
    (dict(run="plain", prompt="abc", chat=True), 400, "not a chat run"),
    (dict(run="chat", prompt="xyz", chat=True), 400, "outside the training vocabulary: 'x'"),
    (dict(run="chat", prompt="a\ue002b", chat=True), 400, "the chat markers use"),
    (dict(run="chat", prompt="abc", chat="yes"), 422, "chat"),
])
def test_a_question_a_chat_run_cannot_take_is_one_line(chat_client, body, status, message):
    r = chat_client.post("/api/generate", json=body)
    assert r.status_code == status and message in r.json()["error"] and "\n" not in r.json()["error"], r.text


# ----------------------------------------------------------------------------- bad values, failures, paths


GUARDED = {"x-content-type-options": "nosniff", "x-frame-options": "DENY",
           "content-security-policy": "frame-ancestors 'none'"}
HUGE = "<huge>"  # stands for a JSON number of 5,000 digits, more than Python reads as an int


def as_json(body):
    """body as JSON text, each HUGE a number of 5,000 digits (json.dumps cannot write one)."""
    return json.dumps(body).replace(f'"{HUGE}"', "9" * 5000).replace(f'"-{HUGE}"', "-" + "9" * 5000)


def refused_in_a_line(r, where):
    """r is a refusal as the page reads it, {"error": one short line}, with the guard's headers."""
    assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}, (where, r.status_code, r.text[:300])
    assert "\n" not in r.json()["error"] and len(r.json()["error"]) < 300, (where, r.text[:300])
    assert {k: r.headers.get(k) for k in GUARDED} == GUARDED, where


# what a page may send in place of any field: numbers past every range, of thousands of digits, of the wrong
# kind, nested lists, very long names, names with NUL or a lone surrogate, and parts of thousands of digits
BAD_VALUES = [HUGE, f"-{HUGE}", 10 ** 30, -1, 1.5, True, "x", None, [[1]], {"a": 1}, "a" * 300, "a\0b", "\ud800",
              ["L" + "9" * 5000 + "H0"], ["MLP" + "9" * 5000], ["L" + "9" * 40 + "H0"], ["x" * 10_000], ["L0H0\0"],
              [None], [True]]
BODIES = {"/api/generate": dict(run="scaled", prompt="a", max_tokens=2), "/api/read": dict(run="scaled", text="abc"),
          "/api/position": dict(run="scaled", ids=[0, 1], position=1),
          "/api/attention_map": dict(run="scaled", ids=[0, 1], layer=0, head=0),
          "/api/scores": dict(run="scaled", ids=[0, 1], position=1, layer=0, head=0),
          "/api/token_features": dict(run="scaled", hook=HOOK, ids=[0, 1], position=1),
          "/api/feature": dict(run="scaled", hook=HOOK, feature=1, text="abc")}


@pytest.mark.parametrize("path", list(BODIES))
def test_every_field_of_every_request_fuzzed_is_answered_never_a_500(client, lab, path):
    """Each field of each request given each of BAD_VALUES (and inside a list, for the lists): never a 500, a
    refusal one line with the guard's headers, no path of this machine. A part named with thousands of digits was
    a 500 from Python's int(), without those headers."""
    from gptkit.explorer.answers import GenerateRequest, MapRequest, PositionRequest, ReadRequest
    from gptkit.explorer.experiment_answers import ScoresRequest
    from gptkit.explorer.feature_answers import FeatureRequest, TokenFeaturesRequest

    fields = set(dict(zip(BODIES, (GenerateRequest, ReadRequest, PositionRequest, MapRequest, ScoresRequest,
                                   TokenFeaturesRequest, FeatureRequest)))[path].model_fields)
    assert set(BODIES[path]) <= fields and "off" in fields
    for field in sorted(fields):
        for value in BAD_VALUES + [[value] for value in BAD_VALUES[:8]] * (field in ("ids", "off")):
            r = client.post(path, content=as_json(dict(BODIES[path], **{field: value})),
                            headers={"content-type": "application/json"})
            if r.status_code != 200:  # some are good values for some fields (a text of 300 a's)
                refused_in_a_line(r, (path, field, str(value)[:20]))
            assert str(lab[0].parent) not in r.text, (path, field)
    for off in (["L" + "9" * 5000 + "H0"], ["MLP" + "9" * 60], ["L0H" + "1" * 40]):
        r = client.post(path, json=dict(BODIES[path], off=off))
        refused_in_a_line(r, off[0][:10])
        assert "out of range" in r.json()["error"] or "at most 64 characters" in r.json()["error"], r.text


@pytest.mark.parametrize("name", ["a" * 300, "a" * 5000, "%00", "a%00b", "%ED%A0%80", "%FF", "..", "9" * 5000],
                         ids=["300 bytes", "5000 bytes", "NUL", "a NUL b", "a lone surrogate", "not UTF-8", "..",
                              "5000 digits"])
def test_every_run_address_fuzzed_is_a_refusal_in_one_line(client, lab, name):
    """A run name too long for any folder was answered with the server's path from the file system's error."""
    for suffix in ("", "/metrics", "/heads", f"/sae/{HOOK}", "/timeline"):
        r = client.get(f"/api/runs/{name}{suffix}")
        refused_in_a_line(r, suffix)
        assert r.status_code == 404 and str(lab[0].parent) not in r.text, r.text


@pytest.mark.parametrize("method,path,body,patched", [
    ("GET", "/api/runs/scaled/metrics", None, "run_metrics"),
    ("POST", "/api/read", dict(run="scaled", text="abc"), "read_text"),
    ("POST", "/api/generate", dict(run="scaled", prompt="a"), "encode"),
])
def test_a_failure_inside_the_explorer_is_a_500_line_with_the_guards_headers(lab, monkeypatch, caplog, method, path,
                                                                              body, patched):
    """A bug (here an exception put into the app) is a 500 the page reads as one line, with the guard's headers,
    holding none of the exception's words (a path of this machine); its traceback goes to the console."""
    import gptkit.explorer.app as explorer_app

    def failing(*args):
        raise OSError(errno.EIO, "Input/output error", str(lab[0] / "scaled" / "best.pt"))

    monkeypatch.setattr(explorer_app, patched, failing)
    client = app_over(lab[0])
    r = client.request(method, path, json=body)
    assert r.status_code == 500 and set(r.json()) == {"error"} and "\n" not in r.json()["error"], r.text
    assert "failed to answer this request" in r.json()["error"] and str(lab[0]) not in r.text
    assert {k: r.headers.get(k) for k in GUARDED} == GUARDED
    assert "Input/output error" in caplog.text and "Traceback" in caplog.text
    assert client.get("/api/runs/scaled").status_code == 200  # and the rest still answer


def test_no_answer_holds_a_path_of_this_machine(lab, tmp_path):
    """Where the runs are is named from the folder the explorer serves (its name; damaged/best.pt), never from
    this machine's root: the page may be reached from elsewhere, and a path names users and folders."""
    root = copies(lab, tmp_path / "runs", "good", "deep")
    with_records(root / "deep", "[" * DEEP + "]" * DEEP)
    (root / "damaged").mkdir()
    (root / "damaged" / "best.pt").write_bytes(b"not a checkpoint")
    app = app_over(root)
    listed = app.get("/api/runs").json()
    assert listed["root"] == "runs"
    runs = {r["name"]: r for r in listed["runs"]}
    assert runs["damaged"]["error"].startswith("damaged/best.pt is damaged or not a checkpoint")
    assert runs["deep"]["metrics_error"].startswith("deep/metrics.jsonl has a line nested too deeply")
    answers = [app.get("/api/runs"), app.get("/api/runs/damaged"), app.get("/api/runs/deep/metrics"),
               app.get("/api/lab"), app.get(run_url("a" * 300)), app.get("/api/runs/deep/timeline"),
               app.post("/api/read", json=dict(run="a" * 300, text="abc")),
               app.post("/api/read", json=dict(run="damaged", text="abc")), app.get("/api/runs/damaged/heads")]
    for r in answers:
        assert str(tmp_path) not in r.text and r.status_code in (200, 404, 409), (r.url, r.text)
    assert app.get("/api/runs/damaged").json()["error"].startswith("run 'damaged' cannot be opened: damaged/best.pt")


# ----------------------------------------------------------------------------- over training: timeline, snapshots


TIMED = ["--dataset=tiny_bpe", *MODEL, "--max_iters=30", "--eval_interval=10", "--eval_iters=2", "--log_interval=10"]
FIELDS = ("iter", "val_loss", "icl", "loss_by_position", "heads")


@pytest.fixture(scope="module")
def timed(tmp_path_factory, bpe_data, lab):
    """Runs trained in this process (each in a fraction of a second) on conftest's BPE corpus, each keeping its
    timeline: 'timed' (2 layers, 3 snapshots), 'no_snapshots' (the same run without its snapshots) and 'bigram' (no
    attention); and 'old', a run written as runs were before they kept a timeline (the lab's 'scaled')."""
    import train

    root = tmp_path_factory.mktemp("timed") / "runs"
    for name, shape in (("timed", ["--n_layer=2", "--snapshots=3"]), ("bigram", ["--n_layer=0"])):
        train.main([f"--data_dir={bpe_data[0]}", f"--out_dir={root / name}", *TIMED, *shape])
    shutil.copytree(root / "timed", root / "no_snapshots", ignore=shutil.ignore_patterns("snapshots"))
    shutil.copytree(lab[0] / "scaled", root / "old", ignore=shutil.ignore_patterns("sae"))
    return root


def test_the_timeline_is_the_runs_records_and_their_phase_change(timed):
    """Each record is timeline_of(read_metrics(out))'s, the phase change phase_change's, the steps those the run
    keeps snapshots of, and the run's own checkpoint its best.pt at the last step."""
    from gptkit.interp.experiments import KINDS
    from gptkit.interp.timeline import phase_change, timeline_of

    got = strict_json(app_over(timed).get("/api/runs/timed/timeline"))
    want = timeline_of(read_metrics(timed / "timed"))
    assert got["records"] == [{k: t[k] for k in FIELDS} for t in want]
    assert [t["iter"] for t in got["records"]] == [0, 1, 2, 4, 8, 10, 20, 30]
    assert got["phase"] == phase_change(want) and got["phase"]["layer"] is not None
    assert got["snapshots"] == RunDir(timed / "timed").kept_snapshots() and len(got["snapshots"]) == 3
    assert got["kinds"] == list(KINDS) and got["own"] == {"file": "best.pt", "iter": 30} and got["note"] is None


def test_every_answer_at_a_snapshot_is_the_python_apis_on_that_snapshot(timed):
    """Why this token, every head's attention, the lens, one head's map, read a text, writing and the heads' labels
    at "checkpoint": "iter:N" are open_run(out, checkpoint="iter:N")'s numbers, not the run's own."""
    from gptkit.explorer.experiment_answers import heads_report
    from gptkit.interp.experiments import open_run
    from gptkit.interp.hooks import surprise_bits
    from gptkit.run.checkpoint import load_checkpoint
    from gptkit.sampling.decoding import decode_steps

    app, step = app_over(timed), RunDir(timed / "timed").kept_snapshots()[1]
    run, at = open_run(timed / "timed", checkpoint=f"iter:{step}"), dict(run="timed", checkpoint=f"iter:{step}")
    ids, pos, V = run.tok.encode(TEXT * 2)[:16], 9, run.tok.vocab_size
    got = app.post("/api/position", json=dict(at, ids=ids, position=pos, k=20)).json()
    idx = torch.tensor([ids])
    with torch.no_grad():
        logits = run.model(idx, idx)[0][0]
    probs, maps = torch.softmax(logits[pos - 1], -1), attention_maps(run.model, idx)
    raw = got["why"]["raw"]
    assert [c["p"] for c in raw] == pytest.approx([probs[c["id"]].item() for c in raw], abs=1e-6)
    assert [c["p"] for c in raw] == pytest.approx(probs[:V].topk(20).values.tolist(), abs=1e-6)
    assert [c["p"] for c in got["lens"][-1]["top"]] == \
        pytest.approx(torch.softmax(logits[pos], -1).topk(5).values.tolist(), abs=1e-6)
    for layer, m in enumerate(maps):
        assert torch.tensor(got["attention"]["rows"][layer]) == pytest.approx(m[0, :, pos], abs=1e-6)
    assert got["why"] != app.post("/api/position", json=dict(run="timed", ids=ids, position=pos, k=20)).json()["why"]
    head_map = app.post("/api/attention_map", json=dict(at, ids=ids, layer=1, head=1)).json()
    assert torch.tensor(head_map["weights"]) == pytest.approx(maps[1][0, 1], abs=1e-6)
    read = app.post("/api/read", json=dict(at, text=TEXT[:12])).json()
    tokens = torch.tensor([run.tok.encode(TEXT[:12])])
    assert 2 < tokens.size(1) <= 16 and [t["id"] for t in read["tokens"]] == tokens[0].tolist()  # one window
    bits = surprise_bits(run.model, tokens[:, :-1], tokens[:, 1:])[0]
    assert [t["surprise_bits"] for t in read["tokens"][1:]] == pytest.approx(bits.tolist(), abs=1e-5)
    body = dict(at, prompt="ROMEO:", max_tokens=12, seed=3, temperature=1.0, top_k=0)
    streamed = [e["id"] for e in events(app.post("/api/generate", json=body).iter_lines()) if e["type"] == "token"]
    steps = decode_steps(run.model, torch.tensor([run.tok.encode("ROMEO:")]), 12, temperature=1.0,
                         generator=torch.Generator().manual_seed(3), vocab_size=V)
    assert streamed == [s[0].item() for s in steps]
    labels = app.get("/api/runs/timed/heads", params={"checkpoint": f"iter:{step}"}).json()
    assert labels == heads_report(run.model, run.tok, lambda: load_checkpoint(RunDir(run.out_dir).snapshot(step)))
    assert app.post("/api/position", json=dict(at, ids=ids, position=pos, checkpoint="best")).json() == \
        app.post("/api/position", json=dict(run="timed", ids=ids, position=pos)).json()  # best.pt: its own


CHECKPOINT_ASKED = {"/api/position": dict(ids=[1, 2], position=1), "/api/read": dict(text="First"),
                    "/api/attention_map": dict(ids=[1, 2], layer=0, head=0),
                    "/api/scores": dict(ids=[1, 2], position=1, layer=0, head=0),
                    "/api/generate": dict(prompt="F", max_tokens=2)}


@pytest.mark.parametrize("checkpoint,status,message", [
    ("iter:7", 404, "run 'timed' keeps no snapshot of step 7; it keeps {kept}"),
    ("iter:", 422, "checkpoint must be 'best' (best.pt), 'latest' (latest.pt) or 'iter:N'"),
    ("iter:-1", 422, "got 'iter:-1'"), ("iter:1e3", 422, "got 'iter:1e3'"), ("best.pt", 422, "got 'best.pt'"),
    ("../timed/best.pt", 422, "got '../timed/best.pt'"), ("iter:" + "9" * 13, 422, "got 'iter:9999999999999"),
    ("", 422, "got ''"), (12, 422, "checkpoint: Input should be a valid string"),
    ("iter:\u0665\u0660", 422, "got 'iter:\u0665\u0660'"),  # another script's digits, which int() reads as 50
])
def test_a_step_not_kept_or_a_malformed_checkpoint_is_one_line(timed, checkpoint, status, message):
    """Every request that takes a checkpoint refuses one the run does not keep with the steps it does, and a
    malformed one with the forms it takes: one line, the guard's headers, no path of this machine."""
    app, kept = app_over(timed), RunDir(timed / "timed").kept_snapshots()
    line = message.format(kept=", ".join(f"iter:{i}" for i in kept))
    for path, body in CHECKPOINT_ASKED.items():
        r = app.post(path, json=dict(body, run="timed", checkpoint=checkpoint))
        refused_in_a_line(r, path)
        assert r.status_code == status and line in r.json()["error"] and str(timed.parent) not in r.text, r.text
    if isinstance(checkpoint, str):  # the labels' GET takes it in its query
        r = app.get("/api/runs/timed/heads", params={"checkpoint": checkpoint})
        refused_in_a_line(r, "heads")
        assert r.status_code == (404 if status == 404 else 400) and line in r.json()["error"], r.text


def test_a_run_without_snapshots_a_timeline_or_attention_answers_what_it_has(timed):
    """Without snapshots: the curves, and the line on what --snapshots adds; a snapshot asked for is a 404 line.
    Trained before runs kept a timeline: no records, and a note. Without attention: the in-context learning score,
    no heads, and no phase change: no induction head can form."""
    from gptkit.interp.timeline import timeline_of

    app = app_over(timed)
    bare = strict_json(app.get("/api/runs/no_snapshots/timeline"))
    assert bare["snapshots"] == [] and bare["records"] == strict_json(app.get("/api/runs/timed/timeline"))["records"]
    assert "python train.py ... --snapshots=5 keeps the weights of 5 steps" in bare["note"]
    r = app.post("/api/position", json=dict(run="no_snapshots", ids=[1, 2], position=1, checkpoint="iter:1"))
    refused_in_a_line(r, "no snapshots")
    assert r.status_code == 404 and "run 'no_snapshots' keeps no snapshots (python train.py" in r.json()["error"]
    old = strict_json(app.get("/api/runs/old/timeline"))
    assert old["records"] == [] and old["phase"] is None and old["snapshots"] == []
    assert old["note"].startswith("this run has no timeline: it was trained before runs recorded one")
    bigram, want = strict_json(app.get("/api/runs/bigram/timeline")), timeline_of(read_metrics(timed / "bigram"))
    assert bigram["records"] == [{k: t.get(k) for k in FIELDS} for t in want] and len(want) > 3
    assert all(t["heads"] is None for t in bigram["records"])
    assert bigram["phase"]["induction_iter"] is bigram["phase"]["icl_iter"] is bigram["phase"]["layer"] is None
    assert bigram["phase"]["note"] == ("no head scores in this timeline (a model without attention, or attention "
                                       "that passes no hook point the records read): no induction head to follow, no "
                                       "phase change to locate")


def test_a_timeline_record_hand_edited_is_left_out_and_said_so(timed, tmp_path):
    """A timeline record whose numbers are NaN or text, whose head grid is not the run's shape, or whose step is not
    a number is left out, as analyze.py timeline leaves it out (read_metrics): the rest as written, the phase change
    from them, and the note naming each line left out and why, without a path of this machine."""
    from gptkit.interp.timeline import phase_change, timeline_of

    root = tmp_path / "runs"
    shutil.copytree(timed / "timed", root / "run")
    whole = timeline_of(read_metrics(root / "run"))
    lines = len((root / "run" / "metrics.jsonl").read_text().splitlines())
    with_records(root / "run", '{"kind": "timeline", "iter": 40, "icl": NaN, "loss_by_position": [1.0, "x"], '
                               '"heads": {"induction": [[0.5]]}}', {"kind": "timeline", "iter": "soon", "icl": 1.0})
    got = strict_json(app_over(root).get("/api/runs/run/timeline"))
    assert got["records"] == [{k: t[k] for k in FIELDS} for t in whole]
    assert got["phase"] == phase_change(whole)
    assert got["note"] == (f"left out 2 timeline records of run/metrics.jsonl that train.py would not write (line "
                           f"{lines + 1}: icl is nan, not a finite number; line {lines + 2}: iter is not an iteration "
                           "number)")


def test_a_snapshot_loads_once_is_kept_with_its_run_and_is_read_again_when_replaced(timed, tmp_path, monkeypatch):
    """The shelf keeps each snapshot asked for with its run's model (at most SNAPSHOTS_AT_ONCE, the least recently
    asked for dropped first) and reads it again when its file is replaced; one thinned away is a 404 naming the
    steps left, a damaged one a 409 line, and so is another step's copied in (it would pass for this step's
    weights); a feature switched off at a snapshot is refused: its SAE reads the run's own weights."""
    import gptkit.explorer.shelf as shelf_module

    root = tmp_path / "runs"
    shutil.copytree(timed / "timed", root / "run")
    shelf, run = Shelf(root, "cpu", "float32"), RunDir(root / "run")
    early, later = (f"iter:{i}" for i in run.kept_snapshots()[:2])
    at = shelf.get("run", later)
    assert shelf.get("run", later) is at and at.at == later and at.model is not shelf.get("run").model
    assert shelf.get("run", "best") is shelf.get("run") and list(shelf.get("run").snapshots) == [later]
    shutil.copy(run.snapshot(int(early[5:])), root / "copy.pt")
    rewrite(root / "copy.pt", ("iter_num",), int(later[5:]))
    os.replace(root / "copy.pt", run.snapshot(int(later[5:])))  # the step's file replaced: the weights of `early`
    again, weights = shelf.get("run", later), shelf.get("run", early).model.state_dict()
    assert again is not at and all(torch.equal(w, weights[k]) for k, w in again.model.state_dict().items())
    monkeypatch.setattr(shelf_module, "SNAPSHOTS_AT_ONCE", 1)
    shelf.get("run", later)
    assert list(shelf.get("run").snapshots) == [later]
    app = TestClient(make_app(shelf), base_url="http://127.0.0.1:8000")
    r = app.post("/api/read", json=dict(run="run", text="First", checkpoint=later, off=[f"{HOOK} F1"]))
    refused_in_a_line(r, "feature")
    assert r.status_code == 400 and r.json()["error"].startswith("a feature belongs to the run's own checkpoint")
    run.snapshot(int(later[5:])).unlink()  # thinned by a run still training
    r = app.post("/api/position", json=dict(run="run", ids=[1, 2], position=1, checkpoint=later))
    refused_in_a_line(r, "thinned")
    assert r.status_code == 404 and r.json()["error"].endswith(
        "it keeps " + ", ".join(f"iter:{i}" for i in run.kept_snapshots()))
    shutil.copy(run.snapshot(int(early[5:])), run.snapshot(int(later[5:])))
    r = app.post("/api/position", json=dict(run="run", ids=[1, 2], position=1, checkpoint=later))
    refused_in_a_line(r, "another step's")
    assert r.status_code == 409 and re.search(rf"run/snapshots/iter_{later[5:]}\.pt holds iteration {early[5:]} of "
                                              rf"a .+ model, not this run's step {later[5:]} \(", r.json()["error"])
    run.snapshot(0).write_bytes(b"not a checkpoint")
    r = app.post("/api/position", json=dict(run="run", ids=[1, 2], position=1, checkpoint="iter:0"))
    refused_in_a_line(r, "damaged")
    assert r.status_code == 409 and "run/snapshots/iter_0.pt" in r.json()["error"] and str(tmp_path) not in r.text
    # the run opens: it is that step's weights that do not
    assert r.json()["error"].startswith("run 'run' at iter:0 cannot be opened: ") and \
        r.json()["error"].endswith("; the run's own weights still open")
    assert app.post("/api/position", json=dict(run="run", ids=[1, 2], position=1)).status_code == 200


# ----------------------------------------------------------------------------- a port another program has


def test_a_default_port_another_program_has_moves_to_the_next_free_one_and_says_so():
    """As Jupyter: the default port taken, the next free one, and the line says plainly which is the explorer's;
    a port the user gave is that port or one line, never a page that is another program's."""
    import explore
    from gptkit.base.errors import UserError

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cfg = explore.ExploreConfig(port=port)
        sock, note = explore.open_socket(cfg, given={})
        with sock:
            got = sock.getsockname()[1]
        assert port < got < port + explore.PORT_TRIES
        assert note == f"port {port} is another program's, not this explorer's: this explorer is at port {got}"
        with pytest.raises(UserError) as refused:
            explore.open_socket(cfg, given={"port": port})
        assert str(refused.value) == (f"cannot listen on 127.0.0.1:{port}: port {port} is another program's, so what "
                                      f"answers at http://127.0.0.1:{port}/ is not this explorer; pick another with "
                                      "--port (--port=0 takes any free one)")
    free_port = explore.open_socket(explore.ExploreConfig(port=0), given={})
    free_port[0].close()
    assert free_port[1] is None


def test_a_port_another_program_has_on_the_other_loopback_or_every_port_tried_taken(monkeypatch):
    """A browser asked for localhost may try ::1 first: a port another program has there is taken too. With every
    port tried taken, one line says so."""
    import explore
    from gptkit.base.errors import UserError

    try:
        taken = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    with taken:
        port = taken.getsockname()[1]
        sock, note = explore.open_socket(explore.ExploreConfig(port=port), given={})
        with sock:
            assert sock.getsockname()[1] != port and f"port {port} is another program's" in note
    monkeypatch.setattr(explore, "PORT_TRIES", 2)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        try:
            next_one = socket.create_server(("127.0.0.1", port + 1))
        except OSError:  # another program has it already
            next_one = socket.socket()
        with next_one, pytest.raises(UserError) as refused:
            explore.open_socket(explore.ExploreConfig(port=port), given={})
    assert str(refused.value) == (f"cannot listen on 127.0.0.1: ports {port} to {port + 1} are all other programs'; "
                                  "pick a free one with --port (--port=0 takes any)")


@pytest.mark.slow
def test_explore_py_refuses_a_port_it_was_given_that_another_program_has_in_one_line(lab):
    from conftest import assert_one_error_line

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = run_script("explore.py", lab[0] / "scaled", f"--port={port}", "--device=cpu")
    line = assert_one_error_line(proc.stderr)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    assert f"port {port} is another program's, so what answers at http://127.0.0.1:{port}/ is not this " \
        "explorer" in line
