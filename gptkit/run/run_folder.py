"""A run's folder (out_dir): the files a run keeps there, the lock that keeps a second run out, and which
checkpoint each command reads.

    latest.pt       the whole resumable state, written at evaluations, on a stop signal and at the end
    latest.prev.pt  the state before it: each save of latest.pt moves the one it replaces here
    best.pt         the weights of the best val loss so far, written only when val loss improves
    ckpt.pt         the single checkpoint of earlier versions, still read
    metrics.jsonl   every logged and evaluated loss
    run.lock        held (flock) by the run writing here
    snapshots/      with --snapshots=N, the weights at N of its recorded steps: iter_<N>.pt, opened with iter:<N>

and what the tools draw of a run there: plot.py's loss.png and attention.png, analyze.py's heads.png, patch.png
and timeline.png.
"""

import os
import re
import stat
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from gptkit.base.errors import UserError
from gptkit.base.files import link_in_place, no_links
from gptkit.base.locks import exclusive
from gptkit.data.tokenizer import tokenizer_from_meta
from gptkit.machine.stand_ins import changed_since, unwatched_edits
from gptkit.run.checkpoint import (MODEL_KEYS, SNAPSHOT_KEYS, load_checkpoint, model_from_checkpoint, model_header,
                                   model_shape, shape_words, special_kind)
from gptkit.run.metrics import parsed, rl_run


def remove_unused(made, lock):
    """Remove a run's lock and the folders it made for it, innermost first, while it holds the lock: a run that
    opens the lock file meanwhile finds it held, and one that comes after makes the folder anew."""
    lock.unlink()
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # another process put something there meanwhile: it stays, with what holds it
            return


