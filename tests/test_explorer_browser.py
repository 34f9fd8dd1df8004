"""The explorer in a real browser: headless Chromium (Debian's chromium and chromium-driver, which .ci/run installs)
opens the page served by explore.py from a model trained in the test, types a prompt, waits for the streamed
tokens, clicks one, and checks that the candidate bars, every head's attention (named L0H0, L0H1, ...: layers and
heads count from 0) and the logit lens appear with the model's numbers, and that one head's map has its axes and
labels, and that the Over training slider moves the grid to the weights of a step the run kept. The page is ES
modules, so the test also checks that they are served as JavaScript and load without an error. Screenshots go to the test's folder, and also to $EXPLORER_SCREENSHOTS when it is set
(the README's come from `EXPLORER_RUN=out EXPLORER_SCREENSHOTS=assets python -m pytest tests/test_explorer_browser.py`)."""

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import pytest

from conftest import REPO

CHROMIUM, DRIVER = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="no chromium and chromedriver on this machine: "
                                "apt-get install chromium chromium-driver (.ci/run does)")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def waiting(browser):
    """A minute's wait for the page, each condition tried again where the page redrew an element between finding
    it and reading it (the attention grid redraws as a head is switched off)."""
    return WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,))


@pytest.fixture
def served(trained_run, tmp_path):
    """explore.py serving the session's trained run (or $EXPLORER_RUN): (address, run name)."""
    run = Path(os.environ.get("EXPLORER_RUN") or trained_run[0])
    url, proc = serve(run)
    yield url, run.resolve().name
    proc.terminate()
    proc.wait(30)


