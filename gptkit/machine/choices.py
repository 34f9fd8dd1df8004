"""
A run's start-up choices, made before its model is built, from this machine's wisdom (gptkit.machine.wisdom): left to
'auto', a run on a CPU chooses

1. its precision: float32, or bfloat16 under autocast where the CPU has bf16 instructions and a step runs faster;
2. its attention path: SDPA's fused kernel, the softmax written out, or folded into one matmul
   (gptkit.machine.stand_ins);
3. its shape, where a preset lists the shapes it may train (fit_shapes): the largest that sees
   min_tokens_per_param tokens per parameter in max_time here. A shape the learner sets is what trains, with a
   note where it will see too few tokens.

Each is a fact of the machine, not of the moment: measured once per CPU, torch version and model shape (model.py's
code included: an edited model is a shape of its own), kept, and read by every later run, so that the same command on
the same machine gives the same model, idle or busy. A measurement taken while another program held a core
(gptkit.machine.idle) is kept too, marked busy: every run that starts while the machine is busy reads it, so that a
laptop that is never idle still gives two runs the same choices; the first start on an idle machine measures it
again, and its measurement replaces it. The whole step's idle time, the
optimizer's included, is what a time budget is planned from (gptkit.training.budget). The
speed kernels come by rule (gptkit.machine.stand_ins.by_rule), never by timing. Threads start on the count that
stepped faster when measured, and follow the load as the run goes (gptkit.machine.threads.ThreadTuner). A resumed
run takes what its checkpoint recorded, so that it continues exactly; what the command line names wins over both.

How a first measurement passes over a spike: the candidates take turns, round after round, and each keeps its
fastest round, so a passing spike, which slows a round or two, is passed over; a busy process slows every round of
every candidate alike.
"""

import functools
import math
import time
from dataclasses import dataclass, field, replace

import torch

from gptkit.machine.idle import IdleCheck, idle_now
from gptkit.machine.model_contract import check_forward
from gptkit.machine.precision import autocast_for, cpu_has_bf16, pick_dtype
from gptkit.machine.stand_ins import (ATTENTION_PATH_WORDS, ATTENTION_PATHS, TableDropout, attention_function,
                                      by_rule, gone_methods, install, path_for_edits)
from gptkit.machine.timing import fastest_in_turns
from gptkit.machine.wisdom import Wisdom, shape_key, today
from model import GPT, SelfAttention

BF16_MARGIN = 1.15  # bfloat16 must step this much faster
TURNS = 5  # a first measurement's rounds: a spike in one or two is passed over
MEASURE_SHARE = 0.04  # of max_time, the most a first measurement may take (start-up is to stay under 5%)
MEASURE_SECONDS = 20.0  # the most it may take without a max_time


@dataclass
class Choices:
    """What the run chose; a checkpoint keeps it (as its 'measured', all but what it said), and a resume takes it."""
    dtype: str
    attention_path: str
    kernels: list
    threads: int = 0  # 0: not the run's to choose (a GPU, several processes, or --threads given)
    most_threads: int = 0  # the most it could take: torch's own count
    fitted_from: dict = None  # the configured settings a smaller shape replaced
    step_seconds: float = None  # the model's forward and backward on this machine, where it was measured
    whole_seconds: float = None  # a whole step, the optimizer's update included, idle on this machine
    forward_seconds: float = None  # a forward alone (an evaluation's batch), idle on this machine
    planned: dict = None  # a budget planned in steps (gptkit.training.budget.plan_steps): kept for a resume
    measuring_seconds: float = 0.0  # what measuring this machine took this run (once: later runs read the wisdom)
    lines: list = field(default_factory=list)  # what to tell the learner
    details: list = field(default_factory=list)  # what to tell with --verbose too: the machinery

    def saved(self):
        kept = {"dtype": self.dtype, "attention_path": self.attention_path, "kernels": self.kernels}
        return kept | ({"threads": self.threads} if self.threads else {}) | (
            {"fitted_from": self.fitted_from} if self.fitted_from else {}) | (
            {"planned": self.planned} if self.planned else {})


