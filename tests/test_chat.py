"""chat.py: answering once and in a conversation, scoring held-out problems (a table, or JSON in the issue's
shape), scoring conversations from a file, the report card, and each bad input as one line; a BPE chat model's
prompts and answers (gptkit/chat/)."""

import io
import json

import pytest
import torch

from chat import ChatConfig
from conftest import BPE_VOCAB, assert_one_error_line, check_ok, mixed_script_text, run_here, run_script, tiny_model
from gptkit.chat.answering import (answer_text, check_chat_model, end_id, next_answer_prompt, question_prompt,
                                   sample_answers)
from gptkit.base.errors import UserError
from gptkit.chat.scoring import file_problems, heldout_problems, pass_at_k, score
from gptkit.data.conversations import MARKERS, render
from gptkit.data.tokenizer import CharTokenizer


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 8) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # by hand: 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert pass_at_k(4, 1, 8) == 1.0  # fewer wrong answers than k: one of any k is right


@pytest.mark.parametrize("damage, expected", [
    (None, "heldout.jsonl, the dataset's held-out problems, is missing"),
    (b'{"task": "addition", "messages": [{"role": "user", "content": "1+2"}]}', "heldout.jsonl line 2 is not a "
     "held-out problem as data/prepare.py writes one"),
    (b'{"task": "addition", "mess', "heldout.jsonl line 2 is not a held-out problem"),
    (b'{"task": "additio", "messages": [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}]}',
     "heldout.jsonl line 2 is not a held-out problem"),  # a task no checker judges
    (b"\xff", "heldout.jsonl is not UTF-8 text")])
def test_a_damaged_held_out_file_is_one_line_that_says_to_prepare_again(tmp_path, damage, expected):
    good = json.dumps({"task": "addition", "messages": [{"role": "user", "content": "1+2"},
                                                        {"role": "assistant", "content": "3"}]}).encode()
    if damage is not None:
        (tmp_path / "heldout.jsonl").write_bytes(good + b"\n" + damage + b"\n")
    with pytest.raises(UserError) as e:
        heldout_problems(tmp_path, {"heldout_file": "heldout.jsonl"})
    assert expected in str(e.value) and str(e.value).endswith("again as the dataset was made (the same --tasks and "
                                                              "--mix)")
    (tmp_path / "heldout.jsonl").write_bytes(good + b"\n")
    assert heldout_problems(tmp_path, {"heldout_file": "heldout.jsonl"}) == {"addition": [("1+2", "3")]}


@pytest.mark.parametrize("turn", [0, 1])
def test_a_conversation_to_score_with_a_character_the_vocabulary_lacks_is_one_line_naming_its_line(tmp_path, turn):
    """In the question or in the reference: a reference the model cannot write would be scored wrong unseen."""
    tok = CharTokenizer(sorted(set("0123456789+") | set(MARKERS.values())))
    texts = ["1+2", "3"]
    texts[turn] += "é"
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": texts[0]},
                                             {"role": "assistant", "content": texts[1]}]}) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        file_problems(path, tok)
    assert str(e.value) == f"{path} line 1: the text has characters outside the training vocabulary: 'é'"


@pytest.mark.parametrize("name", ["heldout.jsonl", "mixed_val.txt"])
def test_a_scoring_file_edited_since_it_was_prepared_is_one_line(tmp_path, name):
    """What chat.py and rl.py score on, the held-out problems and the val part of the text mixed in, is checked
    against the checksums meta.json keeps: a held-out file cut down to fewer problems, or a val text cut short,
    would score on other problems or text without a word."""
    from conftest import make_text
    from gptkit.chat.scoring import dataset_text
    from gptkit.data.dataset import load_meta
    from gptkit.data.preparing import PrepareConfig, prepare

    (tmp_path / "text.txt").write_text(make_text(8000), encoding="utf-8")
    prepare(PrepareConfig(synthetic="tasks", tasks="addition,reverse", problems=200, heldout=5,
                          mix=str(tmp_path / "text.txt"), data_dir=str(tmp_path / "data"), workers=1))
    folder, meta = load_meta(str(tmp_path / "data"), "tasks")
    assert len(heldout_problems(folder, meta)["addition"]) == 5
    path = folder / name
    path.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[1:]), encoding="utf-8")
    with pytest.raises(UserError) as e:
        dataset_text(path, "what it holds", meta)
    assert str(e.value) == (f"{path} is damaged or was edited: it does not match its checksum in meta.json; run "
                            "data/prepare.py --synthetic=tasks again as the dataset was made (the same --tasks and "
                            "--mix)")
    prepare(PrepareConfig(synthetic="tasks", tasks="addition,reverse", problems=200, heldout=5,  # as it says
                          mix=str(tmp_path / "text.txt"), data_dir=str(tmp_path / "data"), workers=1))
    assert dataset_text(path, "what it holds", load_meta(str(tmp_path / "data"), "tasks")[1])