def serve(folder, edit=None):
    """explore.py serving folder on a free port: (its address, the process). edit: Python run before it, as the
    learner's edit to model.py."""
    script = ["-c", f"{edit}\nimport runpy\nrunpy.run_path({str(REPO / 'explore.py')!r}, run_name='__main__')"] \
        if edit else [str(REPO / "explore.py")]
    proc = subprocess.Popen([sys.executable, *script, str(folder), "--port=0", "--device=cpu", "--dtype=float32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    line = proc.stdout.readline()
    assert line.startswith("explorer: http://"), proc.stderr.read() if proc.poll() is not None else line
    return line.split()[1].rstrip("/"), proc


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # to see a module that fails to load
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def shoot(driver, tmp_path, name, element=None):
    """The page as it shows (or only element), into the test's folder and $EXPLORER_SCREENSHOTS."""
    path = tmp_path / name
    if element is not None:
        element.screenshot(str(path))
    else:
        driver.save_screenshot(str(path))
    if os.environ.get("EXPLORER_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["EXPLORER_SCREENSHOTS"]) / name)
    assert path.stat().st_size > 10_000, path  # a picture, not a blank page


def fixed(x, digits):
    """x as JavaScript's toFixed writes it: its exact binary value rounded half away from zero (Python's format
    rounds half to even: 12.5 is '12' there and '13' on the page)."""
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP))


def percent(p):
    """The page's way of writing a probability or a share (format.js, fmtP)."""
    pct = p * 100
    return "0%" if p == 0 else f"{fixed(pct, 0)}%" if pct >= 10 else f"{fixed(pct, 1)}%" if pct >= 1 else \
        f"{fixed(pct, 2)}%" if pct >= 0.01 else "<0.01%"


def test_a_learner_writes_clicks_a_token_and_sees_the_models_numbers(served, browser, tmp_path):
    url, run = served
    wait = waiting(browser)
    browser.get(url + "/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#runs .run.selected[data-name="{run}"]'))
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("ROMEO:")
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("60")
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#output .chip.gen")) >= 60)
    chips = browser.find_elements(By.CSS_SELECTOR, "#output .chip")
    assert "".join(c.text for c in chips[:6]) == "ROMEO:"
    clicked = int(chips[20].get_attribute("data-index"))
    chips[20].click()
    for panel in ("why", "attention", "lens"):
        wait.until(lambda d, p=panel: d.find_element(By.ID, p).get_attribute("data-ready") == "1")

    ids = [int(c.get_attribute("data-id")) for c in chips]
    info = httpx.get(f"{url}/api/runs/{run}").json()
    start = max(0, clicked + 1 - info["block_size"])
    window = ids[start:start + info["block_size"]]
    want = httpx.post(f"{url}/api/position", json=dict(run=run, ids=window, position=clicked - start,
                                                        temperature=0.8, top_k=200, top_p=1.0, k=10)).json()
    bars = browser.find_elements(By.CSS_SELECTOR, "#why .bar.raw")
    assert [int(b.get_attribute("data-id")) for b in bars] == [c["id"] for c in want["why"]["raw"]]
    assert [b.find_element(By.CSS_SELECTOR, ".val").text for b in bars] == [percent(c["p"]) for c in want["why"]["raw"]]
    cells = browser.find_elements(By.CSS_SELECTOR, "#attention .head-cell")
    assert len(cells) == info["n_layer"] * info["n_head"] == want["attention"]["layers"] * want["attention"]["heads"]
    check_attention_grid(browser, cells, want["attention"]["rows"], want["token"]["label"], info)
    rows = browser.find_elements(By.CSS_SELECTOR, "#lens .lens-row")
    assert len(rows) == info["n_layer"] + 1 == len(want["lens"])
    assert [r.find_element(By.CSS_SELECTOR, ".lens-name").text for r in rows[:2]] == ["embeddings", "after layer 0"]
    shoot(browser, tmp_path, "explorer_write.png")

    cells[-1].click()  # the last layer's last head: its whole query x key map
    wait.until(lambda d: d.find_element(By.ID, "attention-map").get_attribute("data-ready"))
    last = f"L{info['n_layer'] - 1}H{info['n_head'] - 1}"
    assert browser.find_element(By.ID, "map-title").text.startswith(last + " (layer")
    assert browser.find_element(By.ID, "map-query-axis").text.startswith("query")
    assert browser.find_element(By.ID, "map-key-axis").text.startswith("key")
    assert browser.find_element(By.ID, "attention-map").get_attribute("data-ticks") in ("tokens", "every 5", "every 10")
    browser.execute_script("document.getElementById('numbering').scrollIntoView()")  # the note, the grid, the map
    shoot(browser, tmp_path, "explorer_attention.png")
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def check_attention_grid(browser, cells, rows, pinned, info):
    """Heads named from L0H0, no cell a scroll box, every strip ending on (or around) the pinned token, and each
    cell naming the token its head weighs most, with the model's weight."""
    names = [c.find_element(By.CSS_SELECTOR, ".head-name").text for c in cells]
    assert names == [f"L{l}H{h}" for l in range(info["n_layer"]) for h in range(info["n_head"])]
    heads = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#attention .att-head-label")]
    assert heads == [f"H{h}" for h in range(info["n_head"])]
    scrollers = browser.execute_script("""
        return [...document.querySelectorAll('#attention .head-cell, #attention .head-cell *')].filter((e) => {
          const s = getComputedStyle(e);
          return ['auto', 'scroll'].includes(s.overflowY) || ['auto', 'scroll'].includes(s.overflowX)
            || e.scrollHeight > e.clientHeight + 1;
        }).length;""")
    assert scrollers == 0
    for cell in cells:
        layer, head = int(cell.get_attribute("data-layer")), int(cell.get_attribute("data-head"))
        assert [q.text for q in cell.find_elements(By.CSS_SELECTOR, ".strip .tok.query")] == [pinned]
        weights = rows[layer][head]
        best = max(range(len(weights)), key=weights.__getitem__)
        assert percent(weights[best]) in cell.find_element(By.CSS_SELECTOR, ".head-max").text


def test_the_page_modules_are_served_as_javascript_and_nothing_outside_their_folder(served):
    """A browser runs a module only when it comes as JavaScript; the folder's parent (gptkit/) stays out of reach."""
    url, _ = served
    static = REPO / "gptkit" / "explorer" / "static"
    modules = sorted(p.name for p in static.glob("*.js"))
    assert "explorer.js" in modules and len(modules) > 5
    for name in modules:
        r = httpx.get(f"{url}/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].split(";")[0] in ("text/javascript",
                                                                                     "application/javascript")
    assert (REPO / "gptkit" / "explorer" / "app.py").is_file()
    assert httpx.get(f"{url}/static/%2e%2e/app.py").status_code == 404  # sent as typed: httpx keeps %2e%2e


def test_bad_runs_are_one_line_each_and_the_list_follows_the_folder(trained_run, browser, tmp_path):
    """Runs whose metrics hold NaN and text, whose checkpoint is a link out of its folder, or whose folder name is
    not UTF-8 are one line each; the runs after them are listed, and one named with a newline opens. A run trained
    while the page is open appears when the page comes back into view."""
    root = tmp_path / "runs"
    for name in ("good", "nan", "link", "a\nnewline", os.fsdecode(b"caf\xe9"), "zz_after"):
        shutil.copytree(trained_run[0], root / name)
    with open(root / "nan" / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "final", "iter": 30, "val_loss": NaN, "elapsed_s": "x"}\n')
    (root / "link" / "best.pt").unlink()
    (root / "link" / "best.pt").symlink_to(trained_run[0] / "best.pt")
    url, proc = serve(root)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#runs .run.selected"))
        buttons = {b.get_attribute("data-name"): b for b in browser.find_elements(By.CSS_SELECTOR, "#runs .run")}
        assert set(buttons) == {"good", "nan", "link", "a\nnewline", "caf\ufffd", "zz_after"}
        assert {n for n, b in buttons.items() if "broken" in b.get_attribute("class")} == {"link", "caf\ufffd"}
        buttons["a\nnewline"].click()
        wait.until(lambda d: "context" in d.find_element(By.ID, "run-info").text)
        shutil.copytree(trained_run[0], root / "later")
        back_on_the_page(browser)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#runs .run[data-name="later"]'))
        assert browser.find_element(By.CSS_SELECTOR, "#runs .run.selected").get_attribute("data-name") == "a\nnewline"
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_picked_run_whose_best_pt_now_holds_another_step_is_loaded_again(run, browser, tmp_path):
    """Back on the page after the picked run's best.pt was replaced by one of another step (a resume's new best),
    the run is loaded again: its timeline and curves are the new checkpoint's, and a line says why."""
    from gptkit.run.checkpoint import load_checkpoint

    steps = {f: load_checkpoint(run / f)["iter_num"] for f in ("best.pt", "latest.prev.pt")}
    assert steps["best.pt"] != steps["latest.prev.pt"], steps
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "timeline-card").get_attribute("data-ready"))
        assert browser.find_element(By.ID, "timeline-card").get_attribute("data-step") == str(steps["best.pt"])
        shutil.copy(run / "latest.prev.pt", run / "best.new")
        os.replace(run / "best.new", run / "best.pt")
        back_on_the_page(browser)
        wait.until(lambda d: d.find_element(By.ID, "timeline-card").get_attribute("data-step")
                   == str(steps["latest.prev.pt"]))
        assert browser.find_element(By.ID, "runs-status").text == (
            f"run's best.pt now holds step {steps['latest.prev.pt']} (it held {steps['best.pt']}): loaded again")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_new_text_empties_the_two_heads_maps_with_the_other_panels(served, browser):
    """The two heads' maps are of the pointed token's window: written again, the text they were of is gone, and so
    are they, as why this token, where it looked and the lens are."""
    url, run = served
    wait = waiting(browser)
    browser.get(url + "/")
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded"))
    chips = write(browser, wait, "ROMEO:", 12)
    browser.execute_script("arguments[0].click()", chips[10])
    wait.until(lambda d: d.find_element(By.ID, "pair-map-a").get_attribute("data-ready") == "1")
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: "done" in d.find_element(By.ID, "status").text)
    for side in ("a", "b"):
        assert browser.find_element(By.ID, f"pair-map-{side}").get_attribute("data-ready") is None
        assert browser.find_element(By.ID, f"pair-title-{side}").text == ""
    assert browser.find_element(By.ID, "pair-status").text == "Hover or click a token in the text above."


