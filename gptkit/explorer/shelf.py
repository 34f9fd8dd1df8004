"""The models the explorer holds: each picked run loaded once, in float32 for analysis and laid out for decoding,
the least recently picked dropped first; each SAE trained on a run, read once and kept with its model; and each
snapshot of a run a request asks for ("checkpoint": "iter:1200"), loaded once and kept with the run's model, the
least recently asked for dropped first."""

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from gptkit.base.errors import UserError
from gptkit.explorer.feature_answers import checked_hook, files_identity, read_sae
from gptkit.explorer.memory import bound_freed_memory, give_back_memory
from gptkit.explorer.runs import (ApiError, Summary, find_run, find_runs, identity_of, shown, summarize,
                                  without_paths)
from gptkit.explorer.timeline_answers import checkpoint_file
from gptkit.interp.experiments import shown_value
from gptkit.machine.stand_ins import unwatched_edits
from gptkit.machine.precision import DTYPES, pick_decode_dtype
from gptkit.machine.threads import pick_decode_threads
from gptkit.run.checkpoint import MODEL_KEYS, SNAPSHOT_KEYS
from gptkit.run.run_folder import RunDir, code_changed_note, model_at
from gptkit.sampling.decoding import lay_out_for_decoding

LOADED_AT_ONCE = 4  # models kept in memory; the least recently picked one is dropped first
SNAPSHOTS_AT_ONCE = 4  # snapshots kept with each of them: a slider dragged back and forth reloads none of these


@dataclass
class Loaded:
    """A picked run: its model in float32 for analysis, a copy laid out for decoding, and its tokenizer."""

    summary: Summary
    model: torch.nn.Module
    decoder: torch.nn.Module
    tok: object
    decoding: str  # which precision decodes, and why
    # where model.py has changed since the checkpoint was trained, the console's note naming what changed; else None
    code_note: str = None
    # where model.py's edit is one that the panels watching hooks write out in their own code, the console's note
    # saying so (unwatched_edits); else None
    watch_note: str = None
    # hook -> its SAE (gptkit/explorer/feature_answers.py's Kept), once asked for
    saes: dict = field(default_factory=dict)
    at: str = None  # the checkpoint a request named ('iter:1200'), for one of the run's snapshots; else None
    snapshots: OrderedDict = field(default_factory=OrderedDict)  # checkpoint -> its Loaded, once asked for