def test_an_answer_streams_after_start_as_a_user_runs_it(chat_run):
    proc = check_ok(run_script("chat.py", f"--out_dir={chat_run}", "--prompt=123+456", "--max_new_tokens=8"))
    assert proc.stdout.strip() and "<|" not in proc.stdout


def test_a_conversation_says_a_question_it_cannot_spell_before_any_answer_begins_and_goes_on(chat_run, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("日本\n1+1\n"))
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--max_new_tokens=4"))
    assert "outside the training vocabulary" in assert_one_error_line(proc.stderr)
    assert "\nyou> you> model> " in proc.stdout and proc.stdout.count("model> ") == 1


def test_a_prompt_it_cannot_spell_is_its_one_line_before_the_threads_are_measured(chat_run, monkeypatch):
    import chat
    monkeypatch.setattr(chat, "pick_decode_threads", lambda *a: pytest.fail("measured before the error"))
    with pytest.raises(UserError, match="outside the training vocabulary"):
        chat.main([f"--out_dir={chat_run}", "--prompt=\U0001F600"])


def test_questions_piped_from_a_windows_file_are_asked_without_their_carriage_returns(chat_run, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("1+1\r\n2+2\r\n"))
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--max_new_tokens=4"))
    assert proc.stderr == "" and proc.stdout.count("model> ") == 2


def test_questions_piped_from_a_file_with_a_byte_order_mark_or_bytes_not_utf8_are_asked_or_said_in_one_line(
        chat_run, monkeypatch):
    piped = io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf1+1\n\xff\n2+2\n"), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", piped)
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--max_new_tokens=4"))
    assert assert_one_error_line(proc.stderr) == "error: the question is not UTF-8 text"
    assert proc.stdout.count("model> ") == 2


def test_a_long_conversation_drops_its_oldest_turns_whole_so_the_context_opens_at_a_question():
    tok = CharTokenizer(sorted(set("0123456789+") | set(MARKERS.values())))
    turns = [("1+1", "2"), ("22+22", "44"), ("3+3", None)]  # 7, 10 and 5 tokens in the template
    messages = [{"role": role, "content": text} for q, a in turns for role, text in (("user", q), ("assistant", a))
                if text]
    asked = tok.encode(MARKERS["assistant"])
    assert next_answer_prompt(tok, messages, 22) == (render(messages, tok)[0] + asked, None)
    for block in (21, 15):  # the first question and its answer fall out, not a token of the next
        ids, note = next_answer_prompt(tok, messages, block)
        assert ids == render(messages[2:], tok)[0] + asked
        assert note == (f"note: the first question and its answer no longer fit the model's context of {block} "
                        "tokens: it answers without them")
    ids, note = next_answer_prompt(tok, messages, 14)
    assert ids == tok.encode(MARKERS["user"] + "3+3") + asked and "first 2 questions and their answers" in note
    ids, note = next_answer_prompt(tok, messages, 3)  # a question longer than the context
    assert ids == tok.encode("+3") + asked
    assert note == "note: the question is 5 tokens with its markers, more than the model's context of 3: it reads " \
                   "only the last 3"