def test_after_a_reload_with_other_weights_a_token_of_the_same_text_is_asked_for_again(run, browser):
    """The panels keep the answers of tokens pointed at, so that going back to one is instant; once the run is
    loaded again with other weights (its best.pt replaced), the same prompt's tokens show the new model's numbers,
    not those kept of the old one."""
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded"))
        block = httpx.get(f"{url}/api/runs/{run.name}").json()["block_size"]
        prompt = ("ROMEO:" * block)[:block + 8]  # a token past the context reads a window of the prompt alone

        def candidates():
            browser.find_element(By.ID, "prompt").clear()
            browser.find_element(By.ID, "prompt").send_keys(prompt)
            browser.find_element(By.ID, "max-tokens").clear()
            browser.find_element(By.ID, "max-tokens").send_keys("1")
            browser.find_element(By.ID, "generate").click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#output .chip.gen"))
            browser.execute_script("arguments[0].click()",
                                   browser.find_elements(By.CSS_SELECTOR, "#output .chip")[block + 4])
            wait.until(lambda d: d.find_element(By.ID, "why").get_attribute("data-ready") == "1")
            return [b.find_element(By.CSS_SELECTOR, ".val").text for b in
                    browser.find_elements(By.CSS_SELECTOR, "#why .bar.raw")]

        before = candidates()
        shutil.copy(run / "latest.prev.pt", run / "best.new")
        os.replace(run / "best.new", run / "best.pt")
        back_on_the_page(browser)
        wait.until(lambda d: "loaded again" in d.find_element(By.ID, "runs-status").text)
        ids = token_ids(url, run.name, prompt)[5:block + 5]
        want = httpx.post(f"{url}/api/position", json=dict(run=run.name, ids=ids, position=block - 1, temperature=0.8,
                                                            top_k=200, top_p=1.0, k=10)).json()
        after = candidates()
        assert after == [percent(c["p"]) for c in want["why"]["raw"]] and after != before
    finally:
        proc.terminate()
        proc.wait(30)


def token_ids(url, run, text):
    """text's token ids, as the run's tokenizer cuts it (the API's reading of it)."""
    return [t["id"] for t in httpx.post(f"{url}/api/read", json=dict(run=run, text=text)).json()["tokens"]]


def test_a_picked_run_that_logged_more_meanwhile_redraws_its_curves_and_keeps_the_text(run, browser):
    """Back on the page after the picked run logged more (training on, its best.pt the same), the loss curves reach
    the iteration the list shows, and the written text stays: the model is the same."""
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "curves").get_attribute("data-last"))
        last = int(browser.find_element(By.ID, "curves").get_attribute("data-last"))
        chips = write(browser, wait, "ROMEO:", 5)
        with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "train", "iter": last + 10, "loss": 2.0, "elapsed_s": 99.0}) + "\n")
        back_on_the_page(browser)
        wait.until(lambda d: d.find_element(By.ID, "curves").get_attribute("data-last") == str(last + 10))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#output .chip")) == len(chips)
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_picked_run_whose_folder_was_removed_is_said_gone_in_one_line(run, browser, tmp_path):
    """Back on the page after the picked run's folder was removed, the list no longer holds it and the picked run's
    card says so in one line, rather than showing a run that is no longer there; its folder back, it loads again."""
    root = tmp_path / "runs"
    for name in ("a", "b"):
        shutil.copytree(run, root / name)
    url, proc = serve(root)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: "context" in d.find_element(By.ID, "run-info").text)
        shutil.rmtree(root / "a")
        back_on_the_page(browser)
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '#runs .run[data-name="a"]'))
        assert browser.find_element(By.ID, "run-status").text == (
            "run a is no longer in runs (its folder was removed or renamed): pick another run")
        shutil.copytree(run, root / "a")  # back again: loaded as it is now
        back_on_the_page(browser)
        wait.until(lambda d: "context" in d.find_element(By.ID, "run-info").text
                   and d.find_element(By.ID, "run-status").text == "")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_generating_after_the_server_stopped_says_it_cannot_be_reached(trained_run, browser):
    """Generate with explore.py stopped is the line every other panel gives, not the browser's 'Failed to fetch'."""
    url, proc = serve(trained_run[0])
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded"))
    finally:
        proc.terminate()
        proc.wait(30)
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text
               == "cannot reach the explorer server (is explore.py still running?)")
    assert browser.find_element(By.ID, "generate").text == "Generate"


def test_read_a_texts_totals_count_one_character_and_one_token_in_the_singular(served, browser):
    """A one-character text is '1 character, 1 token', and a two-character one scores '1 character' after its
    first token."""
    url, run = served
    wait = waiting(browser)
    browser.get(url + "/")
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded"))
    for text, counts in (("R", "over the 0 characters after the first token (the text: 1 character, 1 token)"),
                         ("RO", "over the 1 character after the first token (the text: 2 characters, 2 tokens)")):
        browser.find_element(By.ID, "read-text").clear()
        browser.find_element(By.ID, "read-text").send_keys(text)
        browser.find_element(By.ID, "read-go").click()
        wait.until(lambda d, t=text: len(d.find_elements(By.CSS_SELECTOR, "#read-output .read-chip")) == len(t))
        assert browser.find_element(By.CSS_SELECTOR, "#read-output .totals").text.endswith(counts)


