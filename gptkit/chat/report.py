"""The report card: the stages of a model (base, SFT, LoRA, RL), one column each, scored alike on the same
held-out problems and the same plain text; with what each stage cost in time and in parameters trained."""

import json
import sys
from pathlib import Path

import torch

from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items
from gptkit.chat.scoring import (dataset_text, heldout_problems, ks_for, prompts_and_judge, score, scoring_threads,
                                 text_loss)
from gptkit.data.dataset import load_meta, tokens_checksum
from gptkit.run.checkpoint import load_checkpoint, model_config
from gptkit.run.run_folder import RunDir, model_of, refuse_a_file
from model import GPT


def run_dataset(ckpt):
    """The folder and metadata of the dataset a run trained on, from its checkpoint's config."""
    config = ckpt["config"]
    return load_meta(config.get("data_dir", ""), config.get("dataset", ""))


def chat_sets(ckpt, tasks="", problems=None):
    """(held-out problems by task, the plain val text or None) of a chat run's dataset; `tasks` picks some."""
    folder, meta = run_dataset(ckpt)
    found = heldout_problems(folder, meta) if problems is None else problems
    again = isinstance(ckpt.get("tokens"), str) and ckpt["tokens"] != tokens_checksum(meta)
    if again:  # its held-out problems and text are the dataset's as it is now
        print(f"note: dataset {ckpt['config'].get('dataset')!r} was prepared again since this run trained on it "
              "(other tokens): it is scored on the dataset as it is now", file=sys.stderr)
    if tasks:
        asked = comma_items(tasks)
        never = [t for t in asked if t not in found]
        if never:
            since = " (prepared again since the run trained on it)" if again else ""
            raise UserError(f"the run never saw task {never[0]!r}: its dataset {meta['source']}{since} holds "
                            f"{', '.join(found) or 'no tasks'}")
        found = {t: found[t] for t in asked}
    val_file = meta.get("mix", {}).get("val_file")
    text = dataset_text(Path(folder) / val_file, "the plain text's val part", meta) if val_file else None
    return found, text


def trained_share(ckpt):
    """(parameters that trained, all parameters) of a run's model, counted on the meta device."""
    with torch.device("meta"):
        model = GPT(model_config(ckpt, "checkpoint"))
    everything = model.num_params(non_embedding=False)
    return (model.trainable_params() if model.config.lora_rank else everything), everything


def seconds_spent(out_dir):
    """A run's time spent training, from its latest state; None where it keeps none."""
    latest = RunDir(out_dir).latest
    if not latest.exists():
        return None
    return load_checkpoint(latest).get("seconds_spent")


def stage(out_dir, problems, text, cfg, device):
    """(one column: the run's scores on the problems (none for a model never fine-tuned for chat), its loss on
    the text, its time and the parameters it trained; the run's tokenizer)."""
    model, tok, ckpt = model_of(out_dir, cfg.checkpoint, device)
    trained, total = trained_share(ckpt)
    column = {"run": out_dir, "seconds": seconds_spent(out_dir), "trained": trained, "params": total, "tasks": None}
    scoring_threads(cfg.threads, model, problems, cfg.sampled())
    if tok.chat is not None:  # else a base model, which cannot be asked
        column["tasks"] = score(model, tok, spelled(out_dir, tok, problems), cfg.sampled(), cfg.temperature,
                                cfg.max_new_tokens, cfg.seed)
    column["text_val_loss"] = None
    try:
        column["text_val_loss"] = text_loss(model, tok, text) if text else None
    except UserError as e:  # a text its vocabulary cannot spell: its cell is left empty, and why said
        print(f"note: {out_dir}'s text val loss is left out: {e}", file=sys.stderr)
    return column, tok


def spelled(out_dir, tok, problems):
    """The tasks whose questions the run's vocabulary can spell; each other one is left out of its column (a
    stage fine-tuned on other tasks), with a note."""
    kept = {}
    for task, items in problems.items():
        try:
            prompts_and_judge(tok, task, items)
            kept[task] = items
        except UserError as e:
            print(f"note: {out_dir} is not asked {task}'s held-out problems: {e}", file=sys.stderr)
    return kept


def report_card(cfg, device):
    """Every stage's column, the problems and text taken from the first chat run's dataset."""
    runs = comma_items(cfg.report)
    for out_dir in runs:  # before any column is scored
        refuse_a_file(out_dir, "report")
        if RunDir(out_dir).shown() is None:
            raise UserError(f"{out_dir} holds no run: train that stage first (docs/chat.md names each stage's "
                            "command), or leave it out of --report")
    problems = text = None
    for chat_run in runs:
        ckpt = load_checkpoint(RunDir(chat_run).model_file(cfg.checkpoint))
        if "chat" in run_dataset(ckpt)[1]:
            problems, text = chat_sets(ckpt, cfg.tasks)
            break
    if problems is None:
        raise UserError(f"none of {', '.join(runs)} was fine-tuned for chat: a report card compares the stages "
                        "of a chat model (python train.py config/chat_sft.py makes one)")
    if not problems:
        raise UserError(f"{chat_run}'s dataset holds no held-out problems, which a report card scores each stage on: "
                        "its stages are fine-tunes on a dataset of data/prepare.py --synthetic=tasks")
    if cfg.limit:
        problems = {task: items[:cfg.limit] for task, items in problems.items()}
    scored = [stage(out_dir, problems, text, cfg, device) for out_dir in runs]
    if note := units_note({column["run"]: tok.to_meta() for column, tok in scored}):
        print(note, file=sys.stderr)
    return [column for column, _ in scored]


def units_note(tokenizers):
    """A note where the stages ({run: its tokenizer's meta}) tokenize the text otherwise: each one's text val loss is
    per token of its own tokenizer (a character, or a BPE's pieces), which do not compare; None where they agree."""
    kinds = {run: " ".join(str(meta[key]) for key in ("tokenizer", "encoding") if meta.get(key))
             for run, meta in tokenizers.items()}
    if len(set(kinds.values())) < 2:
        return None
    return ("note: the plain text's val loss is per token of each stage's own tokenizer ("
            + ", ".join(f"{Path(run).name}: {kind}" for run, kind in kinds.items())
            + "): it compares only between stages of one tokenizer")


def card_table(columns, samples):
    """The report card as a Markdown table: pass@k for each k that `samples` answers a problem give."""
    def cell(column, task, key):
        result = (column["tasks"] or {}).get(task)
        if result is None:
            return "–"
        value = result["accuracy"] if key == "accuracy" else result.get("pass_at", {}).get(key)
        return "–" if value is None else f"{100 * value:.1f}%"

    tasks = next(c["tasks"] for c in columns if c["tasks"])
    rows = [["", *[Path(c["run"]).name for c in columns]], ["---"] * (len(columns) + 1)]
    for task in tasks:
        for key, label in (("accuracy", "accuracy"), *((str(k), f"pass@{k}") for k in ks_for(samples) if samples)):
            rows.append([f"{task} {label}", *[cell(c, task, key) for c in columns]])
    rows.append(["plain text val loss", *[f"{c['text_val_loss']:.4f}" if c["text_val_loss"] else "–"
                                          for c in columns]])
    rows.append(["time training", *[f"{c['seconds']:.0f} s" if c["seconds"] else "–" for c in columns]])
    rows.append(["parameters trained", *[f"{c['trained']:,} ({100 * c['trained'] / c['params']:.1f}%)"
                                         for c in columns]])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def card_json(columns):
    return json.dumps(columns, indent=1)
