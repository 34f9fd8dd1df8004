"""Prompt text from the command line (gptkit/sampling/prompts.py): escapes typed in a shell, and a file read as
it is; either UTF-8 text, or one line saying where it is not."""

import os

import pytest

from conftest import assert_one_error_line, run_here
from gptkit.base.errors import UserError
from gptkit.sampling.prompts import read_prompt, unescape


def test_unescape_of_command_line_text(tmp_path):
    assert unescape("\\n\\n") == "\n\n" and read_prompt("A\\tB\\\\n") == "A\tB\\n"
    assert unescape("caf\u00e9 \\x") == "caf\u00e9 \\x"  # other text and unknown escapes unchanged
    prompt = tmp_path / "new"
    prompt.write_text("a \\n stays two characters", encoding="utf-8")
    assert read_prompt(f"FILE:{prompt}") == "a \\n stays two characters"  # a file's text is taken as it is
    prompt.write_bytes("\ufeffROMEO:".encode("utf-8"))  # saved by a Windows editor: its byte-order mark first
    assert read_prompt(f"FILE:{prompt}") == "ROMEO:"
    with pytest.raises(UserError, match="could not read prompt file"):
        read_prompt(f"FILE:{tmp_path / 'nope.txt'}")


def test_a_prompt_that_is_not_utf8_is_one_line_naming_the_byte(tmp_path):
    """Bytes of an argument that are not UTF-8 reach Python as lone surrogates: a byte-level BPE would encode
    U+FFFD in their place, another text than the one given, and a char-level vocabulary would name a character
    nobody typed."""
    with pytest.raises(UserError) as e:
        read_prompt(os.fsdecode("caf\u00e9 au lait ".encode("utf-8") + "d\u00e9j\u00e0".encode("latin-1")))
    assert str(e.value) == "the prompt is not UTF-8 text: byte 0xe9 at offset 15; give UTF-8 text"
    with pytest.raises(UserError, match="^the text is not UTF-8 text: byte 0xff at offset 0; give UTF-8 text$"):
        unescape(os.fsdecode(b"\xff"))  # a --stop text, or a line typed at sample.py's prompt
    with pytest.raises(UserError, match=r"^the prompt is not UTF-8 text: a lone surrogate \(U\+D800\) at offset 1"):
        read_prompt("a\ud800")
    latin1 = tmp_path / "prompt.txt"
    latin1.write_bytes(b"x" * 20000 + "caf\u00e9".encode("latin-1"))  # past the first block a file is read in
    with pytest.raises(UserError) as e:
        read_prompt(f"FILE:{latin1}")
    assert str(e.value) == f"prompt file {latin1} is not UTF-8 text: byte 0xe9 at offset 20003"


def test_sample_refuses_a_prompt_that_is_not_utf8_on_a_bpe_run(bpe_trained_run):
    proc = run_here("sample.py", f"--out_dir={bpe_trained_run}", "--device=cpu", "--max_new_tokens=2",
                    os.fsdecode(b"--start=caf\xe9"))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: the prompt is not UTF-8 text: byte 0xe9 at offset 3; give UTF-8 text")