@pytest.mark.slow
def test_a_head_switched_off_is_named_in_a_banner_and_the_panels_follow(served, browser, tmp_path):
    """Clicking a head's switch names it in the banner; the attention grid marks it off and the pointed token's
    candidates are the API's with that head off; switching all back on hides the banner."""
    url, run = served
    wait = waiting(browser)
    browser.get(url + "/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#switches .switch"))
    browser.find_element(By.ID, "prompt").send_keys("ROMEO:")
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("30")
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#output .chip.gen")) >= 30)
    chips = browser.find_elements(By.CSS_SELECTOR, "#output .chip")
    chips[20].click()
    wait.until(lambda d: d.find_element(By.ID, "why").get_attribute("data-ready") == "1")
    assert not browser.find_element(By.ID, "off-banner").is_displayed()
    browser.find_element(By.CSS_SELECTOR, '#switches .switch[data-name="L0H1"]').click()
    wait.until(lambda d: d.find_element(By.ID, "off-banner").is_displayed())
    assert browser.find_element(By.ID, "off-names").text == "L0H1"
    wait.until(lambda d: "off" in d.find_element(By.CSS_SELECTOR, '#attention .head-cell[data-head="1"]')
               .get_attribute("class") and d.find_element(By.ID, "why").get_attribute("data-ready") == "1")
    ids = [int(c.get_attribute("data-id")) for c in chips]
    start = max(0, 21 - httpx.get(f"{url}/api/runs/{run}").json()["block_size"])  # the page's window, as above
    want = httpx.post(f"{url}/api/position", json=dict(run=run, ids=ids[start:21], position=20 - start,
                                                        temperature=0.8, top_k=200, top_p=1.0, k=10,
                                                        off=["L0H1"])).json()
    bars = browser.find_elements(By.CSS_SELECTOR, "#why .bar.raw")
    assert [b.find_element(By.CSS_SELECTOR, ".val").text for b in bars] == [percent(c["p"]) for c in want["why"]["raw"]]
    shoot(browser, tmp_path, "explorer_head_off.png")
    browser.find_element(By.ID, "all-on").click()
    wait.until(lambda d: not d.find_element(By.ID, "off-banner").is_displayed())
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.slow
def test_the_features_panel_matches_the_api(trained_run, browser, tmp_path):
    """The page matches the API, on a run with an SAE trained by analyze.py features: the features active at a token
    clicked in the written text and in a read text are run.features(hook).encode's, each with its frequency and
    top contexts from the SAE's table; where a feature fires in a pasted text is its value at every token; and
    with that feature switched off, read a text's surprise is run.ablated(features=...)'s, token by token."""
    import torch

    from conftest import make_text
    from gptkit.interp.experiments import open_run
    from gptkit.interp.hooks import surprise_bits
    from test_features import small_sae

    out, hook = small_sae(trained_run, tmp_path)[0], "blocks.1.hook_resid_post"
    run = open_run(out)
    f = run.features(hook)
    url, proc = serve(out)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "sae-metrics").get_attribute("data-ready"))
        assert [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#sae-hook option")] == [hook]
        assert [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#sae-frequent .feature-pick")] == \
            [f"F{r['index']} · {percent(r['frequency'])}" for r in f.table[:16]]
        chips = write(browser, wait, "ROMEO:", 30)
        chips[20].click()
        wait.until(lambda d: d.find_element(By.ID, "token-features").get_attribute("data-index") == "20")
        block = run.config.block_size
        ids = [int(c.get_attribute("data-id")) for c in chips][max(0, 21 - block):21]
        index = check_token_features(browser, run, f, ids, len(ids) - 1)

        text = make_text()[:50]  # longer than the context: read in two windows
        line = f'#token-features .feature-line[data-index="{index}"]'
        browser.find_element(By.CSS_SELECTOR, f"{line} .feature-pick").click()
        browser.find_element(By.ID, "feature-text").send_keys(text)
        browser.find_element(By.ID, "feature-go").click()
        wait.until(lambda d: d.find_element(By.ID, "feature-output").get_attribute("data-ready"))
        check_where_it_fires(browser, run, f, index, run.tok.encode(text))

        browser.find_element(By.CSS_SELECTOR, f"{line} .feature-off").click()
        wait.until(lambda d: d.find_element(By.ID, "off-names").text == f"{hook} F{index}")
        browser.find_element(By.ID, "read-text").send_keys(text)
        browser.find_element(By.ID, "read-go").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#read-output .read-row.diff .read-chip"))
        read = browser.find_elements(By.CSS_SELECTOR, "#read-output .read-row:first-child .read-chip")
        read_ids = run.tok.encode(text)
        idx = torch.tensor([read_ids])
        with run.ablated(features={hook: [index]}):
            bits = torch.cat([surprise_bits(run.model, idx[:, s:s + block], idx[:, s + 1:s + 1 + block])[0]
                              for s in range(0, len(read_ids) - 1, block)])
        assert [float(c.get_attribute("data-bits")) for c in read[1:]] == pytest.approx(bits.tolist(), abs=1e-5)
        read[5].click()  # a token of the read text: its features, the one switched off marked so
        wait.until(lambda d: d.find_element(By.ID, "token-features").get_attribute("data-where") == "read text"
                   and d.find_element(By.ID, "token-features").get_attribute("data-index") == "5")
        check_token_features(browser, run, f, read_ids[:block], 5)
        for button in browser.find_elements(By.CSS_SELECTOR, f'.feature-off[data-name="{hook} F{index}"]'):
            assert button.get_attribute("aria-pressed") == "true"
        card = browser.find_element(By.ID, "features-card")
        browser.execute_script("arguments[0].scrollIntoView()", card)
        shoot(browser, tmp_path, "explorer_features.png", card)
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def write(browser, wait, prompt, tokens):
    """Generate from prompt: the written text's chips."""
    browser.find_element(By.ID, "prompt").send_keys(prompt)
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys(str(tokens))
    browser.find_element(By.ID, "generate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#output .chip.gen")) >= tokens)
    return browser.find_elements(By.CSS_SELECTOR, "#output .chip")


