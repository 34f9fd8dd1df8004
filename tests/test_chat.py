"""chat.py: answering once and in a conversation, scoring held-out problems (a table, or JSON in the issue's
shape), scoring conversations from a file, the report card, and each bad input as one line."""

import json

import pytest

from conftest import assert_one_error_line, check_ok, run_here, run_script
from gptkit.chat.scoring import pass_at_k


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 8) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # by hand: 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert pass_at_k(4, 1, 8) == 1.0  # fewer wrong answers than k: one of any k is right


def test_an_answer_streams_after_start_as_a_user_runs_it(chat_run):
    proc = check_ok(run_script("chat.py", f"--out_dir={chat_run}", "--prompt=123+456", "--max_new_tokens=8"))
    assert proc.stdout.strip() and "<|" not in proc.stdout


def test_eval_prints_each_task_and_json_in_the_issues_shape(chat_run):
    table = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--eval", "--limit=5"))
    assert "| addition | 5 |" in table.stdout and "| reverse | 5 |" in table.stdout
    assert "plain text val loss" in table.stdout
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--eval", "--limit=4", "--samples=8", "--json"))
    result = json.loads(proc.stdout)
    assert set(result) == {"tasks", "text_val_loss"} and result["text_val_loss"] > 0
    addition = result["tasks"]["addition"]
    assert addition["n"] == 4 and 0 <= addition["accuracy"] <= 1 and set(addition["pass_at"]) == {"1", "8"}
    assert addition["pass_at"]["1"] <= addition["pass_at"]["8"]


def test_problems_from_a_file_are_scored_against_their_last_answer(chat_run, tmp_path):
    chats = tmp_path / "mine.jsonl"
    chats.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                        {"role": "assistant", "content": a}]})
                               for q, a in [("111+111", "222"), ("reverse: abc", "cba")]), encoding="utf-8")
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--eval", f"--problems={chats}", "--json"))
    assert json.loads(proc.stdout)["tasks"]["mine"]["n"] == 2


def test_the_report_card_puts_the_stages_side_by_side(chat_run, trained_run):
    proc = check_ok(run_here("chat.py", f"--report={trained_run[0]},{chat_run}", "--limit=3", "--samples=8"))
    lines = proc.stdout.splitlines()
    assert lines[0] == f"|  | {trained_run[0].name} | {chat_run.name} |"
    assert any(line.startswith("| addition pass@8 | – |") for line in lines)  # the base cannot be asked
    assert any(line.startswith("| plain text val loss |") for line in lines)
    assert any(line.startswith("| parameters trained |") for line in lines)


@pytest.mark.parametrize("case", ["not chat", "unknown task", "outside the vocabulary", "problems without eval"])
def test_bad_input_is_one_line(case, chat_run, trained_run):
    args = {"not chat": [f"--out_dir={trained_run[0]}", "--prompt=hi"],
            "unknown task": [f"--out_dir={chat_run}", "--eval", "--tasks=sort"],
            "outside the vocabulary": [f"--out_dir={chat_run}", "--prompt=日本"],
            "problems without eval": [f"--out_dir={chat_run}", "--problems=x.jsonl"]}[case]
    proc = run_here("chat.py", *args)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr)
    expected = {"not chat": "config/chat_sft.py", "unknown task": "never saw task 'sort'",
                "outside the vocabulary": "outside the training vocabulary",
                "problems without eval": "add --eval"}[case]
    assert expected in line
