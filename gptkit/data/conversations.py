"""
Conversations as tokens: the chat template, which tokens the loss counts, and conversation files.

A conversation is written `<|user|>question<|assistant|>answer<|end|>`, each turn after the first repeating the
pattern. The three markers are single tokens: each is a character of Unicode's private use area that no text
holds (U+E000-U+E002), so a char-level vocabulary is still a string of characters, and a BPE tokenizer of a chat
dataset has each as a token of its own past its vocabulary (gptkit/data/tokenizer.py; its "chat" names their
ids, as meta.json's does); shown to a person, they are written as their names. Beside each token goes its role,
which says whether the loss counts it: PROMPT for the user's turns and the markers that open turns (given, never
predicted), ANSWER for the assistant's tokens and the end marker after them (what the model learns to write, and
to stop), TEXT for plain text mixed in to keep what the model knew (trained as in pretraining).

A conversation file is JSON Lines in the format Hugging Face chat datasets and the OpenAI API use, one
conversation a line: {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}.
"""

import json

from gptkit.base.errors import UserError
from gptkit.data.sources import LinesOf, kind_of

MARKERS = {"user": "\ue000", "assistant": "\ue001", "end": "\ue002"}  # one character each, a token of its own
NAMES = {char: f"<|{name}|>" for name, char in MARKERS.items()}
PROMPT, ANSWER, TEXT = 0, 1, 2  # a token's role (see above), stored as one byte a token beside the tokens
ROLE_NAMES = ("prompt", "answer", "text")
ROLES = ("user", "assistant")


def render(messages, tok):
    """(token ids, roles) of a conversation: each user turn opened by <|user|>, each assistant turn by
    <|assistant|> and closed by <|end|>; the roles say which tokens the loss counts (ANSWER) and which it
    does not (PROMPT)."""
    ids, roles = [], []

    def add(text, role):
        piece = tok.encode(text)
        ids.extend(piece)
        roles.extend([role] * len(piece))

    for message in messages:
        if message["role"] == "user":
            add(MARKERS["user"] + message["content"], PROMPT)
        else:
            add(MARKERS["assistant"], PROMPT)
            add(message["content"] + MARKERS["end"], ANSWER)
    return ids, roles


def prompt_text(question):
    """What the model is given to answer one question: the user's turn and the marker that opens the
    answer."""
    return MARKERS["user"] + question + MARKERS["assistant"]


def shown(text):
    """Text with its markers written as their names, for a person to read."""
    for char, name in NAMES.items():
        text = text.replace(char, name)
    return text


def marker_name(tok, text):
    """A chat model's marker token, its text given, by its name (<|user|>, <|assistant|>, <|end|>), never its
    private-use character; None for any other token, or any model's without the markers."""
    return NAMES.get(text) if tok.chat else None


def typed(tok, text):
    """Text a person typed for tok's model. A chat model's markers are private characters no keyboard has, so a
    person writes them by name (<|user|>1+2<|assistant|>): those names become the markers, shown undone. Any other
    model's text is as it was typed."""
    if tok.chat:
        for char, name in NAMES.items():
            text = text.replace(name, char)
    return text