def check_token_features(browser, run, f, ids, position):
    """The features the panel lists for token position of the window ids are the nonzero values of f.encode at
    f.hook, largest first, each shown with its value, its frequency and its top contexts' values from f.table:
    the index of the first."""
    import torch

    _, cache = run.run_with_cache(torch.tensor([ids]), f.hook)
    values = f.encode(cache[f.hook])[0, position]
    firing = [i for i in values.argsort(descending=True).tolist() if values[i] > 0]
    rows = {row["index"]: row for row in f.table}
    lines = browser.find_elements(By.CSS_SELECTOR, "#token-features .feature-line")
    assert [int(line.get_attribute("data-index")) for line in lines] == firing != []
    for line, i in zip(lines, firing):
        shown = float(line.get_attribute("data-value"))
        assert shown == pytest.approx(values[i].item(), abs=1e-5)
        assert line.find_element(By.CSS_SELECTOR, ".feature-value").text == fixed(shown, 3)
        assert line.find_element(By.CSS_SELECTOR, ".feature-freq").text == \
            f"fires on {percent(rows[i]['frequency'])} of tokens"
        assert [v.text for v in line.find_elements(By.CSS_SELECTOR, ".context-value")] == \
            [fixed(c[3], 3) for c in rows[i]["contexts"]]
    return firing[0]


def check_where_it_fires(browser, run, f, index, ids):
    """The pasted text's chips are its tokens, each with feature index's value as f.encode gives it (in windows
    of the context), and the feature's row shows its frequency and top contexts from f.table."""
    import torch

    T = run.config.block_size
    want = []
    for start in range(0, len(ids), T):
        _, cache = run.run_with_cache(torch.tensor([ids[start:start + T]]), f.hook)
        want += f.encode(cache[f.hook])[0, :, index].tolist()
    chips = browser.find_elements(By.CSS_SELECTOR, "#feature-output .feature-chip")
    assert [int(c.get_attribute("data-id")) for c in chips] == ids
    shown = [float(c.get_attribute("data-value")) for c in chips]
    assert shown == pytest.approx(want, abs=1e-5) and max(want) > 0
    assert all(c.get_attribute("title").endswith(f"F{index} {fixed(v, 3)}") for c, v in zip(chips, shown))
    row = next(r for r in f.table if r["index"] == index)
    box = browser.find_element(By.ID, "feature-row")
    assert box.find_element(By.CSS_SELECTOR, ".feature-freq").text == f"fires on {percent(row['frequency'])} of tokens"
    assert [v.text for v in box.find_elements(By.CSS_SELECTOR, ".context-value")] == \
        [fixed(c[3], 3) for c in row["contexts"]]


@pytest.fixture
def timed_run(tmp_path, data_dir):
    """A run trained in this process keeping 3 snapshots, at a learning rate at which its heads change between
    them."""
    import train
    from conftest import train_args

    out = tmp_path / "timed"
    train.main(train_args(data_dir, out, "--n_layer=2", "--max_iters=60", "--eval_interval=20", "--eval_iters=2",
                          "--learning_rate=1e-2", "--warmup_iters=5", "--snapshots=3"))
    return out


def test_the_over_training_slider_moves_the_attention_grid_to_a_snapshots_weights(timed_run, browser, tmp_path):
    """The Over training card draws a chart per head, each naming its top kind at the slider's step as the
    timeline's numbers have it. With a token pinned, the slider moved a kept step back (the arrow key, as a learner
    drags it) shows the attention grid at that snapshot: every cell's top weight is the API's at "checkpoint":
    "iter:N", and the banner names the step; back to the run's own weights, the grid is the API's own again."""
    url, proc = serve(timed_run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "timeline-card").get_attribute("data-ready"))
        timeline, info = httpx.get(f"{url}/api/runs/timed/timeline").json(), httpx.get(f"{url}/api/runs/timed").json()
        check_multiples(browser, timeline, int(browser.find_element(By.ID, "timeline-card").get_attribute("data-step")))
        assert not browser.find_element(By.ID, "step-banner").is_displayed()
        chips = write(browser, wait, "ROMEO:", 24)
        chips[20].click()
        wait.until(lambda d: d.find_element(By.ID, "attention").get_attribute("data-ready") == "1")
        ids = [int(c.get_attribute("data-id")) for c in chips][max(0, 21 - info["block_size"]):21]
        body = dict(run="timed", ids=ids, position=len(ids) - 1, temperature=0.8, top_k=200, top_p=1.0, k=10)
        own = httpx.post(f"{url}/api/position", json=body).json()
        check_attention_grid(browser, browser.find_elements(By.CSS_SELECTOR, "#attention .head-cell"),
                             own["attention"]["rows"], own["token"]["label"], info)

        slider = browser.find_element(By.ID, "step-range")
        slider.send_keys(Keys.ARROW_LEFT)
        step = timeline["snapshots"][int(slider.get_attribute("value"))]
        wait.until(lambda d: d.find_element(By.ID, "attention").get_attribute("data-checkpoint") == f"iter:{step}"
                   and d.find_element(By.ID, "attention").get_attribute("data-ready") == "1")
        then = httpx.post(f"{url}/api/position", json=dict(body, checkpoint=f"iter:{step}")).json()
        assert then["attention"]["rows"] != own["attention"]["rows"]
        check_attention_grid(browser, browser.find_elements(By.CSS_SELECTOR, "#attention .head-cell"),
                             then["attention"]["rows"], then["token"]["label"], info)
        assert browser.find_element(By.ID, "step-banner").is_displayed()
        assert browser.find_element(By.ID, "step-now").text == f"{step:,}"
        check_multiples(browser, timeline, step)
        browser.execute_script("document.getElementById('timeline-card').scrollIntoView()")
        shoot(browser, tmp_path, "explorer_over_training.png")

        browser.find_element(By.ID, "step-own-mini").click()
        wait.until(lambda d: d.find_element(By.ID, "attention").get_attribute("data-checkpoint") == ""
                   and d.find_element(By.ID, "attention").get_attribute("data-ready") == "1")
        check_attention_grid(browser, browser.find_elements(By.CSS_SELECTOR, "#attention .head-cell"),
                             own["attention"]["rows"], own["token"]["label"], info)
        assert not browser.find_element(By.ID, "step-banner").is_displayed()
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def check_multiples(browser, timeline, step):
    """A chart per head, each naming the kind its head scores highest at the record of the slider's step."""
    record = [r for r in timeline["records"] if r["iter"] <= step][-1]
    figures = browser.find_elements(By.CSS_SELECTOR, "#head-multiples .head-multiple")
    assert len(figures) == sum(len(row) for row in record["heads"]["induction"])
    for fig in figures:
        layer, head = int(fig.get_attribute("data-layer")), int(fig.get_attribute("data-head"))
        scores = {kind: record["heads"][kind][layer][head] for kind in timeline["kinds"]}
        assert fig.get_attribute("data-top") == max(scores, key=scores.get), (layer, head, scores)