class RunDir:
    """The paths of one run folder, and what can be asked of them."""

    def __init__(self, out_dir):
        if out_dir == "":  # Path('') is the folder you are in: --out_dir=$UNSET would write a run among your files
            raise UserError("out_dir is empty: name the run's folder (--out_dir=. for the folder you are in)")
        self.path = Path(out_dir)
        self.latest, self.previous = self.path / "latest.pt", self.path / "latest.prev.pt"
        self.best, self.legacy = self.path / "best.pt", self.path / "ckpt.pt"
        self.metrics = self.path / "metrics.jsonl"
        self.snapshots = self.path / "snapshots"

    def snapshot(self, iteration):
        return self.snapshots / f"iter_{iteration}.pt"

    def pictures(self):
        """What the tools drew of this run here: heads.png, and heads-iter150.png of another checkpoint's weights."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if p.suffix == ".png" and
                      (p.stem in PICTURES or p.stem.split("-", 1)[0] in PICTURES))

    def kept_snapshots(self):
        """The iterations whose snapshot the folder holds, in order."""
        found = (SNAPSHOT.fullmatch(p.name) for p in self.snapshots.glob("iter_*.pt")) if self.snapshots.is_dir() \
            else ()
        return sorted(int(m.group(1)) for m in found if m)

    @contextmanager
    def locked(self, writer=True):
        """Hold out_dir for this process (the writer: rank 0) from before anything is written there until
        the run ends: a second run on it stops at once with one line, and a folder that cannot be written
        fails before any work. The OS releases the lock when the process ends, however it ends. Folders it made
        for out_dir go again where the run wrote nothing there (a run that failed at its start)."""
        if not writer:
            yield self
            return
        self.check_folder()
        made, folder = [], self.path.absolute()
        while not folder.exists() and not folder.is_symlink():
            made, folder = [*made, folder], folder.parent
        lock = self.path / "run.lock"
        with exclusive(lock, f"cannot write to out_dir {self.path}",
                       lambda holder: f"{self.path} is in use by another run{holder}; wait for it to end or pick "
                                      "another --out_dir", opener=no_links):
            try:
                yield self
            finally:
                # (a folder the block itself removed, as a benchmark clearing its run folder does, is gone already)
                if made and self.path.is_dir() and [p.name for p in self.path.iterdir()] == [lock.name]:
                    remove_unused(made, lock)

    def check_folder(self):
        """out_dir is a folder (or can become one), and each file a run writes there can be a file and be
        written."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"cannot use {self.path} as out_dir (a file of that name is in the way)")
        if self.path.is_symlink() and not self.path.exists():
            raise UserError(f"out_dir {self.path} is a link to {os.readlink(self.path)}, which is not there; make "
                            "that folder, or pick another --out_dir")
        saved = [self.latest, self.previous, self.best]
        in_place = [*(p.with_name(p.name + ".tmp") for p in saved), self.metrics, self.path / "run.lock"]
        for p in [*saved, *in_place]:
            if p.is_dir():
                raise UserError(f"{p} is a folder where the run writes a file; move it out of the way")
            if p.exists() and not p.is_file():  # read or written, a FIFO would wait for a writer forever
                raise UserError(f"{p} is {special_kind(p)} where the run writes a file; move it out of the way")
        if self.snapshots.is_symlink():  # a resume drops the snapshots past its step: another run's, through it
            raise UserError(f"{self.snapshots} is a link; a run keeps its snapshots in a folder of its own, never "
                            "written or removed through a link: remove it")
        if self.snapshots.exists() and not self.snapshots.is_dir():
            raise UserError(f"{self.snapshots} is a file where the run keeps its snapshots, a folder; move it out of "
                            "the way")
        if self.snapshots.is_dir() and not os.access(self.snapshots, os.W_OK | os.X_OK):
            raise UserError(f"cannot write to {self.snapshots}, where the run keeps its snapshots; make it writable "
                            "or pick another --out_dir")
        for p in [*saved, *in_place]:  # a rename would replace the user's link; the others would write through it
            if p.is_symlink():
                raise UserError(link_in_place(p))
        self.check_writable([*saved, *in_place])

    def check_writable(self, files):
        """A folder the first save could not write to would lose the work done before it: each save creates a
        .tmp file there and renames it over the file it replaces, and some files are written in place."""
        if self.path.is_dir() and not os.access(self.path, os.W_OK | os.X_OK):
            raise UserError(f"cannot write to out_dir {self.path} (a run saves its state there); make it "
                            "writable or pick another --out_dir")
        for p in files:  # not through a link: one at a saved file's name is replaced, never written through
            if p.exists() and not os.access(p, os.W_OK, follow_symlinks=False):
                raise UserError(f"cannot write {p}, which a run writes; make it writable or pick another --out_dir")

    def shown(self):
        """The checkpoint a page over runs shows: the one model_file reads (best.pt, or an earlier version's
        ckpt.pt), else latest.pt (a run that has not finished an evaluation yet); None when there is none. An error
        reading the folder other than 'not there' (no permission) is raised: the folder may hold a run."""
        for path in (self.best, self.legacy, self.latest):
            try:
                if stat.S_ISREG(path.stat().st_mode):
                    return path
            except (FileNotFoundError, NotADirectoryError):
                continue
        return None

    def clear_for_a_new_run(self, start_over, how, note, auto=False, move=True):
        """A new run here would replace another run's best.pt and append to its metrics.jsonl: refuse in one line
        that names that run's files and the ways on (how: what comes before the others); with start_over, move them
        into a folder beside them first, deleting nothing. auto (--init_from=auto, which continues a run or starts
        one): a run killed before it saved a state is moved aside so, with a note, as the same command run again
        after a kill -9 must start. move=False: the refusals alone, asked before the new run's start is checked,
        so that a start refused then leaves the old run where it was."""
        # snapshots and SAEs too: another run's weights, which a new run's would be mixed with or taken for
        found = [p for p in (self.latest, self.previous, self.best, self.legacy, self.metrics, self.snapshots,
                             self.path / "sae") if p.exists()]
        if not found:
            return
        if self.stopped_before_its_first_step(found):
            if not move:
                return
            held = "its records and snapshot" if self.snapshots.is_dir() else "its records"
            for path in (*self.snapshots.glob("iter_0.pt*"), self.metrics):
                path.unlink(missing_ok=True)
            if self.snapshots.is_dir():
                self.snapshots.rmdir()
            note(f"note: {self.path} holds a run stopped before its first step ({', '.join(p.name for p in found)}: "
                 f"{held} of iteration 0); it trained nothing, and a new run starts in its place")
            return
        if not start_over and self.metrics in found and set(found) <= {self.metrics, self.snapshots}:  # no save yet
            stopped = f"{self.path} holds a run stopped before it saved a state to continue from " \
                f"({', '.join(p.name for p in found)})"
            if not auto:
                raise UserError(f"{stopped}: start it anew with --start_over=True (its files are moved aside, not "
                                "deleted), or train elsewhere with another --out_dir")
            if move:
                note(f"note: {stopped}: --init_from=auto starts it anew")
            start_over = True
        if not start_over:
            raise UserError(f"{self.path} holds another run ({', '.join(p.name for p in found)}){how} train "
                            "elsewhere with another --out_dir, or start over with --start_over=True (its files are "
                            "moved aside, not deleted)")
        if not move:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside, again = self.path / f"replaced-{stamp}", 1
        while aside.exists():  # a second start over within the second
            again += 1
            aside = self.path / f"replaced-{stamp}-{again}"
        aside.mkdir()
        found += self.pictures()  # what the tools drew of the old run
        for p in found:
            p.rename(aside / p.name)
        note(f"note: starting over in {self.path}: the previous run's {', '.join(p.name for p in found)} moved to "
             f"{aside}")

    def stopped_before_its_first_step(self, found):
        """Whether found, the run files here, are only what a run writes before its first step (its records of
        iteration 0, the snapshot of iteration 0) and no state: a run stopped there (its line says no step was
        trained), which the same command started again must not be refused as another run."""
        if not set(found) <= {self.metrics, self.snapshots} or self.metrics.is_symlink() or \
                self.snapshots.is_symlink() or self.snapshots.exists() and not self.snapshots.is_dir():
            return False
        if self.snapshots.is_dir() and not {p.name for p in self.snapshots.iterdir()} <= {"iter_0.pt", "iter_0.pt.tmp"}:
            return False
        try:  # a line that is not a record a run wrote (parsed gives {}) is the user's to look at
            with open(self.metrics, encoding="utf-8") if self.metrics.exists() else nullcontext([]) as lines:
                return all(parsed(line).get("iter") == 0 for line in lines if line.strip())
        except (OSError, UnicodeDecodeError):
            return False

    def practised(self):
        """Whether the run here is rl.py's: its records hold a reward a step."""
        try:
            with open(self.metrics, "rb", opener=no_links) as f:
                return rl_run(parsed(line) for line in f)
        except (OSError, UserError):
            return False

    def is_at(self, path):
        """Whether path names this run's folder itself (a fine-tune's init_from that is its own out_dir)."""
        return os.path.isdir(path) and self.path.is_dir() and os.path.samefile(path, self.path)

    def resume_candidates(self):
        """The saved states a resume may start from, newest first: latest.pt, the one before it, and
        a checkpoint of an earlier version."""
        return [p for p in (self.latest, self.previous, self.legacy) if p.exists()]

    def model_file(self, which, option="checkpoint"):
        """The checkpoint sample.py, plot.py and export.py read: best.pt (or an earlier version's ckpt.pt),
        with which='latest' the latest state, with 'iter:N' the snapshot of iteration N; `option`, the tool's
        setting that chooses which (rl.py's init_checkpoint), is the one its hints name."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"out_dir {self.path} is a file, not a run folder")
        if which.startswith("iter:"):
            return self.snapshot_file(int(which[5:]), option)
        wanted = self.latest if which == "latest" else self.best
        if wanted.is_symlink() and not wanted.exists():  # else said as a run that has not written it yet
            other = f"; the run's latest state may still load: --{option}=latest" \
                if wanted == self.best and self.latest.exists() else ""
            raise UserError(f"{wanted} is a link to nowhere ({os.readlink(wanted)}): put its file back, or remove it"
                            f"{other}")
        found = next((p for p in (self.best, self.legacy) if p.exists()), None)
        if which == "latest":
            if self.latest.exists():
                return self.latest
            if found:
                raise UserError(f"no latest.pt in {self.path}, only {found.name}; leave out --{option}=latest "
                                f"to use {found.name}")
            raise UserError(f"no latest.pt in {self.path}; {self.train_first()}")
        if found:
            return found
        if self.latest.exists():
            raise UserError(f"no best.pt in {self.path} yet (the run has not finished an evaluation); "
                            f"use its latest state with --{option}=latest")
        raise UserError(f"no checkpoint in {self.path} (no best.pt or ckpt.pt); {self.train_first()}")

    def snapshot_file(self, iteration, option="checkpoint"):
        """The snapshot of iteration N, or one line: not kept (naming those kept), a link, or another step's or run's
        copied in (check_snapshot): each would pass other weights for this run's at that step. One that is no file
        at all (a FIFO) is refused where it is loaded."""
        kept = self.kept_snapshots()
        if iteration in kept:
            for path in (self.snapshots, self.snapshot(iteration)):
                if path.is_symlink():
                    raise UserError(f"{path} is a link; a run's snapshots are opened only as its own files, "
                                    "never through a link (another run's weights would pass for this one's): "
                                    "remove it")
            self.check_snapshot(iteration, model_header(self.snapshot(iteration), SNAPSHOT_KEYS))
            return self.snapshot(iteration)
        if not kept:
            how = "rl.py keeps none" if self.practised() else \
                "train it with --snapshots=N to keep the weights at N steps"
            raise UserError(f"{self.path} keeps no snapshots ({how}); use --{option}=best or latest")
        raise UserError(f"{self.path} keeps no snapshot of iteration {iteration}; it keeps "
                        f"{', '.join(f'iter:{i}' for i in kept)}")

    def check_snapshot(self, iteration, held):
        """One line where the snapshot of iteration N (held: its checkpoint, its weights read or not) was copied in
        from another step or run: the step it holds is another, or its model is of another shape than the run's own
        checkpoint's (best.pt, else latest.pt)."""
        own = self.shown()
        try:
            args = model_header(own)["model_args"] if own else held["model_args"]
        except UserError:  # the run's own checkpoint damaged: the step alone is compared
            args = held["model_args"]
        if held["iter_num"] != iteration or model_shape(held["model_args"]) != model_shape(args):
            raise UserError(f"{self.snapshot(iteration)} holds iteration {held['iter_num']} of a "
                            f"{shape_words(held['model_args'], args)} model, not this run's step {iteration} "
                            f"({shape_words(args, held['model_args'])}); remove it")

    def train_first(self):
        """The hint for a folder no run has saved a state in: a command with out_dir alone would train the
        bare defaults, and a folder that nothing was saved in does not say which config was meant."""
        return (f"train one first with `python train.py CONFIG --out_dir={self.path}`, CONFIG being the config "
                "file of the run you meant to train there (e.g. config/shakespeare_char.py)")