def choose(cfg, rt, planned, saved=None, asked=frozenset(), started=None, update_for=None):
    """(cfg, planned, Choices) before the model is built: `planned` is the GPTConfig the config and data make
    (None where unknown before its weights load), and comes back as the shape to build (a preset's fitted one);
    `saved` a resumed run's recorded choices, `asked` the keys the command line gave, `started` when the run's
    clock started, `update_for(model)` a function taking one optimizer step of that model after its backward (a
    whole step is timed with it). Rank 0 reads or measures; every process takes its choices."""
    if rt.master:
        rule = pick_dtype(cfg.dtype, rt.device)  # as asked, or the device's own: the precision before any measuring
        decided = (cfg, planned, resumed_choices(cfg, rt, saved, rule, asked)) if saved else \
            fresh_choices(cfg, rt, planned, asked, started, rule, update_for)
    cfg, planned, choices = rt.broadcast(decided if rt.master else None)
    if choices.threads:
        torch.set_num_threads(choices.threads)
    rt.set_dtype(choices.dtype)
    return cfg, planned, choices


def on_speed_path(model, choices):
    """Install the chosen kernels and attention path on the built model; each that steps aside for an edited
    piece of model.py is said, and the path taken is the one recorded."""
    taken, aside = install(model, choices.kernels, choices.attention_path)
    # the learner's own attention modules in SelfAttention's place (the notes' MultiHeadAttention), which no path
    # stands in for
    own = sorted({type(block.attn).__name__ for block in model.transformer.h
                  if not isinstance(block.attn, SelfAttention)})
    gone = any(isinstance(block.attn, SelfAttention) and gone_methods(block.attn) for block in model.transformer.h)
    if taken != choices.attention_path or own or gone:  # an edit decided it: its line replaces the asked path's
        asked = f"attention: the {choices.attention_path} path ("
        choices.lines = [line for line in choices.lines if not line.startswith(asked)]
    choices.attention_path = taken
    choices.lines.extend(aside)
    if own:
        choices.lines.append(f"attention: model.py's own {' and '.join(own)} runs as written (the tools' attention "
                             "paths stand in for SelfAttention alone)")
    return model


def start_threads(rt, cfg, choices):
    """On a CPU, in one process, with threads left to the run: every core torch would use, from the first step; the
    ThreadTuner moves to one where another program holds a core."""
    if rt.device == "cpu" and not rt.distributed and not cfg.threads and torch.get_num_threads() > 1:
        choices.threads = choices.most_threads = torch.get_num_threads()


def resumed_choices(cfg, rt, saved, rule, asked=frozenset()):
    """A resumed run's choices as it saved them (what the command line names instead, as it says); nothing timed."""
    dtype = rule if cfg.dtype != "auto" else saved.get("dtype", rule)
    path = cfg.attention_path if cfg.attention_path != "auto" else saved.get("attention_path", "fused")
    # a run saved on a CPU and continued on a GPU leaves out the kernels a GPU does not take (the CPU's dropout table)
    allowed = by_rule(rt.device)
    kernels = [k for k in saved.get("kernels", allowed) if k in allowed]
    choices = Choices(dtype, path, kernels, fitted_from=saved.get("fitted_from"), planned=saved.get("planned"))
    start_threads(rt, cfg, choices)
    if choices.threads and saved.get("threads"):
        choices.threads = min(saved["threads"], choices.most_threads)
    choices.details.append(f"precision: {dtype}, attention: the {path} path, as the run chose them")
    if "retime" in asked:
        choices.lines.append("note: --retime measures a new run's choices; a resumed run continues with those it "
                             "saved (its precision, attention path and steps), so that it continues exactly")
    return choices


def fresh_choices(cfg, rt, planned, asked, started, rule, update_for=None):
    """Rank 0's choices for a run from scratch or from pretrained weights: read from this machine's wisdom, or
    measured once and kept (see the module's docstring)."""
    choices = Choices(rule, cfg.attention_path, by_rule(rt.device))
    start_threads(rt, cfg, choices)
    if planned is None:  # pretrained weights of a shape known once they load: the rules, nothing measured
        choices.attention_path = "fused" if cfg.attention_path == "auto" else cfg.attention_path
        return cfg, planned, choices
    speed = Speed(cfg, rt, choices, started)
    precisions = dtypes(cfg, rt, rule)
    entry = speed.of(planned, precisions)
    pick_precision(cfg, precisions, entry, choices)
    short = []
    if fits(cfg, asked):
        cfg, planned, entry, short = fit_shape(cfg, planned, entry, speed, choices)
    if update_for is not None and cfg.max_time > 0:  # what a budget in steps is planned from
        entry = speed.whole(planned, choices.dtype, update_for)
        choices.whole_seconds = entry[choices.dtype]["whole"]
        choices.forward_seconds = entry[choices.dtype]["forward"]
    choices.attention_path = entry[choices.dtype]["path"]
    choices.step_seconds = entry[choices.dtype]["step"]
    if choices.threads:  # the count that stepped faster here, idle: the ThreadTuner follows the load from it
        choices.threads = entry[choices.dtype].get("threads", choices.threads)
    say_path(cfg, rt, planned, entry, choices)
    say_model(cfg, rt, planned, entry, choices, short)
    choices.lines = speed.wisdom.notes + speed.notes() + choices.lines
    choices.measuring_seconds = speed.measured
    return cfg, planned, choices