# a text for the BPE run: Greek and Cyrillic letters, some of which the run's BPE cuts between tokens
BPE_READ = "Лиса нашла серебряную монету.\nΟ γέρος βασιλιάς είδε τη βροχή.\nThe crow found a coin."


@pytest.mark.slow
def test_a_bpe_runs_tokens_are_boxes_with_their_ids_and_read_a_text_says_bits_per_character(bpe_data, browser,
                                                                                             tmp_path):
    """On a run cut into a trained BPE, each token of the prompt and of a text read is a chip with its id under it
    (and in its title), a token that holds part of a character shows that character's bytes (⟨f0⟩); read a text
    gives bits per character beside nats per token, the API's numbers. $EXPLORER_BPE_RUN serves a real run
    instead (the docs' picture: `EXPLORER_BPE_RUN=out-mixed EXPLORER_SCREENSHOTS=assets`)."""
    from test_explorer import fake_run

    run = Path(os.environ.get("EXPLORER_BPE_RUN") or tmp_path / "runs" / "bpe")
    if not os.environ.get("EXPLORER_BPE_RUN"):
        fake_run(run, tok=bpe_data[2])
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: "Loaded" in d.find_element(By.ID, "status").text)
        browser.find_element(By.ID, "prompt").send_keys("Лиса 🎶")
        browser.find_element(By.ID, "max-tokens").clear()
        browser.find_element(By.ID, "max-tokens").send_keys("5")
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#output .chip.gen")) >= 5)
        check_chips(browser.find_elements(By.CSS_SELECTOR, "#output .chip.prompt"))
        browser.find_element(By.ID, "read-text").send_keys(BPE_READ)
        browser.find_element(By.ID, "read-go").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#read-output .read-chip"))
        want = httpx.post(f"{url}/api/read", json=dict(run=run.name, text=BPE_READ)).json()
        chips = browser.find_elements(By.CSS_SELECTOR, "#read-output .read-chip")
        assert [int(c.get_attribute("data-id")) for c in chips] == [t["id"] for t in want["tokens"]]
        shown = check_chips(chips)
        assert [s for s, t in zip(shown, want["tokens"]) if "\ufffd" in t["text"]] == \
            [t["label"] for t in want["tokens"] if "\ufffd" in t["text"]] != []
        assert browser.find_element(By.CSS_SELECTOR, "#read-output .bits-per-char").text == \
            f"{want['bits_per_char']:.3f} bits per character"
        assert browser.find_element(By.CSS_SELECTOR, "#read-output .nats-per-token").text == \
            f"{want['loss']:.3f} nats per token"
        card = browser.find_element(By.ID, "read-card")
        browser.execute_script("arguments[0].scrollIntoView()", card)
        shoot(browser, tmp_path, "explorer_bpe_tokens.png", card)
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def check_chips(chips):
    """Each chip a box with its token's id under it and in its title: the text each shows."""
    shown = []
    for c in chips:
        assert "with-id" in c.get_attribute("class")
        assert c.find_element(By.CSS_SELECTOR, ".tok-id").text == c.get_attribute("data-id")
        assert f"(token id {c.get_attribute('data-id')})" in c.get_attribute("title")
        shown.append(c.find_element(By.CSS_SELECTOR, ".tok-text").get_attribute("textContent"))
    return shown