def test_a_question_longer_than_the_context_is_answered_with_a_note_saying_so(chat_run, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("1+1\n" + "1" * 300 + "\n"))
    proc = check_ok(run_here("chat.py", f"--out_dir={chat_run}", "--max_new_tokens=4"))
    assert proc.stdout.count("model> ") == 2
    assert proc.stderr.startswith("note: the question is 302 tokens with its markers, more than the model's context")


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
    """By default each task's accuracy, pass@1 and pass@8 (8 answers sampled); --samples=64 adds pass@64."""
    proc = check_ok(run_here("chat.py", f"--report={trained_run[0]},{chat_run}", "--limit=3"))
    lines = proc.stdout.splitlines()
    assert lines[0] == f"|  | {trained_run[0].name} | {chat_run.name} |"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| addition")] == [
        "| addition accuracy", "| addition pass@1", "| addition pass@8"]
    assert any(line.startswith("| addition pass@8 | – | ") and "%" in line for line in lines)  # the base: no answer
    assert any(line.startswith("| plain text val loss |") for line in lines)
    assert any(line.startswith("| parameters trained |") for line in lines)
    proc = check_ok(run_here("chat.py", f"--report={chat_run}", "--limit=2", "--samples=64", "--tasks=addition"))
    assert [line.split(" | ")[0] for line in proc.stdout.splitlines() if line.startswith("| addition")] == [
        "| addition accuracy", "| addition pass@1", "| addition pass@8", "| addition pass@64"]


def test_the_report_card_says_where_its_stages_tokenize_the_text_otherwise():
    """A BPE stage's text val loss (nats per token of its pieces) stood beside a char stage's (per character)."""
    from gptkit.chat.report import units_note

    char, grown = {"tokenizer": "char", "vocab": "ab"}, {"tokenizer": "char", "vocab": "abc"}
    assert units_note({"out": char, "out-chat": grown}) is None  # the fine-tune's vocabulary grew: still characters
    assert units_note({"out": char, "runs/out-bpe": {"tokenizer": "tiktoken", "encoding": "gpt2"}}) == (
        "note: the plain text's val loss is per token of each stage's own tokenizer (out: char, out-bpe: tiktoken "
        "gpt2): it compares only between stages of one tokenizer")


def test_the_report_card_reads_the_checkpoint_asked_for_and_names_the_cells_it_cannot_score(chat_run, tmp_path,
                                                                                          monkeypatch, capsys):
    import shutil

    from gptkit.chat import report

    half = tmp_path / "half"  # a stage that has not finished an evaluation: latest.pt alone
    half.mkdir()
    shutil.copy(chat_run / "latest.pt", half / "latest.pt")
    proc = run_here("chat.py", f"--report={chat_run},{half}", "--limit=2")
    assert "use its latest state with --checkpoint=latest" in assert_one_error_line(proc.stderr)
    check_ok(run_here("chat.py", f"--report={chat_run},{half}", "--limit=2", "--checkpoint=latest"))
    cfg = ChatConfig(report=f"{chat_run},{half}", limit=2, checkpoint="latest")
    # a stage whose vocabulary cannot spell the text, or a task's questions (fine-tuned on other tasks): those
    # cells are left empty, each with a note, and the rest of the card is scored
    monkeypatch.setattr(report, "text_loss", lambda *args: (_ for _ in ()).throw(UserError("not spelled")))
    spells = report.prompts_and_judge
    monkeypatch.setattr(report, "prompts_and_judge", lambda tok, task, items: spells(tok, task, items)
                        if task == "addition" else (_ for _ in ()).throw(UserError("no 'v' in its vocabulary")))
    capsys.readouterr()
    columns = report.report_card(cfg, "cpu")
    assert all(c["text_val_loss"] is None and set(c["tasks"]) == {"addition"} for c in columns)
    said = capsys.readouterr().err
    assert f"note: {chat_run}'s text val loss is left out: not spelled\n" in said
    assert f"note: {half} is not asked reverse's held-out problems: no 'v' in its vocabulary\n" in said
    monkeypatch.setattr(report, "chat_sets", lambda ckpt, tasks: ({}, None))
    with pytest.raises(UserError, match=f"^{chat_run}'s dataset holds no held-out problems, which a report card"):
        report.report_card(cfg, "cpu")