def dtypes(cfg, rt, rule):
    """The precisions to know the speed of: both, where 'auto' on a CPU with bf16 instructions has a choice."""
    if cfg.dtype == "auto" and rt.device == "cpu" and cpu_has_bf16():
        return ["float32", "bfloat16"]
    return [rule]


def pick_precision(cfg, precisions, entry, choices):
    """bfloat16 where the model's own step runs faster in it than in float32 by BF16_MARGIN; said with where the
    figure came from."""
    if len(precisions) == 1:  # as asked, or the device's rule
        choices.details.append(f"precision: {choices.dtype} ({'as asked' if cfg.dtype != 'auto' else 'the rule'})")
        return
    speedup = entry["float32"]["step"] / entry["bfloat16"]["step"]
    choices.dtype = "bfloat16" if speedup > BF16_MARGIN else "float32"
    enough = "" if choices.dtype == "bfloat16" else ", not enough to pay for it"
    choices.lines.append(f"precision: {choices.dtype} ({measured_when(entry)}: a step in bfloat16 ran "
                         f"{speedup:.2f}x as fast as in float32{enough})")


def say_path(cfg, rt, planned, entry, choices):
    """The attention path's line, where the model's attention has paths to choose from; its step time for
    --verbose."""
    step = choices.step_seconds
    choices.details.append(f"step: {step * 1e3:.1f} ms forward and backward in {choices.dtype} "
                           f"({measured_when(entry)})")
    if rt.device != "cpu" or planned.attention not in ("scaled", "dot") or planned.n_layer == 0:
        return
    # an edited attention is timed on the paths that run the edit alone: 'of those that run model.py as it is'
    why = "as asked" if cfg.attention_path != "auto" else f"{measured_when(entry)}: the fastest in " \
        f"{choices.dtype} of the paths that run model.py as it is"
    path = choices.attention_path
    choices.lines.append(f"attention: the {path} path ({ATTENTION_PATH_WORDS[path]}; {why})")


def measured_when(entry):
    return "measured now on this CPU" if entry.get("now") else f"measured on this CPU on {entry['measured']}"