class Shelf:
    """The runs under the root folder as they are now (a run trained after start-up is there, a checkpoint
    replaced is read again), each loaded when first picked and kept while recently used."""

    def __init__(self, root, device, dtype="auto"):
        self.root, self.device, self.dtype = Path(root), device, dtype
        self.known = {}  # name -> its Summary, kept while its checkpoint file is the same file
        self.known_lock = threading.Lock()
        self.loaded = OrderedDict()
        self.lock = threading.Lock()  # one forward pass at a time: requests share the models and the threads
        bound_freed_memory()

    def current(self, name, folder):
        """The run's summary, read again only when its checkpoint is another file (or the same rewritten)."""
        with self.known_lock:
            old = self.known.get(name)
        identity = identity_of(folder)
        if old is None or old.folder != folder or identity is None or old.identity != identity:
            old = summarize(name, folder)
            with self.known_lock:
                self.known[name] = old
        return old

    def summaries(self):
        """Every run under the root, as it is now."""
        runs = self.scan(find_runs, self.root)
        with self.known_lock:  # runs gone are forgotten
            self.known = {name: s for name, s in self.known.items() if name in runs}
        return [self.current(name, folder) for name, folder in runs.items()]

    def scan(self, how, *args):
        try:
            return how(*args)
        except OSError as e:
            raise ApiError(409, without_paths(f"cannot read {e.filename or self.root} ({e.strerror or e})",
                                              self.root)) from None

    @property
    def root_name(self):
        """The root folder as answers name it: by its name, never its path (see without_paths)."""
        return shown(self.root.resolve().name)

    def summary(self, name):
        folder = self.scan(find_run, self.root, name)
        if folder is None:
            raise ApiError(404, f"no run named {shown_value(name)} in {self.root_name}")
        summary = self.current(name, folder)
        if summary.error:
            raise ApiError(409, f"run {shown_value(name)} cannot be opened: {summary.error}")
        return summary

    def get(self, name, checkpoint=None):
        """The loaded run; with a checkpoint ('iter:N', 'best', 'latest') that is another file than the run's own,
        that file's model, kept with the run's."""
        loaded = self.run(name)
        return loaded if checkpoint is None else self.at(loaded, checkpoint)

    def run(self, name):
        summary = self.summary(name)
        with self.lock:
            if name not in self.loaded or self.loaded[name].summary is not summary:
                replaced = name in self.loaded
                self.loaded[name] = self.load(summary)
                while len(self.loaded) > LOADED_AT_ONCE:
                    self.loaded.popitem(last=False)
                    replaced = True
                if replaced:
                    give_back_memory()
            self.loaded.move_to_end(name)
            return self.loaded[name]

    def at(self, loaded, checkpoint):
        """The model of another checkpoint of a loaded run, loaded once and read again when its file is replaced (a
        run still training thins its snapshots); one line where the run does not keep it."""
        path, identity = checkpoint_file(loaded.summary, checkpoint)
        if path == loaded.summary.checkpoint:
            return loaded
        with self.lock:
            kept = loaded.snapshots.pop(checkpoint, None)
            dropped = kept is not None and kept.summary.identity != identity  # its file replaced: read again
            if kept is None or dropped:
                kept = self.load(replace(loaded.summary, checkpoint=path, identity=identity), checkpoint)
            loaded.snapshots[checkpoint] = kept
            while len(loaded.snapshots) > SNAPSHOTS_AT_ONCE:
                loaded.snapshots.popitem(last=False)
                dropped = True
            if dropped:
                give_back_memory()
            return kept

    def sae(self, loaded, hook):
        """The SAE at hook of a loaded run, read once and kept with its model (and dropped with it) while its files
        are the same files; one line where the run has none there (404) or it cannot be read (409)."""
        checked_hook(loaded.model, hook)
        identity = files_identity(loaded.summary.folder / "sae" / hook)
        with self.lock:
            kept = loaded.saes.get(hook)
            if kept is not None and kept.identity != identity:  # trained again: the old one's memory goes back
                del loaded.saes[hook]
                give_back_memory()
            if hook not in loaded.saes:
                loaded.saes[hook] = read_sae(loaded, hook, identity)
            return loaded.saes[hook]

    def load(self, summary, at=None):
        """The model and tokenizer of the very checkpoint the summary read (at: the checkpoint a request named)."""
        try:
            snapshot = at is not None and at.startswith("iter:")
            model, tok, ckpt = model_at(summary.checkpoint, self.device, watched=True,
                                        required=SNAPSHOT_KEYS if snapshot else MODEL_KEYS)
            if snapshot:  # checked on the checkpoint loaded, not read again
                RunDir(summary.folder).check_snapshot(int(at[5:]), ckpt)
        except UserError as e:
            why = without_paths(str(e), summary.folder)
            if at is not None:  # the run opens: it is the checkpoint a request named that does not
                raise ApiError(409, f"run {shown_value(summary.name)} at {at} cannot be opened: {why}; the run's own "
                                    "weights still open") from None
            raise ApiError(409, f"run {shown_value(summary.name)} cannot be opened: {why}") from None
        decoder = copy.deepcopy(model)
        if self.device == "cpu":
            lay_out_for_decoding(decoder)
        _, threads = pick_decode_threads(0, decoder, self.device)  # as sample.py: one thread unless clearly faster
        dtype, why = pick_decode_dtype(self.dtype, decoder, self.device)
        changed = code_changed_note(ckpt, summary.checkpoint)  # the page's words for it, holding no path
        watch = unwatched_edits(model)  # the words model_at printed, asked of the same model
        return Loaded(summary, model, decoder.to(DTYPES[dtype]), tok, "; ".join(w for w in (why, threads) if w),
                      code_note=changed and without_paths(changed.removeprefix("note: "), summary.folder),
                      watch_note=watch and watch.removeprefix("note: "), at=at)