# plot.py's and analyze.py's, drawn into out_dir
PICTURES = ("loss", "attention", "heads", "patch", "timeline", "compare")
SNAPSHOT = re.compile(r"iter_([0-9]+)\.pt")
# [0-9], not \d: int() and \d take other scripts' digits too (iter:٥٠ would read snapshot 50)
CHECKPOINT_CHOICE = re.compile(r"best|latest|iter:[0-9]{1,12}")


def check_checkpoint(which, option="checkpoint"):
    """A --checkpoint value (or another option's, named): 'best', 'latest' or 'iter:N' (a snapshot), else
    ValueError in one line."""
    if not isinstance(which, str) or not CHECKPOINT_CHOICE.fullmatch(which):
        raise ValueError(f"{option} must be 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (the snapshot of "
                         f"iteration N), got {str(which)[:40]!r}")


def refuse_a_file(given, option, picker=None):
    """One line where a run's folder was named by a file (its best.pt, say): the folder to give instead, and the
    option (picker) that picks a checkpoint in it."""
    path = Path(given)
    if path.exists() and not path.is_dir():
        pick = f", and --{picker} to pick its checkpoint" if picker else ""
        # the folder the file is in, where a run is there (its best.pt named); another file's folder is no run
        folder = f" (--{option}={path.parent}{pick})" if RunDir(path.parent).resume_candidates() or \
            (path.parent / "best.pt").exists() else ""
        raise UserError(f"{option}={given!r} is a file, not a run's folder: give the folder train.py wrote{folder}")