def test_a_chat_run_is_asked_a_question_and_its_answers_tokens_say_why(browser, tmp_path):
    """On a chat run the Write panel takes a question: the prompt's chips are the chat template, its markers by
    their names (never their private-use characters), the answer streams as text does, and a token of it opens
    why this token with the API's candidates; a question the vocabulary cannot spell is the status line's error."""
    from test_explorer import CHAT_TOK, fake_run

    run = tmp_path / "runs" / "chat"
    fake_run(run, tok=CHAT_TOK)
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: "a chat run" in d.find_element(By.ID, "status").text)
        assert browser.find_element(By.ID, "prompt-name").text == "Question"
        assert browser.find_element(By.ID, "generate").text == "Ask"
        chips = write(browser, wait, "abc", 8)
        assert [c.text for c in chips[:5]] == ["<|user|>", "a", "b", "c", "<|assistant|>"]
        assert not set(browser.find_element(By.ID, "output").get_attribute("textContent")) & set("\ue000\ue001\ue002")
        chips[6].click()
        wait.until(lambda d: d.find_element(By.ID, "why").get_attribute("data-ready") == "1")
        ids = [int(c.get_attribute("data-id")) for c in chips]
        want = httpx.post(f"{url}/api/position", json=dict(run="chat", ids=ids, position=6, temperature=0.8,
                                                            top_k=200, top_p=1.0, k=10)).json()
        bars = browser.find_elements(By.CSS_SELECTOR, "#why .bar.raw")
        assert [int(b.get_attribute("data-id")) for b in bars] == [c["id"] for c in want["why"]["raw"]]
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        browser.find_element(By.ID, "prompt").clear()
        browser.find_element(By.ID, "prompt").send_keys("xyz")
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda d: "outside the training vocabulary" in d.find_element(By.ID, "status").text)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_a_run_trained_before_model_py_changed_says_what_changed_on_its_card(browser, tmp_path):
    """model.py edited since the run trained: the console said so, the page did not. Now the picked run's card says
    it in the console's words, naming the pieces that changed; the run it shows next, unedited, says nothing."""
    from gptkit.machine.stand_ins import model_code
    from test_checkpoints import rewrite
    from test_explorer import fake_run

    root = tmp_path / "runs"
    for name in ("edited", "same"):
        fake_run(root / name)
        rewrite(root / name / "best.pt", ["model_code"], dict(model_code()))
    rewrite(root / "edited" / "best.pt", ["model_code", "relu_squared"], "0" * 16)
    url, proc = serve(root)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded edited"))
        note = browser.find_element(By.ID, "run-code-note")
        assert note.is_displayed() and note.text == (
            "model.py has changed since edited/best.pt was trained (relu_squared): the model runs the code as it is "
            "now, which may not be what it learned with")
        browser.find_element(By.CSS_SELECTOR, '#runs .run[data-name="same"]').click()
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded same"))
        assert not browser.find_element(By.ID, "run-code-note").is_displayed()
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def retrained(folder, seed, val_loss):
    """A run in folder as test_explorer's fake_run writes it, of step 20, whose timeline's record at step 20 has
    val_loss: each seed another model of the same step, as a run trained again into its folder is."""
    from test_explorer import fake_run

    fake_run(folder, seed)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    records.insert(-1, {"kind": "timeline", "iter": 20, "icl": -0.1, "loss_by_position": [3.0] * 8, "heads": None})
    for r in records:
        if r["kind"] == "eval" and r["iter"] == 20:
            r["val_loss"] = val_loss
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.mark.slow
def test_a_picked_run_trained_again_to_the_same_step_is_loaded_again(browser, tmp_path):
    """The picked run trained again into its folder (train.py --start_over=True, the same max_iters): its best.pt
    holds the same step, of another model. The page compared the runs list's settings and step, found them the same,
    and went on showing the old model's timeline. Now the list says which write of the file each checkpoint is,
    and the run is loaded again, its timeline the new run's, with a line saying why."""
    run = tmp_path / "runs" / "run"
    retrained(run, 0, 2.7)
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: "val loss 2.7000" in d.find_element(By.ID, "timeline-readout").text)
        retrained(tmp_path / "again", 1, 2.5)
        for name in ("metrics.jsonl", "best.pt"):
            os.replace(tmp_path / "again" / name, run / name)
        back_on_the_page(browser)
        wait.until(lambda d: "val loss 2.5000" in d.find_element(By.ID, "timeline-readout").text)
        assert browser.find_element(By.ID, "runs-status").text == (
            "run's best.pt was written again since it was loaded (it still holds step 20): loaded again")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def kept(run, step):
    """A snapshot of step `step` in run's snapshots/, as train.py --snapshots keeps one (its best.pt's weights)."""
    from gptkit.run.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(run / "best.pt")
    del ckpt["format_version"]
    (run / "snapshots").mkdir(exist_ok=True)
    save_checkpoint(dict(ckpt, iter_num=step), run / "snapshots" / f"iter_{step}.pt")


def logged(run, step):
    """The records a run still training logs at an evaluation of step `step` whose val loss is not its best (its
    best.pt stays): a train record, the evaluation and its timeline record."""
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        for r in ({"kind": "train", "iter": step, "loss": 2.0, "lr": 1e-3, "tokens": 100, "elapsed_s": 5.0},
                  {"kind": "eval", "iter": step, "train_loss": 2.0, "val_loss": 2.9, "elapsed_s": 5.0},
                  {"kind": "timeline", "iter": step, "icl": -0.2, "loss_by_position": [2.9] * 8, "heads": None}):
            f.write(json.dumps(r) + "\n")


def back_on_the_page(browser):
    """The learner comes back to the page, once: a focus that comes while the list from the one before is still on
    its way has the list asked for again when that one is in."""
    browser.execute_script("window.dispatchEvent(new Event('focus'))")


@pytest.mark.slow
def test_a_picked_run_that_logged_more_draws_its_timeline_again_at_the_snapshot_it_reads(browser, tmp_path):
    """The picked run trained on (its best.pt the same): the curves were drawn again, but the timeline was asked for
    only when a pick loaded the run, so its records and snapshots stayed those of then. Now it is drawn again with
    the curves; the slider stays at the snapshot the panels read while the run keeps it, and where the run no longer
    does, goes back to the run's own weights, saying so."""
    run = tmp_path / "runs" / "run"
    retrained(run, 0, 2.7)
    for step in (0, 10):
        kept(run, step)
    url, proc = serve(run)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "timeline-card").get_attribute("data-ready"))
        card, slider = browser.find_element(By.ID, "timeline-card"), browser.find_element(By.ID, "step-range")
        assert slider.get_attribute("max") == "1"
        slider.send_keys(Keys.ARROW_LEFT)  # to step 0's snapshot
        wait.until(lambda d: card.get_attribute("data-checkpoint") == "iter:0")
        # the heads' labels at step 0 read before the run thins that snapshot below: a read still on its way then
        # would find it gone
        wait.until(lambda d: " at step 0 on " in d.find_element(By.ID, "switches-status").text)
        logged(run, 30)
        kept(run, 30)
        back_on_the_page(browser)
        wait.until(lambda d: slider.get_attribute("max") == "2")
        assert card.get_attribute("data-checkpoint") == "iter:0" and slider.get_attribute("value") == "0"
        assert browser.find_element(By.ID, "step-banner").is_displayed()
        (run / "snapshots" / "iter_0.pt").unlink()  # thinned, as a run still training thins its snapshots
        logged(run, 40)
        back_on_the_page(browser)
        wait.until(lambda d: slider.get_attribute("max") == "1")
        assert card.get_attribute("data-checkpoint") == "" and card.get_attribute("data-step") == "20"
        assert browser.find_element(By.ID, "timeline-status").text == (
            "the run no longer keeps step 0: back to its own weights")
        assert not browser.find_element(By.ID, "step-banner").is_displayed()
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