@pytest.mark.parametrize("setting, expected", [
    (dict(eval=True, samples=8, temperature=0.0), "samples=8 answers at temperature 0 are the same greedy one each "
                                                  "time: pass@k needs a temperature above 0 (e.g. --temperature=1.0)"),
    (dict(eval=True, tasks=","), "tasks names nothing between its commas (got ',')"),
    (dict(eval=True, prompt="1+1"), "--prompt answers one question, --eval scores the held-out problems: give one of "
                                    "them"),
    (dict(prompt="1+1", samples=8, json=True), "--samples and --json go with --eval or --report, which score a run; a "
                                               "chat or --prompt answers as it samples"),
    (dict(limit=5), "--limit goes with --eval or --report, which score a run; a chat or --prompt answers as it "
                    "samples"),
    (dict(report="out,out-chat", problems="mine.jsonl"), "--report scores each stage on its dataset's held-out "
                                                         "problems itself: leave out --problems"),
    (dict(report=" , "), "report names nothing between its commas (got ' , ')"),
    (dict(eval=True, samples=1025, temperature=1.0), "samples must be from 0 to 1024 (got 1025)"),
    (dict(eval=True, problems="mine.jsonl", tasks="addition"), "--problems scores the conversations of its file, "
                                                               "--tasks the dataset's held-out problems: give one of "
                                                               "them"),
    (dict(report="out,out-chat", eval=True, prompt="1+1"), "--report scores each stage on its dataset's held-out "
                                                           "problems itself: leave out --eval and --prompt"),
    (dict(prompt=" \t"), "prompt holds only whitespace: give the question to answer, or leave --prompt out to talk"),
])
def test_settings_that_would_score_nothing_or_the_greedy_answer_k_times_are_one_line(setting, expected):
    with pytest.raises(ValueError) as e:
        ChatConfig(**setting)
    assert str(e.value) == expected


@pytest.mark.parametrize("case", ["not chat", "no run", "a checkpoint file", "unknown task", "outside the vocabulary",
                                  "a problem outside it", "problems without eval", "a problem without its answer",
                                  "a report column without a run"])
def test_bad_input_is_one_line(case, chat_run, trained_run, tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n" + "".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant",
                                                                                     "content": "2"}]}) + "\n"
                            for q in ("1+1", "日本")), encoding="utf-8")
    asked = tmp_path / "asked.jsonl"  # its last turn a question, after an answered one
    asked.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"},
                                              {"role": "user", "content": "2+2"}]}) + "\n", encoding="utf-8")
    args = {"not chat": [f"--out_dir={trained_run[0]}", "--prompt=hi"],
            "no run": [f"--out_dir={tmp_path / 'nothing'}", "--prompt=hi"],
            "a checkpoint file": [f"--out_dir={chat_run / 'best.pt'}", "--prompt=hi"],
            "unknown task": [f"--out_dir={chat_run}", "--eval", "--tasks=sort"],
            "outside the vocabulary": [f"--out_dir={chat_run}", "--prompt=日本"],
            "a problem outside it": [f"--out_dir={chat_run}", "--eval", f"--problems={mine}"],
            "problems without eval": [f"--out_dir={chat_run}", "--problems=x.jsonl"],
            "a problem without its answer": [f"--out_dir={chat_run}", "--eval", f"--problems={asked}"],
            "a report column without a run": [f"--report={chat_run},{tmp_path / 'out-rl'}"]}[case]
    proc = run_here("chat.py", *args)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr)
    # the hints prepare the tasks with the base's text mixed in, which keeps what the base learned of it
    expected = {"not chat": "`python data/prepare.py --synthetic=tasks --mix=data/shakespeare_char/input.txt` then "
                            "`python train.py config/chat_sft.py",
                "unknown task": "never saw task 'sort'",
                "no run": "holds no run: fine-tune one for chat there first, e.g. `python data/prepare.py "
                          "--synthetic=tasks --mix=data/shakespeare_char/input.txt`",
                "a checkpoint file": f"is a file, not a run's folder: give the folder train.py wrote "
                                     f"(--out_dir={chat_run}, and --checkpoint to pick its checkpoint)",
                "outside the vocabulary": "outside the training vocabulary",
                "a problem outside it": f"{mine} line 3: the text has characters outside the training vocab",
                "problems without eval": "add --eval",
                "a problem without its answer": f"{asked} line 1 ends with the user's turn: a conversation to score "
                                                "ends with the assistant's answer, the reference",
                "a report column without a run": f"{tmp_path / 'out-rl'} holds no run: train that stage first "
                                                 "(docs/chat.md names each stage's command), or leave it out of "
                                                 "--report"}[case]
    assert expected in line