def model_at(path, device="cpu", watched=False, required=MODEL_KEYS):
    """(the model in eval mode, its tokenizer, the checkpoint) of one checkpoint file: how every tool that reads a
    trained model (sample.py, plot.py, export.py, analyze.py, the API, the explorer) loads it. Where model.py has
    changed since the checkpoint was trained, one note on stderr names what changed: the model runs the code as
    it is now. watched: for a tool whose passes watch hooks, a note where they cannot run an edit
    (unwatched_edits); required: the fields it must hold (a snapshot's, SNAPSHOT_KEYS)."""
    ckpt = load_checkpoint(path, required=required)
    note = code_changed_note(ckpt, path)
    model, tok = model_from_checkpoint(ckpt, path), tokenizer_from_meta(ckpt["tokenizer"])
    if note:  # after the model is built: a model.py that cannot build it is its one line alone
        print(note, file=sys.stderr, flush=True)
    if watched and (note := unwatched_edits(model)):
        print(note, file=sys.stderr, flush=True)
    if tok.vocab_size > model.config.vocab_size:  # its tokens past the table would fail deep in the first pass
        raise UserError(f"{path} is damaged: its tokenizer has {tok.vocab_size:,} tokens, its model "
                        f"{model.config.vocab_size:,} token ids")
    return model.to(device).eval(), tok, ckpt


