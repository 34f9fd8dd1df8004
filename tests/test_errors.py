"""Bad input through the command lines: each is one `error:` line on stderr, exit status 1, no traceback.

The table runs in one module fixture, each script's cases in one process of their own (see DRIVER); each case
then checks its own result."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import MODEL, REPO, assert_one_error_line, make_text
from gptkit.corpus import PrepareConfig, prepare

PROMPT = "Zebra ~ 😀 ROMEO"

# id: (script, arguments, the message expected as stderr's one line, or its start followed by *;
# {w} is the work folder, {t} the session's trained run)
CASES = {
    "empty input": ("prepare", ["--input={w}/empty.txt"], "error: input {w}/empty.txt is empty"),
    "binary input": ("prepare", ["--input={w}/image.png"],
                     "error: {w}/image.png looks like a binary file (NUL byte at offset 8), not UTF-8 text"),
    "latin-1 input": ("prepare", ["--input={w}/latin1.txt"],
                      "error: {w}/latin1.txt is not UTF-8 text: byte 0xe9 at offset 3"),
    "missing input": ("prepare", ["--input={w}/nope.txt"], "error: input file not found: {w}/nope.txt"),
    "uint16 too small": ("prepare", ["--input={w}/wide.txt", "--dtype=uint16"],
                         "error: the vocabulary has 66,000 tokens, more than uint16 holds (65,536); "
                         "use --dtype=uint32 or --dtype=auto"),
    "unknown dtype": ("prepare", ["--input={w}/input.txt", "--dtype=int8"],
                      "error: command line: dtype must be one of auto, uint16, uint32 (got 'int8')"),
    "prepare unknown key": ("prepare", ["--input={w}/input.txt", "--nme=x"],
                            "error: command line: unknown config key 'nme' (did you mean 'name'?)"),
    "prepare wrong type": ("prepare", ["--input={w}/input.txt", "--val_fraction=lots"],
                           "error: command line: val_fraction must be float, got 'lots'"),
    "missing dataset": ("train", ["--dataset=nope"],
                        "error: dataset folder {w}/data/nope not found; create it with "
                        "`python data/prepare.py --input=YOUR.txt --name=nope --data_dir={w}/data`"),
    "split too short": ("train", ["--dataset=short"],
                        "error: {w}/data/short/train.bin has 10 tokens, fewer than block_size + 1 = 17; "
                        "use a smaller --block_size or more text"),
    "meta dtype too small": ("train", ["--dataset=widemeta"],
                             "error: {w}/data/widemeta/meta.json: a vocabulary of 70000 tokens does not fit uint16 "
                             "token files (at most 65,536); run data/prepare.py again"),
    "out_dir is a file": ("train", ["--out_dir={w}/input.txt"],
                          "error: cannot use {w}/input.txt as out_dir (a file of that name is in the way)"),
    "unknown key": ("train", ["--n_layers=2"],
                    "error: command line: unknown config key 'n_layers' (did you mean 'n_layer'?)"),
    "wrong type": ("train", ["--batch_size=four"], "error: command line: batch_size must be int, got 'four'"),
    "n_embd vs n_head": ("train", ["--n_embd=33"], "error: n_embd (33) must be divisible by n_head (2)"),
    "choice typo": ("train", ["--pos_emb=rop"],
                    "error: command line: pos_emb must be one of learned, rope, none (got 'rop'; did you mean 'rope'?)"),
    "resume without checkpoint": ("train", ["--out_dir={w}/none", "--init_from=resume"],
                                  "error: no checkpoint at {w}/none/ckpt.pt; train one first with "
                                  "`python train.py ...`"),
    "resume truncated": ("train", ["--out_dir={w}/truncated", "--init_from=resume"],
                         "error: {w}/truncated/ckpt.pt is truncated or not a checkpoint (PytorchStreamReader "
                         "failed reading zip archive: failed finding central directory)"),
    "resume version 999": ("train", ["--out_dir={w}/v999", "--init_from=resume"],
                           "error: {w}/v999/ckpt.pt has checkpoint format 999, this tool reads 1"),
    "resume incomplete": ("train", ["--out_dir={w}/nokeys", "--init_from=resume"],
                          "error: {w}/nokeys/ckpt.pt is incomplete: it lacks model_args, optimizer"),
    "resume larger block": ("train", ["--out_dir={t}", "--init_from=resume", "--block_size=64"],
                            "error: block_size 64 is larger than the checkpoint's 32"),
    "sample without checkpoint": ("sample", ["--out_dir={w}/none"],
                                  "error: no checkpoint at {w}/none/ckpt.pt; train one first with "
                                  "`python train.py ...`"),
    "sample truncated": ("sample", ["--out_dir={w}/truncated"],
                         "error: {w}/truncated/ckpt.pt is truncated or not a checkpoint (PytorchStreamReader "
                         "failed reading zip archive: failed finding central directory)"),
    "sample empty file": ("sample", ["--out_dir={w}/emptyfile"],
                          "error: {w}/emptyfile/ckpt.pt is truncated or not a checkpoint (EOFError)"),
    "sample text file": ("sample", ["--out_dir={w}/textfile"],
                         "error: {w}/textfile/ckpt.pt is truncated or not a checkpoint (*"),  # * any detail
    "sample version 999": ("sample", ["--out_dir={w}/v999"],
                           "error: {w}/v999/ckpt.pt has checkpoint format 999, this tool reads 1"),
    "sample incomplete": ("sample", ["--out_dir={w}/nokeys"], "error: {w}/nokeys/ckpt.pt is incomplete: it lacks model_args"),
    "sample unknown model setting": ("sample", ["--out_dir={w}/newer"],
                                     "error: {w}/newer/ckpt.pt was written with model settings this version cannot "
                                     "build (unknown model settings: flash_kernels)"),
    "prompt outside vocabulary": ("sample", ["--out_dir={t}", f"--start={PROMPT}"], None),  # see below
}


SCRIPTS = {"prepare": "data/prepare.py", "train": "train.py", "sample": "sample.py"}
BASE_ARGS = {
    "prepare": ["--name=x", "--data_dir={w}/prepared"],
    "train": ["--data_dir={w}/data", "--dataset=tiny", "--out_dir={w}/out", *MODEL, "--max_iters=2"],
    "sample": ["--device=cpu", "--max_new_tokens=5"],
}

# Runs one entry script the way `python SCRIPT ARGS...` does (its `if __name__ == "__main__"` block, sys.argv,
# stderr, exit status, and a traceback for anything uncaught), once per case, so that the table pays for
# importing torch once per script rather than once per case. Writes {case: {rc, stderr}} as JSON.
DRIVER = """
import contextlib, io, json, runpy, sys, traceback, warnings
sys.path.insert(0, REPO)
warnings.simplefilter("always")  # each case shows its own warnings, as a fresh process would
script, cases = sys.argv[1], json.loads(sys.stdin.read())
results = {}
for case, argv in cases.items():
    err = io.StringIO()
    sys.argv = [script, *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(script, run_name="__main__")
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            rc = 1
    results[case] = {"rc": rc, "stderr": err.getvalue()}
print(json.dumps(results))
"""


def run_table(w, t):
    """Every case, one driver process per script, the three side by side."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    driver = w / "driver.py"
    driver.write_text(f"REPO = {str(REPO)!r}\n" + DRIVER, encoding="utf-8")
    procs = {}
    for script, path in SCRIPTS.items():
        cases = {case: [a.format(w=w, t=t) for a in BASE_ARGS[script] + args]
                 for case, (s, args, _) in CASES.items() if s == script}
        procs[script] = subprocess.Popen([sys.executable, str(driver), str(REPO / path)], cwd=w, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, encoding="utf-8")
        procs[script].stdin.write(json.dumps(cases))
        procs[script].stdin.close()
    results = {}
    for script, proc in procs.items():
        out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=300) == 0 and err == "", f"{script}: driver failed\n{err}"
        results.update(json.loads(out))
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory, trained_run):
    """Build every bad input, then run the whole table."""
    w = tmp_path_factory.mktemp("errors")
    (w / "input.txt").write_text(make_text(), encoding="utf-8")
    (w / "empty.txt").write_bytes(b"")
    (w / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (w / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c <= 0xDFFF][:65999]  # + "\n"
    (w / "wide.txt").write_text("\n".join("".join(chars[i:i + 200]) for i in range(0, len(chars), 200)),
                                encoding="utf-8")
    assert len(set((w / "wide.txt").read_text(encoding="utf-8"))) == 66000

    (w / "short.txt").write_text("hello world\n", encoding="utf-8")
    for name, text in [("tiny", "input.txt"), ("short", "short.txt")]:
        prepare(PrepareConfig(input=str(w / text), name=name, data_dir=str(w / "data")))
    shutil.copytree(w / "data" / "tiny", w / "data" / "widemeta")
    meta = json.loads((w / "data" / "widemeta" / "meta.json").read_text(encoding="utf-8"))
    (w / "data" / "widemeta" / "meta.json").write_text(json.dumps(dict(meta, vocab_size=70000, dtype="uint16")))

    trained = trained_run[0]
    ckpt = torch.load(trained / "ckpt.pt", weights_only=True)
    for name, data in [("truncated", (trained / "ckpt.pt").read_bytes()[:3000]), ("emptyfile", b""),
                       ("textfile", b"this is not a checkpoint\n")]:
        (w / name).mkdir()
        (w / name / "ckpt.pt").write_bytes(data)
    (w / "v999").mkdir()
    torch.save(dict(ckpt, format_version=999), w / "v999" / "ckpt.pt")
    (w / "nokeys").mkdir()
    torch.save({k: v for k, v in ckpt.items() if k not in ("model_args", "optimizer")}, w / "nokeys" / "ckpt.pt")
    (w / "newer").mkdir()
    torch.save(dict(ckpt, model_args=dict(ckpt["model_args"], flash_kernels=True)), w / "newer" / "ckpt.pt")
    return w, run_table(w, trained), ckpt


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line(results, case):
    w, table, ckpt = results
    rc, stderr = table[case]["rc"], table[case]["stderr"]
    expected = CASES[case][2]
    if expected is None:  # the prompt: name every character the model has never seen
        missing = sorted(set(PROMPT) - set(ckpt["tokenizer"]["vocab"]))
        assert {"Z", "~", "😀"} <= set(missing)
        expected = ("error: the text has characters outside the training vocabulary: "
                    + ", ".join(repr(c) for c in missing))
    assert_one_error_line(stderr, expected.format(w=w))
    assert rc == 1
