"""
A run's start-up choices, made in one pass before its first step: measure this machine on the model, decide,
build, report. Left to 'auto', a run on a CPU chooses

1. its threads: one, or every core torch would use;
2. its precision: float32, or bfloat16 under autocast where the CPU has bf16 instructions;
3. its attention path: SDPA's fused kernel, the softmax written out, or folded into one matmul (gptkit.kernels);
4. its shape: the model as configured, or a smaller one where this machine steps too slowly for the configured
   one to see min_tokens_per_param tokens per parameter in max_time.

The speed kernels come by rule (gptkit.kernels.by_rule), never by timing. A resumed run takes what its checkpoint
recorded, so that it continues exactly; what the command line names wins over both.

Why a busy machine does not change the choices. Candidates are timed in the same moments: they take turns, round
after round, and each keeps its fastest round, so a passing spike, which slows a round or two, is passed over. A
process that runs the whole time slows every round alike, but for one thing: a step on several threads waits at
every operation for its slowest thread, and a thread sharing a core with a busy process is slow every round. So
the threads are chosen first: beside a busy process, one thread wins every round by far, and everything after is
timed on the threads the run will use, which have a core to themselves, as they would on an idle machine. And the
shape cannot invert: a smaller model's figure is the bigger one's scaled by their steps timed in the same moments,
never below what its share of the bigger one's parameters already guarantees.
"""

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from gptkit.kernels import ATTENTION_PATHS, TableDropout, attention_function, by_rule, install, set_attention_path
from gptkit.timing import autocast_for, cpu_has_bf16, fastest_in_turns, matmul_peak, pick_dtype

# two layers are the fewest in which attention can read what attention wrote (an induction head takes two)
FEWEST_FITTED_LAYERS = 2
THREADS_MARGIN = 1.15  # more threads than one must step this much faster: each op waits for every thread
BF16_MARGIN = 1.15  # bfloat16 must step this much faster
DOUBT = 1.3  # a speed-up within this factor of its margin either way is timed a third turn


@dataclass
class Choices:
    """What the run chose; a checkpoint keeps it (as its 'measured', all but what it said), and a resume takes it."""
    dtype: str
    attention_path: str
    kernels: list
    threads: int = 0  # 0: not the run's to choose (a GPU, several processes, or --threads given)
    most_threads: int = 0  # the most it could take: torch's own count
    fitted_from: dict = None  # the configured settings a smaller model replaced
    step_seconds: float = None  # the chosen model's step as timed here, where it was
    lines: list = field(default_factory=list)  # what to tell the learner
    details: list = field(default_factory=list)  # what to tell with --verbose too: the machinery

    def saved(self):
        kept = {"dtype": self.dtype, "attention_path": self.attention_path, "kernels": self.kernels}
        return kept | ({"threads": self.threads} if self.threads else {}) | (
            {"fitted_from": self.fitted_from} if self.fitted_from else {})


def choose(cfg, rt, model, saved, build):
    """(cfg, model, Choices) for the run: the model on its speed path (kernels, threads, precision, attention path),
    or a smaller one built by build(cfg) where the configured one would see too few tokens per parameter. `saved`:
    a resumed run's recorded choices. Rank 0 measures, every process takes its choices."""
    kernels = saved.get("kernels", by_rule(rt.device))  # a checkpoint from before kernels were recorded ran these
    install(model, kernels)
    choices = rt.broadcast(measure_and_decide(cfg, rt, model, saved, kernels) if rt.master else None)
    if choices.threads:
        torch.set_num_threads(choices.threads)
    rt.set_dtype(choices.dtype)
    set_attention_path(model, choices.attention_path)
    cfg, model = fitted(cfg, rt, model, saved, choices, build)
    return cfg, model, choices


