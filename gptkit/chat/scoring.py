"""Scoring a chat model on problems it never trained on: exact-match accuracy of its greedy answer, pass@k over
sampled ones (Chen et al. 2021's unbiased estimator), and the loss on plain text (what fine-tuning made it
forget)."""

import hashlib
import json
import math
from math import comb
from pathlib import Path

import torch

from gptkit.base.errors import UserError
from gptkit.chat.answering import MAX_ROWS, answer_text, conversation_prompt, end_id, question_prompt, sample_answers
from gptkit.data.conversations import numbered_conversations
from gptkit.data.tasks import TASKS
from gptkit.machine.threads import pick_decode_threads

SHORT_ANSWER = 8  # tokens: the tasks' answers are a few, so scoring's threads are timed on as many


def pass_at_k(n, c, k):
    """The chance that at least one of k answers drawn from n samples, c of them right, is right:
    1 - C(n-c, k) / C(n, k)."""
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(samples):
    """The k of pass@k a count of samples gives: 1, 8, 64, ... up to samples."""
    return [k for k in (1, 8, 64, 512) if k <= samples] or [1]


# the same command makes the same dataset again, mending it (with --start_over, another command would replace it)
PREPARE_AGAIN = "run data/prepare.py --synthetic=tasks again as the dataset was made (the same --tasks and --mix)"


def dataset_text(path, what, meta):
    """The text of a file data/prepare.py wrote beside a chat dataset's tokens (`what` it holds), checked against
    the checksum its meta.json keeps of it (a dataset prepared before they were kept has none), or one line saying
    it is missing or damaged and how to make it again."""
    try:
        data = path.read_bytes()
        expected = meta.get("text_sha256", {}).get(path.name)
        if expected is not None and hashlib.sha256(data).hexdigest() != expected:
            raise UserError(f"{path} is damaged or was edited: it does not match its checksum in meta.json; "
                            f"{PREPARE_AGAIN}")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}, {what}, is missing; {PREPARE_AGAIN}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; {PREPARE_AGAIN}") from None


def heldout_problems(folder, meta):
    """{task: [(question, answer), ...]} of a tasks dataset's held-out file; {} for a dataset without one."""
    if "heldout_file" not in meta:
        return {}
    path = Path(folder) / meta["heldout_file"]
    lines = dataset_text(path, "the dataset's held-out problems", meta).splitlines()
    problems = {}
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            (question, answer), task = [m["content"] for m in record["messages"][:2]], record["task"]
            if not all(isinstance(v, str) for v in (question, answer, task)) or task not in TASKS:
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):  # a hand edit: ValueError covers a line cut short
            raise UserError(f"{path} line {number} is not a held-out problem as data/prepare.py writes one; "
                            f"{PREPARE_AGAIN}") from None
        problems.setdefault(task, []).append((question, answer))
    return problems


def file_problems(path, tok):
    """{file name: [(messages, reference), ...]} from a conversations file: the last message of each, the
    assistant's, is the reference, what comes before it the prompt. One that cannot be scored (no answer last, or
    a character the vocabulary lacks) is one line naming its line, before any is scored."""
    conversations = numbered_conversations(Path(path))
    for number, messages in conversations:
        if messages[-1]["role"] != "assistant":  # its question has no reference to be scored against
            raise UserError(f"{path} line {number} ends with the user's turn: a conversation to score ends with "
                            "the assistant's answer, the reference")
        try:
            conversation_prompt(tok, messages)
            tok.encode(messages[-1]["content"])  # a reference the model cannot write would be scored wrong unseen
        except UserError as e:
            raise UserError(f"{path} line {number}: {e}") from None
    return {Path(path).stem: [(m, m[-1]["content"]) for _, m in conversations]}


def answers_to_write(problems, samples):
    """The answers score() writes: each problem's greedy one and `samples` sampled ones."""
    return sum(map(len, problems.values())) * (1 + samples)


def scoring_threads(threads, model, problems, samples):
    """CPU threads for scoring these problems, picked as sample.py picks them (`threads` if given), timed on as
    many rows as decode together and on a short answer's tokens: (count, the line saying why)."""
    rows = min(answers_to_write(problems, samples), MAX_ROWS)
    return pick_decode_threads(threads, model, next(model.parameters()).device.type, rows, SHORT_ANSWER)


def score(model, tok, problems, samples=0, temperature=1.0, max_new_tokens=32, seed=0, progress=None, advance=None):
    """{name: {"n", "accuracy", "pass_at": {k: ...}}} for each set of problems: {task: [(question, answer)]} (a
    task's checker judges) or {name: [(messages, reference)]} (exact match). Accuracy is the greedy answer's;
    pass@k is estimated from `samples` answers sampled at `temperature` (0: none). progress(name, result) hears of
    each set scored, advance(n) of each n answers written (n(1 + samples) in all)."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    results = {}
    for name, items in problems.items():
        prompts, right = prompts_and_judge(tok, name, items)
        greedy = sample_answers(model, prompts, 1, max_new_tokens, 0.0, end=end_id(tok), vocab_size=tok.vocab_size,
                                advance=advance)
        correct = [right(i, answer_text(tok, a[0])) for i, a in enumerate(greedy)]
        result = {"n": len(items), "accuracy": sum(correct) / len(items)}
        if samples:
            drawn = sample_answers(model, prompts, samples, max_new_tokens, temperature, generator=generator,
                                   end=end_id(tok), vocab_size=tok.vocab_size, advance=advance)
            counts = [sum(right(i, answer_text(tok, a)) for a in answers) for i, answers in enumerate(drawn)]
            result["pass_at"] = {str(k): sum(pass_at_k(samples, c, k) for c in counts) / len(items)
                                 for k in ks_for(samples)}
        results[name] = result
        if progress:
            progress(name, result)
    return results


def prompts_and_judge(tok, name, items):
    """The prompts of a set of problems, and judge(i, answer) -> whether answer i is right."""
    if name in TASKS and items and isinstance(items[0][0], str):
        task = TASKS[name]
        return [question_prompt(tok, q) for q, _ in items], lambda i, answer: task.check(items[i][0], answer)
    prompts = [conversation_prompt(tok, messages)[0] for messages, _ in items]  # file_problems checked each
    return prompts, lambda i, answer: answer == items[i][1]


@torch.no_grad()
def text_loss(model, tok, text, batch_size=32):
    """The model's mean loss per token on `text`, read in consecutive windows of its context so that each token
    is scored once, as train.py's final score reads a val split."""
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    T = model.config.block_size
    starts = list(range(0, len(ids) - 1 - T + 1, T)) or [0]
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for at in range(0, len(starts), batch_size):
        rows = [ids[s:s + T + 1] for s in starts[at:at + batch_size] if len(ids[s:s + T + 1]) == T + 1]
        if not rows:
            break
        xy = torch.stack(rows).to(device)
        _, loss = model(xy[:, :-1], xy[:, 1:])
        total, count = total + loss.item() * xy[:, 1:].numel(), count + xy[:, 1:].numel()
    if not count:
        raise UserError(f"the text to score has {len(ids)} tokens, fewer than a window of {T + 1}")
    return total / count if math.isfinite(total) else float("nan")