def code_changed_note(ckpt, path):
    """The note where model.py has changed since the checkpoint at path was trained, naming the pieces that changed
    (its model_code against the code now); None where none did or it keeps no model_code. model_at prints it; the
    explorer shows it on the run's card."""
    changed = changed_since(ckpt.get("model_code"))
    if not changed:
        return None
    return (f"note: model.py has changed since {path} was trained ({', '.join(changed[:4])}"
            f"{', ...' if len(changed) > 4 else ''}): the model runs the code as it is now, which may not be what it "
            "learned with")


def model_of(out_dir, which="best", device="cpu", watched=False, option="checkpoint"):
    """model_at of a run's checkpoint as `which` names it (model_file): a damaged best.pt, beside a latest.pt, is
    one line that names the tool's setting (`option`) that loads the run's latest state instead."""
    run = RunDir(out_dir)
    path = run.model_file(which, option)
    try:
        return model_at(path, device, watched)
    except UserError as e:
        if path == run.best and run.latest.is_file() and str(e).startswith(f"{path} is damaged"):
            raise UserError(f"{e}; the run's latest state may still load: --{option}=latest") from None
        raise


def load_model(out_dir, device, which="best", watched=False):
    """A trained model (in eval mode) and its tokenizer, from out_dir's best.pt or latest.pt alone."""
    model, tok, _ = model_of(out_dir, which, device, watched)
    return model, tok