def check_messages(record, number, where):
    """The messages of one decoded JSON line, checked: a list of user and assistant turns that alternate,
    starting with the user's, none empty, at least one of them the assistant's; else one line naming the
    line's number."""
    at = f"{where} line {number}"
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{at}: expected {{\"messages\": [{{\"role\": \"user\", \"content\": ...}}, ...]}}")
    messages, merged = without_system(messages, at)
    for turn, message in enumerate(messages):
        shown = turn + 1 + merged  # the message's number in the line as written
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise UserError(f"{at}: message {shown} has role {role!r}; the roles are 'user' and 'assistant' (and "
                            "'system' first)")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise UserError(f"{at}: message {shown} ({message['role']})'s content is {json.dumps(content)[:40]}, "
                            "not a string")
        if not content or content.isspace():  # a turn of spaces says nothing either, and teaches an empty answer
            spaces = " but for whitespace" if content else ""
            raise UserError(f"{at}: message {shown} ({message['role']}) is empty{spaces}")
        if set(content) & set(NAMES):
            raise UserError(f"{at}: message {shown} holds a character the chat markers use (U+E000-U+E002)")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as e:  # a JSON escape of half a surrogate pair ("\ud800"): no character at all
            raise UserError(f"{at}: message {shown} holds {content[e.start]!r}, half of a surrogate pair, which is "
                            "no character") from None
        if message["role"] != ROLES[turn % 2]:
            raise UserError(f"{at}: message {shown} is the {message['role']}'s, but turns alternate, the "
                            "user's first")
    if len(messages) < 2:
        raise UserError(f"{at}: the conversation has no assistant turn")
    return messages


def without_system(messages, at):
    """(messages, 1) with a first system message merged into the user's message after it, as nanochat renders
    one (the template has no system marker); (messages, 0) as they are where there is none."""
    first = messages[0]
    if not isinstance(first, dict) or first.get("role") != "system":
        return messages, 0
    user = messages[1] if len(messages) > 1 and isinstance(messages[1], dict) else {}
    if not isinstance(first.get("content"), str) or user.get("role") != "user" or \
            not isinstance(user.get("content"), str):
        raise UserError(f"{at}: message 1 is the system's, which must be text and have a user's message after it")
    if not user["content"]:
        raise UserError(f"{at}: message 2 (user) is empty")
    content = f"{first['content']}\n\n{user['content']}" if first["content"] else user["content"]
    return [{"role": "user", "content": content}, *messages[2:]], 1


def read_conversations(path, skipped=None):
    """Every conversation of a JSON Lines file, as lists of messages (blank lines skipped); the first line that
    is not UTF-8, not JSON or not a conversation is one error naming its number, or, given a list `skipped`
    (--skip_bad), its number goes there and the line is left out."""
    return [messages for _, messages in numbered_conversations(path, skipped)]


def numbered_conversations(path, skipped=None):
    """read_conversations' conversations, each with the number of its line: [(number, messages)]."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    conversations = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:
            messages = conversation_on(line, number, path)
        except UserError:
            if skipped is None:
                raise
            skipped.append(number)
            continue
        if messages is not None:
            conversations.append((number, messages))
    if not conversations:
        left = f" ({len(skipped):,} bad lines skipped)" if skipped else ""
        raise UserError(f"{path} holds no conversations{left}")
    return conversations


def conversation_on(line, number, path):
    """The messages of a file's line (bytes), None for a blank one; one error naming the line for a bad one."""
    try:
        text = line.decode("utf-8-sig" if number == 1 else "utf-8")  # Windows' editors may start with a BOM
    except UnicodeDecodeError:
        raise UserError(f"{path} line {number} is not UTF-8 text") from None
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except ValueError as e:
        raise UserError(f"{path} line {number} is not JSON ({e.msg})") from None
    except RecursionError:
        raise UserError(f"{path} line {number} is nested too deeply to be a conversation") from None
    return check_messages(record, number, path)


def is_conversation_file(path):
    """Whether a JSON Lines file holds conversations (its first record has "messages"), not records of text. One
    compressed (.jsonl.gz, .jsonl.zst), which read_conversations does not open, is one line."""
    if kind_of(path) != "jsonl":
        return False
    with LinesOf(path) as (lines, _):
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    return False
                except RecursionError:
                    raise UserError(f"{path} line {number} is nested too deeply to be a record of text or a "
                                    "conversation") from None
                chat = isinstance(record, dict) and "messages" in record
                if chat and not path.name.lower().endswith(".jsonl"):
                    raise UserError(f"{path} holds conversations, compressed: decompress it to a .jsonl first "
                                    "(e.g. gunzip -k FILE)")
                return chat
    return False