# model.py's sdpa edited, as a learner would: the model runs it, a pass that watches the pattern does not
EDITED_SDPA = """import model
sdpa = model.SelfAttention.sdpa
def doubled(self, q, k, v):
    return 2 * sdpa(self, q, k, v)
model.SelfAttention.sdpa = doubled"""


@pytest.mark.slow
def test_an_edit_the_panels_watching_hooks_cannot_run_is_said_in_those_panels(browser, tmp_path):
    """model.py's sdpa edited: the attention the panels watching hooks show is written out in their own code, not
    the learner's, and the console said so, the page did not. Now each of those panels (the heads' labels, why this
    token, where it looked, the two heads, the lens, read a text) says it in the console's words."""
    from test_explorer import fake_run

    fake_run(tmp_path / "run")
    url, proc = serve(tmp_path / "run", EDITED_SDPA)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded run"))
        said = httpx.get(f"{url}/api/runs/run").json()["watch_note"]
        assert said.startswith("model.py's SelfAttention.sdpa is edited, but a pass that watches the attention")
        notes = {n.find_element(By.XPATH, "./ancestor::section").get_attribute("id"): n
                 for n in browser.find_elements(By.CSS_SELECTOR, ".watch-note")}
        assert set(notes) == {"switches-card", "why-card", "attention-card", "pair-card", "lens-card", "read-card"}
        assert all(n.is_displayed() and n.text == said for n in notes.values())
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        proc.terminate()
        proc.wait(30)


def hold_the_first(path):
    """A script for the page: its fetch holds its first answer from `path` after this runs until the test calls
    window.releaseHeld(), then sets window.heldDone once the page has had time to read and draw it, or refuse it;
    window.asked counts the requests for path."""
    return """
const fetched = window.fetch;
let release;
const gate = new Promise((resolve) => { release = resolve; });
Object.assign(window, { held: false, heldDone: false, asked: 0, releaseHeld: () => release() });
window.fetch = async (path, opts) => {
  if (path === '%s') window.asked += 1;
  const res = await fetched(path, opts);
  if (path === '%s' && !window.held) {
    window.held = true;
    await gate;
    setTimeout(() => { window.heldDone = true; }, 300);
  }
  return res;
};
""" % (path, path)


@contextmanager
def page_holding_first(browser, root, path):
    """explore.py serving root, a run 'a' made in it, the page loaded and its fetch holding its first answer from
    `path` from here on (hold_the_first): the page's wait; the server is stopped after."""
    from test_explorer import fake_run

    fake_run(root / "a")
    url, proc = serve(root)
    try:
        wait = waiting(browser)
        browser.get(url + "/")
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Loaded a"))
        browser.execute_script(hold_the_first(path))
        yield wait
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_coming_back_while_the_list_is_still_asked_for_asks_again_after_it(browser, tmp_path):
    """The learner back on the page while the list asked for at the last time was still on its way (a slow answer,
    two focus events close together): the page dropped the second, and a run trained in between stayed unseen until
    the next time. Now the list is asked for once more when the one in flight is in, not beside it, and the line the
    first wrote (the picked run loaded again) stays."""
    from test_explorer import fake_run

    root = tmp_path / "runs"
    with page_holding_first(browser, root, "/api/runs") as wait:
        fake_run(tmp_path / "again", seed=1)  # the picked run trained again into its folder
        os.replace(tmp_path / "again" / "best.pt", root / "a" / "best.pt")
        back_on_the_page(browser)
        wait.until(lambda d: d.execute_script("return window.held"))  # read before the run below was trained
        fake_run(root / "later")
        back_on_the_page(browser)
        back_on_the_page(browser)
        assert browser.execute_script("return window.asked") == 1  # not beside the one in flight
        browser.execute_script("window.releaseHeld()")
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, '#runs .run[data-name="later"]'))
        assert browser.execute_script("return window.asked") == 2
        assert browser.find_element(By.ID, "runs-status").text == (
            "a's best.pt was written again since it was loaded (it still holds step 20): loaded again")
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.slow
def test_an_earlier_lab_answer_that_comes_last_does_not_draw_over_the_folder_as_it_is(browser, tmp_path):
    """Two returns to the page close together ask for the lab twice; the first answer, slow, came after the second
    and drew the folder as it was before a rung was trained: the lab card went away again."""
    from test_explorer import fake_run

    root = tmp_path / "runs"
    with page_holding_first(browser, root, "/api/lab") as wait:
        back_on_the_page(browser)
        wait.until(lambda d: d.execute_script("return window.held"))  # read before the rung below was trained
        fake_run(root / "bigram")
        (root / "bigram" / "lab.json").write_text(json.dumps({"rung": "bigram"}), encoding="utf-8")
        back_on_the_page(browser)
        wait.until(lambda d: d.find_element(By.ID, "lab-card").is_displayed())
        browser.execute_script("window.releaseHeld()")
        wait.until(lambda d: d.execute_script("return window.heldDone"))
        assert browser.find_element(By.ID, "lab-card").is_displayed()
