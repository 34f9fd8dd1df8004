"""Prompt text from the command line (gptkit/sampling/prompts.py): escapes typed in a shell, and a file read as
it is."""

import pytest

from gptkit.base.errors import UserError
from gptkit.sampling.prompts import read_prompt, unescape


def test_unescape_of_command_line_text(tmp_path):
    assert unescape("\\n\\n") == "\n\n" and read_prompt("A\\tB\\\\n") == "A\tB\\n"
    assert unescape("caf\u00e9 \\x") == "caf\u00e9 \\x"  # other text and unknown escapes unchanged
    prompt = tmp_path / "new"
    prompt.write_text("a \\n stays two characters", encoding="utf-8")
    assert read_prompt(f"FILE:{prompt}") == "a \\n stays two characters"  # a file's text is taken as it is
    with pytest.raises(UserError, match="could not read prompt file"):
        read_prompt(f"FILE:{tmp_path / 'nope.txt'}")