@pytest.fixture(scope="module")
def bpe():
    """A trained BPE of a chat dataset: BPE_VOCAB tokens, then the chat markers."""
    from gptkit.data.bpe import train_bpe
    from gptkit.data.tokenizer import TrainedBPE

    return TrainedBPE(train_bpe([mixed_script_text()], BPE_VOCAB), chat=True)


def rigged(vocab_size, favourites):
    """A tiny model whose every next token's logits are `favourites` ({id: logit}, the rest 0), whatever it read:
    its last norm writes one constant vector, which the head reads through a single column."""
    model = tiny_model(vocab_size=vocab_size)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.lm_head.weight.zero_()
        for token, logit in favourites.items():
            model.lm_head.weight[token, 0] = logit
    return model


def test_a_bpe_chat_models_prompt_holds_each_marker_as_one_token_and_its_answer_stops_at_end(bpe):
    check_chat_model(bpe, "out-chat")
    user, assistant, end = bpe.chat["user"], bpe.chat["assistant"], bpe.chat["end"]
    assert end_id(bpe) == end == BPE_VOCAB + 2
    prompt = question_prompt(bpe, "12+34")
    assert prompt == [user, *bpe.encode("12+34"), assistant]
    four, six = bpe.encode("4")[0], bpe.encode("6")[0]
    model = rigged(320, {four: 9.0, end: 10.0})  # the BPE's 303 tokens, padded to 320 rows as train.py pads them
    answer = sample_answers(model, [prompt], end=end, vocab_size=bpe.vocab_size)[0][0]
    assert answer == [end] and answer_text(bpe, answer) == ""
    model = rigged(320, {four: 10.0, six: 9.0, end: 9.5})  # 4, then 4 again: it never stops before max_new_tokens
    answer = sample_answers(model, [prompt], max_new_tokens=3, end=end, vocab_size=bpe.vocab_size)[0][0]
    assert answer == [four] * 3 and answer_text(bpe, answer) == "444"


def test_a_bpe_chat_model_never_draws_its_tables_padding_rows(bpe):
    """Rows past the tokenizer's vocabulary (padding) decode to nothing: answers and scores never meet them, even
    from a model that favours them."""
    padding = {token: 20.0 for token in range(bpe.vocab_size, 320)}
    model = rigged(320, padding)
    prompt = question_prompt(bpe, "12+34")
    drawn = sample_answers(model, [prompt], samples=16, max_new_tokens=4, temperature=1.0,
                           generator=torch.Generator().manual_seed(0), end=end_id(bpe), vocab_size=bpe.vocab_size)
    assert all(t < bpe.vocab_size for answer in drawn[0] for t in answer)
    unrestricted = sample_answers(model, [prompt], max_new_tokens=4, end=end_id(bpe))
    assert all(t >= bpe.vocab_size for t in unrestricted[0][0])  # what vocab_size keeps out
    result = score(model, bpe, {"addition": [("12+34", "46")]}, samples=4, max_new_tokens=4)
    assert result["addition"]["n"] == 1 and result["addition"]["accuracy"] == 0.0


def test_a_run_scored_on_its_dataset_prepared_again_says_so(chat_run, capsys):
    """The checkpoint keeps the checksum of the tokens it trained on: scored after its dataset was prepared again
    into other tokens (other tasks or counts), a note says the problems are the dataset's as it is now."""
    from gptkit.chat.report import chat_sets
    from gptkit.run.checkpoint import load_checkpoint

    ckpt = load_checkpoint(chat_run / "best.pt")
    assert isinstance(ckpt["tokens"], str)
    capsys.readouterr()
    chat_sets(ckpt)
    assert "prepared again" not in capsys.readouterr().err
    chat_sets(dict(ckpt, tokens="0" * 64))
    assert capsys.readouterr().err == ("note: dataset 'tasks' was prepared again since this run trained on it (other "
                                       "tokens): it is scored on the dataset as it is now\n")
    with pytest.raises(UserError, match=r"never saw task 'sort': its dataset .* \(prepared again since the run "
                                        r"trained on it\) holds addition, reverse"):
        chat_sets(dict(ckpt, tokens="0" * 64), tasks="sort")