class Speed:
    """Each precision's attention path and step time for a model shape on this machine: from its wisdom, or
    measured (within what the run's budget allows for start-up) and kept, marked busy where it was not taken idle."""

    def __init__(self, cfg, rt, choices, started):
        self.cfg, self.rt, self.choices = cfg, rt, choices
        self.wisdom = Wisdom(rt.device, torch.get_num_threads())
        self.allowed = MEASURE_SHARE * cfg.max_time if cfg.max_time > 0 else MEASURE_SECONDS
        self.began = time.perf_counter() - (time.time() - (started or time.time()))
        self.deadline = self.began + self.allowed
        self.said, self.measured, self.busy, self.busy_read, self.replaced = False, 0.0, 0.0, None, None
        self.entries = {}  # this run's, by key
        self.idle_now = None  # whether the machine was idle when machine_idle() first looked

    def key(self, planned):
        asked = [f"attention_path={self.cfg.attention_path}"] * (self.cfg.attention_path != "auto") + \
            [f"threads={self.cfg.threads}"] * bool(self.cfg.threads)
        return shape_key(planned, self.cfg.batch_size, self.choices.kernels, self.cfg.compile, asked)

    def read(self, key):
        if key in self.entries:
            return dict(self.entries[key])
        entry = {} if self.cfg.retime else self.wisdom.entry(key)
        if "busy" in entry:  # measured beside another program: read while the machine is busy, measured again idle
            if self.machine_idle():
                self.replaced = entry
                return {}
            self.busy_read = entry
        return entry

    def machine_idle(self):
        if self.idle_now is None:
            self.idle_now = idle_now()
        return self.idle_now

    def of(self, planned, precisions):
        """{dtype: {"path", "step", "threads"}, "params", "measured": date} for the planned model, with at least
        each of `precisions` (those this machine's wisdom lacks measured now, and kept with the rest)."""
        key = self.key(planned)
        entry = self.read(key)
        missing = [d for d in precisions if not isinstance(entry.get(d), dict) or "step" not in entry[d]]
        missing = missing or ([] if "params" in entry else list(precisions))
        if missing:
            self.announce(missing)
            with self.timed() as check:
                entry.update(measure(planned, self.cfg, self.rt, self.choices.kernels, missing, self.deadline))
            self.keep(key, entry, check)
        return entry

    def whole(self, planned, dtype, update_for):
        """The entry of `planned` with a whole training step's and a forward's idle seconds in `dtype` (what a
        budget in steps is planned from), measured where the wisdom lacks them."""
        key = self.key(planned)
        entry = self.read(key)
        if "whole" not in entry[dtype] or "forward" not in entry[dtype]:
            self.announce([dtype])
            with self.timed() as check:
                entry[dtype] = entry[dtype] | measure_whole(planned, self.cfg, self.rt, self.choices.kernels,
                                                            dtype, entry[dtype], update_for)
            self.keep(key, entry, check)
        return entry

    def announce(self, missing):
        if not self.said:  # at once: the measuring takes seconds
            self.said = True
            print(f"measuring this machine once for this model ({', '.join(missing)}): later runs read it from "
                  f"{self.wisdom.path} (--retime measures again)", flush=True)

    def timed(self):
        speed = self

        class Timed(IdleCheck):
            def __exit__(self, *exc):
                speed.measured += time.perf_counter() - self.start[0]
                return super().__exit__(*exc)

        return Timed()

    def keep(self, key, entry, check):
        """Keep a measurement in the wisdom, marked busy (the cores other programs held) where it was not taken
        idle, or added to an entry that was."""
        entry["measured"] = today()
        if not check.idle:
            self.busy = max(self.busy, check.others)
            entry["busy"] = round(max(entry.get("busy", 0.0), check.others), 2)
        self.entries[key] = dict(entry)
        self.wisdom.keep(key, entry)
        entry["now"] = True

    def notes(self):
        """What the measuring leaves to say: that it was taken beside another program, or ran past its share of
        the budget."""
        lines = []
        if self.busy:
            lines.append(f"note: other programs held about {self.busy:.1f} of this machine's cores while it measured: "
                         "runs that start while the machine is busy read this measurement, so that they choose "
                         "alike, and the first start on an idle machine measures again")
        elif self.replaced:
            lines.append(f"note: this model's choices were measured on {self.replaced['measured']} while other "
                         "programs held some of this machine's cores; measured again now, idle, and kept: runs that "
                         "read the busy measurement may have chosen otherwise")
        elif self.busy_read:
            lines.append(f"note: this model's choices were measured on {self.busy_read['measured']} while other "
                         f"programs held about {self.busy_read['busy']:.1f} of this machine's cores: read again, as "
                         "the machine is busy now, so that runs choose alike; the first start on an idle machine "
                         "measures again")
        if self.measured > self.allowed + 0.5:
            share = f"{MEASURE_SHARE:.0%} of max_time" if self.cfg.max_time > 0 else "what it may take"
            lines.append(f"note: measuring took {self.measured:.1f} s, {self.measured - self.allowed:.1f} s more than "
                         f"the {self.allowed:.1f} s ({share}) start-up may spend on it: this run ends that much later")
        return lines


def measure(planned, cfg, rt, kernels, precisions, deadline):
    """{"params": its parameters, dtype: {"path": the fastest attention path in it, "step": its forward and
    backward's seconds on the faster of one thread and every thread, "threads": that count}}, timed on a model of the
    planned shape with the run's kernels, the candidates taking turns; the generators and threads left as they were."""
    most = torch.get_num_threads()
    counts = [1, most] if rt.device == "cpu" and not rt.distributed and not cfg.threads and most > 1 else [most]
    with torch.random.fork_rng(devices=[]):
        model = GPT(planned).to(rt.device)
        check_forward(model)
        install(model, kernels)
        paths = {dtype: attention_path_for(model, cfg.batch_size, dtype, rt.device, deadline)
                 if cfg.attention_path == "auto" else cfg.attention_path for dtype in precisions}
        runs = {(dtype, n): on_threads(n, training_step(model, cfg.batch_size, dtype, paths[dtype]))
                for dtype in precisions for n in counts}
        try:
            seconds = fastest_in_turns(runs, TURNS, rt.device, deadline=deadline)
        finally:
            torch.set_num_threads(most)
    speeds = {"params": model.num_params()}
    for dtype in precisions:
        step, threads = min((seconds[dtype, n], n) for n in counts)
        speeds[dtype] = {"path": paths[dtype], "step": step, "threads": threads}
    return speeds


