"""A chat model's answers: the prompt `<|user|>question<|assistant|>`, then tokens sampled with the KV cache
until the model writes <|end|>. Many questions are answered together, in batches of prompts of one length (the
model has no padding mask, so a batch's rows must line up)."""

from collections import defaultdict

import torch

from gptkit.base.errors import UserError
from gptkit.data.chat_preparing import PREPARE_TASKS
from gptkit.data.conversations import MARKERS, prompt_text, render
from gptkit.sampling.decoding import decode_steps

MAX_ROWS = 1024  # sequences decoded together: enough to fill two cores, little memory for a small model


def check_chat_model(tok, where):
    """A model that knows the chat markers (its tokenizer has each as a single token, char-level or BPE); else one
    line naming the command that teaches it them."""
    if tok.chat is None:
        raise UserError(f"{where} was never fine-tuned for chat (its vocabulary has no <|user|> marker): "
                        f"fine-tune it with `{PREPARE_TASKS}` then "
                        f"`python train.py config/chat_sft.py --init_from={where}`")


def end_id(tok):
    return tok.chat["end"]


@torch.no_grad()
def sample_answers(model, prompts, samples=1, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
                   generator=None, end=None, vocab_size=None, advance=None):
    """For each prompt (a list of token ids), `samples` answers as lists of token ids, each up to and
    including `end` where the model wrote it within max_new_tokens: [[ids, ...] per prompt]. vocab_size: the
    tokenizer's, so that a model's padding rows (a BPE's table is padded to a multiple of 64) are never drawn,
    since no tokenizer can decode them. advance(n), if given, hears of each n answers written."""
    out = [[None] * samples for _ in prompts]
    rows = defaultdict(list)  # prompts of one length decode together
    for i, ids in enumerate(prompts):
        rows[len(ids)].extend((i, s) for s in range(samples))
    device = next(model.parameters()).device
    for length, places in sorted(rows.items()):
        for at in range(0, len(places), MAX_ROWS):
            chunk = places[at:at + MAX_ROWS]
            idx = torch.tensor([prompts[i] for i, _ in chunk], dtype=torch.long, device=device)
            for (i, s), answer in zip(chunk, decode_rows(model, idx, max_new_tokens, temperature, top_k, top_p,
                                                         generator, end, vocab_size)):
                out[i][s] = answer
            if advance:
                advance(len(chunk))
    return out


def decode_rows(model, idx, max_new_tokens, temperature, top_k, top_p, generator, end, vocab_size=None):
    """Each row's new tokens, up to and including `end`; decoding stops once every row has written it."""
    answers, done = [[] for _ in range(idx.size(0))], [False] * idx.size(0)
    steps = decode_steps(model, idx, min(max_new_tokens, model.config.block_size), temperature, top_k, top_p,
                         generator=generator, vocab_size=vocab_size or model.config.vocab_size)
    for column, _, _ in steps:
        for row, token in enumerate(column[:, 0].tolist()):
            if not done[row]:
                answers[row].append(token)
                done[row] = token == end
        if all(done):
            break
    return answers


def answer_text(tok, ids):
    """An answer's text: its tokens before <|end|>."""
    end = end_id(tok)
    return tok.decode(ids[:ids.index(end)] if end in ids else ids)


def question_prompt(tok, question):
    return tok.encode(prompt_text(question))


def next_answer_prompt(tok, messages, block_size):
    """The tokens that ask for the answer to a conversation's last turn, the user's, within a context of
    block_size: the oldest turns fall out whole, a question with its answer at a time, so that the context opens
    at <|user|> as every conversation the model learned from did; a question longer than the context alone keeps
    its end. And the note that says what did not fit (None where all did): the model cannot say it forgot."""
    dropped = 0
    while True:
        ids, _ = render(messages, tok)
        ids += tok.encode(MARKERS["assistant"])
        if len(ids) <= block_size:
            gone = "first question and its answer" if dropped == 1 else f"first {dropped} questions and their answers"
            return ids, dropped and f"note: the {gone} no longer fit the model's context of {block_size} tokens: it " \
                                    "answers without them" or None
        if len(messages) == 1:
            return ids[-block_size:], (f"note: the question is {len(ids):,} tokens with its markers, more than the "
                                       f"model's context of {block_size}: it reads only the last {block_size}")
        messages, dropped = messages[2:], dropped + 1


def conversation_prompt(tok, messages):
    """The tokens that ask for a conversation's last assistant message: every turn before it, then
    <|assistant|>; and that message's text, the reference."""
    ids, _ = render(messages[:-1], tok)
    return ids + tok.encode(MARKERS["assistant"]), messages[-1]["content"]