def measure_and_decide(cfg, rt, model, saved, kernels):
    """Rank 0's choices of threads, precision and attention path, in that order, each timed on what came before;
    a resumed run's as it saved them, and what the command line names as it says."""
    choices = Choices(saved.get("dtype", pick_dtype(cfg.dtype, rt.device)) if cfg.dtype == "auto" else
                      pick_dtype(cfg.dtype, rt.device),
                      saved.get("attention_path", "fused") if cfg.attention_path == "auto" else cfg.attention_path,
                      kernels)
    fresh = "dtype" not in saved
    if rt.device == "cpu" and not rt.distributed and not cfg.threads and torch.get_num_threads() > 1:
        choices.most_threads = torch.get_num_threads()
        choices.threads = saved.get("threads", 0) or choices.most_threads
        if fresh:
            choices.threads = pick_threads(model, cfg.batch_size, choices)  # in the precision known so far
        torch.set_num_threads(choices.threads)
    if fresh and cfg.dtype == "auto" and rt.device == "cpu" and cpu_has_bf16():
        pick_precision(cfg, model, choices)
    elif fresh and cfg.attention_path == "auto":
        choices.attention_path = attention_path_for(model, cfg.batch_size, choices.dtype, rt.device, choices)
    return choices


def pick_threads(model, batch_size, choices):
    """1 or every thread torch would use, whichever steps the model (forward and backward, in choices.dtype) faster,
    by THREADS_MARGIN for more than one. Said where it is fewer than every thread, else only with --verbose."""
    most, step = torch.get_num_threads(), training_step(model, batch_size, choices.dtype, None)

    def step_on(threads):
        torch.set_num_threads(threads)
        step()

    with quiet(model):
        seconds = fastest_in_turns({1: lambda: step_on(1), most: lambda: step_on(most)}, 3,
                                   settled=lambda best: far_from(best[1] / best[most], THREADS_MARGIN))
    speedup = seconds[1] / seconds[most]
    choices.step_seconds = seconds[most] if speedup > THREADS_MARGIN else seconds[1]
    if speedup > THREADS_MARGIN:
        choices.details.append(f"threads: {most} ({most} threads stepped {speedup:.2f}x as fast as 1 here)")
        return most
    choices.lines.append(f"threads: 1 of {most} (a step on {most} took {1 / speedup:.2f}x as long as on 1 here: "
                         "another program may be busy, or the model is too small to share its work)")
    return 1


def far_from(speedup, margin):
    """Whether a speed-up timed so far is far enough from its margin, either way, that another turn cannot move it
    across: the timings of a choice stop there."""
    return not margin / DOUBT <= speedup <= margin * DOUBT


def pick_precision(cfg, model, choices):
    """bfloat16 where the model's own step runs faster in it than in float32 by BF16_MARGIN, each precision
    timed on the attention path fastest in it (a step timed on another would misjudge the precision); else
    float32. A matmul that runs slower in bf16 settles it without timing steps."""
    matmuls = matmul_peak("bfloat16", "cpu", 768, 3) / matmul_peak("float32", "cpu", 768, 3)
    if matmuls < 1:
        choices.dtype = "float32"
        choices.lines.append(f"precision: float32 (bfloat16 matmuls ran at {matmuls:.2f}x the float32 speed here)")
        if cfg.attention_path == "auto":
            choices.attention_path = attention_path_for(model, cfg.batch_size, "float32", "cpu", choices)
        return
    paths = {dtype: attention_path_for(model, cfg.batch_size, dtype, "cpu") if cfg.attention_path == "auto" else
             cfg.attention_path for dtype in ("float32", "bfloat16")}

    with quiet(model):
        runs = {dtype: training_step(model, cfg.batch_size, dtype, path) for dtype, path in paths.items()}
        seconds = fastest_in_turns(runs, 2, slow=0.25,
                                   settled=lambda best: far_from(best["float32"] / best["bfloat16"], BF16_MARGIN))
    speedup = seconds["float32"] / seconds["bfloat16"]
    choices.dtype = "bfloat16" if speedup > BF16_MARGIN else "float32"
    choices.attention_path, choices.step_seconds = paths[choices.dtype], seconds[choices.dtype]
    choices.lines.append(f"precision: {choices.dtype} (a training step ran {speedup:.2f}x as fast in bfloat16 as "
                         f"in float32 here{'' if choices.dtype == 'bfloat16' else ', not enough to pay for it'})")
    choices.details.append(f"attention: the {choices.attention_path} path in {choices.dtype}")