def measure_whole(planned, cfg, rt, kernels, dtype, speeds, update_for):
    """{"whole": a training step's seconds, its optimizer's update included, "forward": a forward's alone, in eval
    mode and without gradients, as an evaluation runs it}, on the thread count and attention path `speeds` chose.
    Every turn is taken, whatever start-up's deadline says: a run's steps are planned from these (a second)."""
    most = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        model = GPT(planned).to(rt.device)
        install(model, kernels)
        step = training_step(model, cfg.batch_size, dtype, speeds["path"], update_for(model, dtype))
        forward = forward_pass(model, cfg.batch_size, dtype, speeds["path"])
        runs = {"whole": on_threads(speeds.get("threads", most), step),
                "forward": on_threads(speeds.get("threads", most), forward)}
        try:
            return fastest_in_turns(runs, TURNS, rt.device)
        finally:
            torch.set_num_threads(most)


def on_threads(threads, step):
    def run():
        torch.set_num_threads(threads)
        step()
    return run


def attention_path_for(model, batch_size, dtype, device, deadline=None):
    """The fastest attention path on this CPU for scaled or dot attention in dtype, each timed on one layer's
    forward and backward at the training shape ('fused' elsewhere, and where the model's kind has no other); SDPA
    only where it can take the model's dropout, and only the paths that run the learner's model.py as written."""
    c = model.config
    if device != "cpu" or c.attention not in ("scaled", "dot") or c.n_layer == 0:
        return "fused"
    attn = model.transformer.h[0].attn
    # a module of the learner's own (a Head per head, say), or a SelfAttention without the methods the paths call
    # (note 003's class in its place): no path is set
    if not isinstance(attn, SelfAttention) or gone_methods(attn):
        return "fused"
    paths = ATTENTION_PATHS[1:] if isinstance(attn.attn_dropout, TableDropout) else ATTENTION_PATHS
    paths = [p for p in paths if path_for_edits(attn, p)[0] == p]
    if len(paths) == 1:
        return paths[0]
    q, k, v = (torch.randn(batch_size, c.n_head, c.block_size, c.n_embd // c.n_head, requires_grad=True)
               for _ in range(3))

    def forward_backward(path):
        with autocast_for(dtype):
            y = attention_function(attn, path)(q, k, v)
        y.float().sum().backward()

    seconds = fastest_in_turns({path: functools.partial(forward_backward, path) for path in paths}, TURNS,
                               deadline=deadline)
    return min(seconds, key=seconds.get)


def training_step(model, batch_size, dtype, path, update=None):
    """The model's forward and backward at the training shape in dtype, on attention path `path`, as a function,
    on fixed tokens; then update() (an optimizer's step) where given."""
    c = model.config
    device = next(model.parameters()).device
    x = torch.randint(c.vocab_size, (batch_size, c.block_size), generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        install(model, [], path)
        with autocast_for(dtype, device.type):
            loss = model(x, x)[1]
        loss.backward()
        if update is not None:
            update()
        model.zero_grad(set_to_none=True)

    return step


def forward_pass(model, batch_size, dtype, path):
    """An evaluation's forward of one batch, as a function, on fixed tokens."""
    c = model.config
    device = next(model.parameters()).device
    x = torch.randint(c.vocab_size, (batch_size, c.block_size), generator=torch.Generator().manual_seed(1)).to(device)

    @torch.no_grad()
    def forward():
        install(model, [], path)
        model.eval()
        with autocast_for(dtype, device.type):
            model(x, x)
        model.train()

    return forward


def fits(cfg, asked):
    """Whether this run's shape is the preset's to adapt: a fresh run with a budget and a threshold, whose shape is
    the first its fit_shapes lists, and not one the command line gave."""
    shapes = cfg.fit_shape_list()
    return bool(shapes) and cfg.min_tokens_per_param > 0 and cfg.max_time > 0 and cfg.init_from == "scratch" and \
        (cfg.model.n_layer, cfg.model.n_embd) == shapes[0] and not {"n_layer", "n_embd"} & set(asked)


def fit_shape(cfg, planned, entry, speed, choices):
    """(cfg, planned, entry, what each bigger shape would see) of the largest of the preset's shapes that sees
    min_tokens_per_param tokens per parameter in max_time here (the last one, where none does), in the chosen
    precision."""
    seen = tokens_per_parameter(cfg, speed.rt, planned, entry, choices.dtype)
    first, short = (planned.n_layer, planned.n_embd), []
    for n_layer, n_embd in cfg.fit_shape_list()[1:]:
        if seen >= cfg.min_tokens_per_param:
            break
        short.append(f"{shape_words(planned)} would see {tenths(seen)}")
        planned = replace(planned, n_layer=n_layer, n_embd=n_embd)
        entry = speed.of(planned, [choices.dtype])
        seen = tokens_per_parameter(cfg, speed.rt, planned, entry, choices.dtype)
    if (planned.n_layer, planned.n_embd) == first:
        return cfg, planned, entry, []
    choices.fitted_from = {"n_layer": first[0], "n_embd": first[1]}
    cfg = replace(cfg, model=replace(cfg.model, n_layer=planned.n_layer, n_embd=planned.n_embd))
    decay = cfg.smaller_muon_weight_decay
    if decay >= 0 and decay != cfg.muon_weight_decay:  # the decay tuned for the smaller shapes goes with them
        choices.fitted_from["muon_weight_decay"] = cfg.muon_weight_decay
        cfg = replace(cfg, muon_weight_decay=decay)
    return cfg, planned, entry, short


def tokens_per_parameter(cfg, rt, planned, entry, dtype):
    """Tokens each of the model's parameters would see in max_time at its step in dtype (entry: its speed on this
    machine), every process stepping side by side."""
    return cfg.max_time * rt.world * cfg.batch_size * planned.block_size / entry[dtype]["step"] / entry["params"]


def say_model(cfg, rt, planned, entry, choices, short=()):
    """The model's line; where the learner's own shape will see too few tokens per parameter, a note saying so and
    what to do."""
    n = entry["params"]
    line = f"model: {shape_words(planned)}, {n / 1e6:.2f}M parameters"
    if choices.fitted_from:
        first = choices.fitted_from
        decay = f", muon_weight_decay={cfg.muon_weight_decay:g}" if "muon_weight_decay" in first else ""
        seen = tokens_per_parameter(cfg, rt, planned, entry, choices.dtype)
        which = "the largest of this preset's fit_shapes" if seen >= cfg.min_tokens_per_param else \
            "none of this preset's fit_shapes sees enough here, so the smallest of them"
        line += (f"{decay}: {which} ({cfg.fit_shapes}); min_tokens_per_param={cfg.min_tokens_per_param:g} tokens "
                 f"per parameter in the {cfg.max_time:g} s here, and this one sees about {tenths(seen)} "
                 f"({'; '.join(short)}; --n_layer={first['n_layer']} --n_embd={first['n_embd']} trains that)")
    choices.lines.append(line)
    if cfg.init_from == "scratch" and cfg.min_tokens_per_param > 0 and cfg.max_time > 0 and not choices.fitted_from:
        seen = tokens_per_parameter(cfg, rt, planned, entry, choices.dtype)
        if seen < cfg.min_tokens_per_param:
            choices.lines.append(f"note: in the {cfg.max_time:g} s here this model sees about {tenths(seen)} tokens "
                                 f"per parameter, fewer than min_tokens_per_param={cfg.min_tokens_per_param:g}: it "
                                 "trains as asked, but will end undertrained (give it more --max_time, or a "
                                 "smaller --n_layer or --n_embd)")
    c = planned
    embeddings = c.vocab_size * c.n_embd * (1 if c.tie_weights else 2)
    if rt.device == "cpu" and c.vocab_size > 1024 and embeddings > n / 2:
        choices.lines.append(f"note: {embeddings / 1e6:.1f}M of its {n / 1e6:.1f}M parameters are the embeddings "
                             f"of a {c.vocab_size:,}-token vocabulary, slow to train on a CPU; the same text prepared "
                             "by characters, or by a BPE of 512 tokens trained on it, trains far more steps")


def shape_words(planned):
    """'4 layers × 128', of a model's config."""
    return f"{planned.n_layer} layer{'s' if planned.n_layer != 1 else ''} × {planned.n_embd}"


def tenths(tokens_per_param):
    """Rounded down, so that 5.96 reads 5.9, not 6.0, beside 'fewer than min_tokens_per_param=6'."""
    return f"{math.floor(tokens_per_param * 10) / 10:.1f}"