def attention_path_for(model, batch_size, dtype, device, choices=None):
    """The fastest attention path on this CPU for scaled or dot attention in dtype, each timed on one layer's
    forward and backward at the training shape ('fused' elsewhere, and where the model's kind has no other); SDPA
    only where it can take the model's dropout. With `choices`, the times go to its details."""
    c = model.config
    if device != "cpu" or c.attention not in ("scaled", "dot") or c.n_layer == 0:
        return "fused"
    attn = model.transformer.h[0].attn
    paths = ATTENTION_PATHS[1:] if isinstance(attn.attn_dropout, TableDropout) else ATTENTION_PATHS
    q, k, v = (torch.randn(batch_size, c.n_head, c.block_size, c.n_embd // c.n_head, requires_grad=True)
               for _ in range(3))

    def forward_backward(path):
        with autocast_for(dtype):
            y = attention_function(attn, path)(q, k, v)
        y.float().sum().backward()

    seconds = fastest_in_turns({path: functools.partial(forward_backward, path) for path in paths}, 3)
    best = min(seconds, key=seconds.get)
    if choices is not None:
        times = ", ".join(f"{path} {s * 1e3:.1f} ms" for path, s in seconds.items())
        choices.details.append(f"attention: the {best} path ({times} per layer, forward and backward)")
    return best


def training_step(model, batch_size, dtype, path):
    """The model's forward and backward at the training shape in dtype, on attention path `path` (None: its own),
    as a function, on fixed tokens."""
    c = model.config
    device = next(model.parameters()).device
    x = torch.randint(c.vocab_size, (batch_size, c.block_size), generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        if path:
            set_attention_path(model, path)
        with autocast_for(dtype, device.type):
            loss = model(x, x)[1]
        loss.backward()

    return step


@contextmanager
def quiet(model):
    """Around timings of a model's steps: its gradients, attention path and the random generators left as they
    were, so that a run's data order and dropout masks do not depend on what was timed."""
    paths = [block.attn.attend for block in model.transformer.h]
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        model.zero_grad(set_to_none=True)
        for block, attend in zip(model.transformer.h, paths):
            block.attn.attend = attend


def step_seconds(model, batch_size, dtype, others=()):
    """The fastest of three timings of the model's step (and of each model in `others`, taking turns with it)."""
    models = [model, *others]
    with quiet(model):
        runs = {i: training_step(m, batch_size, dtype, None) for i, m in enumerate(models)}
        seconds = fastest_in_turns(runs, 3)
    for m in others:
        m.zero_grad(set_to_none=True)
    return [seconds[i] for i in range(len(models))]


def fitted(cfg, rt, model, saved, choices, build):
    """(cfg, model): as configured, or for a fresh run with min_tokens_per_param and a max_time, where the configured
    model would see fewer tokens per parameter than that in max_time here, the smaller model
    (TrainConfig.smaller_shape, with smaller_muon_weight_decay if set), and where that too would, one layer fewer at
    a time down to FEWEST_FITTED_LAYERS; built as a run configured with that shape would build it, on the same
    speed path. A resumed run keeps the shape it was trained at."""
    choices.fitted_from = saved.get("fitted_from")
    shape = cfg.smaller_shape()
    if not (cfg.min_tokens_per_param > 0 and cfg.max_time > 0 and cfg.init_from == "scratch" and shape):
        say_model(cfg, rt, model, choices)
        return cfg, model
    seen = rt.broadcast(tokens_per_parameter(cfg, rt, model, choices.step_seconds) if rt.master else None)
    configured = {"n_layer": model.config.n_layer, "n_embd": model.config.n_embd}
    if seen >= cfg.min_tokens_per_param:
        say_model(cfg, rt, model, choices, seen)
        return cfg, model
    smaller, short = dict(shape), []
    fitted_cfg = replace(cfg, model=replace(cfg.model, **shape))
    decay = cfg.smaller_muon_weight_decay
    if decay >= 0 and decay != cfg.muon_weight_decay:  # the decay tuned for the smaller model goes with it
        fitted_cfg, smaller["muon_weight_decay"] = replace(fitted_cfg, muon_weight_decay=decay), decay
        configured["muon_weight_decay"] = cfg.muon_weight_decay
    bigger, bigger_seen, model = model, seen, on_speed_path(build(fitted_cfg), choices)
    while True:
        seen_here = rt.broadcast(scaled_seen(cfg, rt, bigger, bigger_seen, model) if rt.master else None)
        if seen_here >= cfg.min_tokens_per_param or fitted_cfg.model.n_layer <= FEWEST_FITTED_LAYERS:
            break
        short.append(f"{fitted_cfg.model.n_layer} layers {tenths(seen_here)}")
        fitted_cfg = replace(fitted_cfg, model=replace(fitted_cfg.model, n_layer=fitted_cfg.model.n_layer - 1))
        smaller["n_layer"] = fitted_cfg.model.n_layer
        bigger, bigger_seen, model = model, seen_here, on_speed_path(build(fitted_cfg), choices)
    choices.fitted_from = configured
    decay = f", muon_weight_decay={smaller['muon_weight_decay']:g}" if "muon_weight_decay" in smaller else ""
    choices.lines.append(f"model: {shape_words(model)}{decay} instead of {shape_words(None, configured)}: in the "
                         f"{cfg.max_time:g} s here the configured model would see {tenths(seen)} tokens per parameter"
                         f"{''.join(', ' + line for line in short)}, fewer than min_tokens_per_param="
                         f"{cfg.min_tokens_per_param:g} (--min_tokens_per_param=0 keeps it)")
    return fitted_cfg, model


def on_speed_path(model, choices):
    install(model, choices.kernels, choices.attention_path)
    return model


def tokens_per_parameter(cfg, rt, model, step=None):
    """Tokens each of the model's parameters would see in max_time at its step (timed here unless given), with
    every process stepping side by side."""
    step = step or step_seconds(model, cfg.batch_size, rt.dtype)[0]
    return cfg.max_time * rt.world * cfg.batch_size * model.config.block_size / step / model.num_params()


def scaled_seen(cfg, rt, bigger, seen, smaller):
    """Tokens per parameter the smaller model would see where the bigger one sees `seen`: scaled by their steps
    timed in turns, in the same moments, and by their parameters. Where the smaller one is the bigger one with
    fewer layers its step does a part of the bigger one's work, so it sees at least seen x the parameter ratio:
    then it is not timed where that floor is enough already, and never put below it."""
    share = bigger.num_params() / smaller.num_params()
    fewer_layers = replace(bigger.config, n_layer=smaller.config.n_layer) == smaller.config
    floor = seen * share if fewer_layers else 0.0
    if floor >= cfg.min_tokens_per_param:
        return floor
    big, small = step_seconds(bigger, cfg.batch_size, rt.dtype, [smaller])
    return max(floor, seen * share * big / small)


def say_model(cfg, rt, model, choices, seen=None):
    budget = f" (it sees {tenths(seen)} tokens per parameter in the {cfg.max_time:g} s here)" if seen else ""
    choices.lines.append(f"model: {shape_words(model)}, {model.num_params() / 1e6:.2f}M parameters{budget}")
    c = model.config
    embeddings = c.vocab_size * c.n_embd * (1 if c.tie_weights else 2)
    # no count of the steps it will get: the timed forward and backward leave out the optimizer's and the
    # averaged weights' pass over every embedding row, most of such a step, so a count from them is far too many
    if rt.device == "cpu" and c.vocab_size > 1024 and embeddings > model.num_params() / 2:
        choices.lines.append(f"note: {embeddings / 1e6:.1f}M of its {model.num_params() / 1e6:.1f}M parameters are "
                             f"the embeddings of a {c.vocab_size:,}-token vocabulary, slow to train on a CPU; "
                             "the same text prepared by characters, or by a BPE of 512 tokens trained on it, trains "
                             "far more steps")


def shape_words(model, settings=None):
    """'4 layers × 128', of a model or of settings with n_layer and n_embd."""
    settings = settings or {"n_layer": model.config.n_layer, "n_embd": model.config.n_embd}
    layers = settings["n_layer"]
    return f"{layers} layer{'s' if layers != 1 else ''} × {settings['n_embd']}"


def tenths(tokens_per_param):
    """Rounded down, so that 5.96 reads 5.9, not 6.0, beside 'fewer than min_tokens_per_param=6'."""
    return f"{math.floor(tokens_per_param * 10) / 10:.1f}"
