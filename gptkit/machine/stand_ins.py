"""
Speed kernels: stand-ins for some of model.py's plain-torch pieces, installed on a model by the runtime. On a CPU an
eager step of a small model is bound by the number of small operations and by serial random draws, not by its
matmuls; each kernel here does a piece's work in fewer passes. docs/speed.md has their measured effect.

- `table_dropout` (CPU only): dropout masks cut from a table of random masks instead of drawn afresh. It draws
  other masks than nn.Dropout, so the runtime chooses it by a rule, never by a timing, and the checkpoint records
  it: the same command gives the same model, and a resume continues exactly.
- `relu2`: ReLU^2 with one kernel each way past the relu; the same numbers as relu(x).square().
- `shift_cast`: under autocast, the token shift runs in the autocast precision rather than in float32 (the norm's
  output), moving half the bytes; other numbers than the plain shift, so chosen by the rule too.
- the attention path, for scaled and dot scores: `fused` (the model's own: SDPA), `written` (softmax(q.k) . v as
  the model writes it) or `folded` (the same with the scale and the mask folded into one batched matmul). All
  compute the same function; the runtime times them. SDPA cannot take the table's masks: with table_dropout a
  run chooses between the other two, and 'fused' (a checkpoint's, or as asked) runs folded in training.

What the learner writes is what runs: each kernel stands in for a piece of model.py only while that piece is the
code it was written for (WRITTEN_FOR, a fingerprint of each piece's code). Where the learner has edited the piece,
the kernel steps aside, their version runs, and install() says so in one line. The attention paths follow the same
rule. The fused and folded paths stand in for the written-out attention (the score function, with the `dot_scores`
that `scaled_scores` calls, `pattern`, `written`, `visible`, and `SelfAttention.__init__`, which sets up the mask,
scale and scores they read): an edit to any of them makes every path the written one, or, where the edited
`__init__` sets `attend` to a function of the learner's own, that function, or, where it sets what sdpa alone reads
(its scale), the fused one. The written and folded paths stand in
for `sdpa`, and 'fused' does too while the table's masks drop weights: an edit to it makes every path the fused
one, the learner's SDPA, which draws its own dropout masks (the table then leaves the attention weights' dropout
alone). Where the learner renamed a method the paths call by name (PATH_METHODS), no path is set: the attention runs
as model.py's __init__ set it up.
"""

import ast
import functools
import hashlib
import inspect
import io
import math
import textwrap
import tokenize
from functools import partial

import torch
import torch.nn as nn
from torch.nn import functional as F

from gptkit.base.modes import evaluating
import model as model_py
from model import MLP, Block, SelfAttention

KERNELS = ("table_dropout", "relu2", "shift_cast")
ATTENTION_PATHS = ("fused", "written", "folded")
# each path in a few words, for the line that names the one a run takes
ATTENTION_PATH_WORDS = {
    "fused": "torch's fused SDPA kernel, the attention weights never written out",
    "written": "softmax(q.k) . v as model.py writes it",
    "folded": "model.py's softmax(q.k) . v, its scale and mask folded into one matmul",
}

# the fingerprint (code_fingerprint) of each model.py piece a kernel or path was written for; a change to model.py
# that a kernel still matches updates its fingerprint here (tests/test_stand_ins.py names the new one)
WRITTEN_FOR = {
    "relu_squared": "cc14c126d21bde89",
    "token_shift": "4cb502fff014a260",
    "scaled_scores": "9d44e0876b87629b",
    "dot_scores": "c6a0d17feb8d3d1d",
    "SelfAttention.pattern": "b8e0a4c19ac25053",
    "SelfAttention.written": "2b4dc9cb86e56322",
    "SelfAttention.visible": "a48e7f5ea11a4c6a",
    "SelfAttention.sdpa": "c79a972ed1b35032",
    "SelfAttention.__init__": "12ce80bd6f35b921",
}


# what a pass that watches a hook, or starts partway through the model, writes out in its own code rather than
# runs, each written for these pieces as they are: Norm.forward the norm (to show hook_scale, its divisor),
# SelfAttention.forward the written-out attention (to show the pattern), and gptkit/interp/hooks.py's
# forward_from and read_out GPT.forward's loop over the blocks, final norm and head (patching, head ablation and
# the logit lens start from a stream partway through)
WATCHED_WRITE_OUT = {"layer_norm": "5bf0d8a8db389f8e", "rms_norm": "65805c6d9a3eeecc",
                     "SelfAttention.sdpa": WRITTEN_FOR["SelfAttention.sdpa"], "GPT.forward": "cdc21d8e2ba7f14c"}


def unwatched_edits(model=None):
    """A note for the tools that watch hooks or start partway through the model (analyze.py, the explorer, plot.py
    attention) where the learner edited a piece such a pass writes out in its own code, or, in model, an
    __init__ that set what sdpa alone reads (self.scale: the written-out attention keeps the score function's);
    else None."""
    code = model_code()
    pieces = [name for name, fingerprint in WATCHED_WRITE_OUT.items() if code.get(name) != fingerprint]
    layers = [m for m in (model.modules() if model is not None else ()) if isinstance(m, SelfAttention)]
    if any(path_for_edits(attn, "fused") == ("fused", ["SelfAttention.__init__"]) for attn in layers):
        pieces.append("SelfAttention.__init__")
    if not pieces:
        return None
    return (f"note: model.py's {' and '.join(pieces)} {'is' if len(pieces) == 1 else 'are'} edited, but a pass that "
            "watches the attention pattern or a norm's scale, or starts partway through the model (patching, head "
            "ablation, the logit lens), writes out its own copy: what it shows may differ from what your model "
            "computes")


def by_rule(device):
    """The kernels a fresh run installs on this device: all of them on a CPU; elsewhere the ones that keep
    nn.Dropout's masks (a GPU draws them fast)."""
    return [k for k in KERNELS if device == "cpu" or k != "table_dropout"]


@functools.cache  # a function's code is fixed once imported; paths are set on every timed step
def code_fingerprint(function):
    """16 hex digits of a function's code: its tokens without comments, layout or the docstring, so that an edit to
    what it does changes the fingerprint and a reflowed comment does not (and no Python version's syntax tree)."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError):  # no source to read (made at run time): not the code written for
        return "unknown"
    body = getattr(node, "body", [])
    docstring = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        else None
    return tokens_fingerprint(source, range(docstring.lineno, docstring.end_lineno + 1) if docstring else range(0))


def tokens_fingerprint(source, skipped=range(0)):
    """16 hex digits of source's tokens, without comments, layout or the lines `skipped`."""
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    words = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type not in layout and t.start[0] not in skipped]
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:16]


@functools.cache  # model.py's source, as imported, is fixed: every checkpoint a run saves reads these
def module_values():
    """{name: fingerprint} of each value model.py sets at its top level (SCORES, ACTIVATIONS): an edit to a table
    of choices changes what a model computes as an edit to a function does."""
    import model as model_py

    try:
        source = inspect.getsource(model_py)
    except OSError:
        return {}
    out = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name):
                out[target.id] = tokens_fingerprint(ast.get_source_segment(source, node))
    return out


def model_code():
    """{name: fingerprint} of every function and method model.py defines ('relu_squared', 'SelfAttention.pattern'),
    and of the values it sets at its top level (module_values): what a checkpoint keeps of the code it was trained
    with."""
    import model as model_py

    code = dict(module_values())
    for name, obj in vars(model_py).items():
        if getattr(obj, "__module__", None) != "model":
            continue
        if inspect.isfunction(obj):
            code[name] = code_fingerprint(obj)
        elif inspect.isclass(obj):
            code.update({f"{name}.{attr}": code_fingerprint(f) for attr, f in vars(obj).items()
                         if inspect.isfunction(f)})
    return code


def changed_since(trained_code):
    """The model.py pieces whose code differs from a checkpoint's model_code (or are gone): [] where it holds none."""
    now = model_code()
    return sorted(name for name, fingerprint in (trained_code or {}).items() if now.get(name) != fingerprint)


def edited(piece, function):
    """Whether `function`, the model's `piece` (a WRITTEN_FOR name), is other code than its kernel was written for."""
    return code_fingerprint(function) != WRITTEN_FOR[piece]


def install(model, kernels, attention_path="fused"):
    """Put the named kernels in place of the model's plain pieces (those it has, as written for) and set the
    attention path: (the path, lines naming each kernel or path that stepped aside for an edited piece)."""
    unknown = set(kernels) - set(KERNELS)
    if unknown:
        raise ValueError(f"unknown kernels: {', '.join(sorted(unknown))} (known: {', '.join(KERNELS)})")
    aside = set()
    for module in list(model.modules()):
        for name, child in module.named_children():
            if "table_dropout" in kernels and type(child) is nn.Dropout and child.p > 0 and \
                    not (name == "attn_dropout" and runs_own_sdpa(module)):  # their SDPA draws its own masks
                setattr(module, name, TableDropout(child.p))
        # a learner's MLP or Block written without self.act or self.shift has nothing for these to stand in for
        act, shift = getattr(module, "act", None), getattr(module, "shift", None)
        if "relu2" in kernels and isinstance(module, MLP) and getattr(act, "__name__", "") == "relu_squared":
            if edited("relu_squared", act):
                aside.add(("relu2", "relu_squared"))
            else:
                module.act = fused_relu_squared
        if "shift_cast" in kernels and isinstance(module, Block) and getattr(shift, "__name__", "") == "token_shift":
            if edited("token_shift", shift):
                aside.add(("shift_cast", "token_shift"))
            else:
                module.shift = CastTokenShift(shift)
    path, aside_paths = set_attention_path(model, attention_path)
    lines = [f"kernels: {kernel} steps aside: model.py's {piece} is not the code it was written for, so yours runs"
             for kernel, piece in sorted(aside)]
    return path, lines + aside_paths


def set_attention_path(model, path):
    """Every layer's scaled or dot attention computed on `path` (see the module's docstring), or on the one its
    edits leave: (the path taken, a line naming the edited pieces that decided it, where any did)."""
    if path not in ATTENTION_PATHS:
        raise ValueError(f"attention path must be one of {', '.join(ATTENTION_PATHS)} (got {path!r})")
    taken, why = path, []
    for module in model.modules():
        if isinstance(module, SelfAttention):
            if gone := gone_methods(module):  # renamed: no path can call it, model.py's own attention runs
                taken, why = "fused", [f"attention: model.py's SelfAttention has no {' or '.join(gone)}, which the "
                                       "tools' attention paths call by name: it runs as its __init__ sets it up"]
                continue
            layer_path, pieces = path_for_edits(module, path)
            if not own_attention(module):
                module.attend = attention_function(module, layer_path)
            if pieces:
                taken, why = layer_path, [path_line(path, layer_path, pieces)]
    return taken, why


def path_line(asked, taken, pieces):
    """The line that says the learner's edit to `pieces` runs on path `taken`, `asked` having been asked."""
    edits = f"model.py's {', '.join(pieces)} {'is' if len(pieces) == 1 else 'are'} not the code"
    if taken != asked:
        return f"attention: the {taken} path instead of {asked}: {edits} the {asked} path stands in for, so " \
            "yours runs"
    others = " and ".join(p for p in ATTENTION_PATHS if p != taken)
    return f"attention: the {taken} path: {edits} the {others} paths stand in for, so yours runs"


PATH_METHODS = ("sdpa", "written", "pattern", "visible")  # the SelfAttention methods the paths call by name


def gone_methods(attn):
    """The methods of PATH_METHODS that attn's class no longer has (the learner renamed them)."""
    return [name for name in PATH_METHODS if not callable(getattr(type(attn), name, None))]


def path_for_edits(attn, path):
    """(the path attn takes where `path` is asked, the edited pieces that decide it): the written path where the
    written-out attention was edited; else, where sdpa was, the fused path (the learner's sdpa); the fused path,
    model.py's own attention, where a method the paths call is gone."""
    if gone := gone_methods(attn):
        return "fused", [f"SelfAttention.{name}" for name in gone]
    if attn.kind not in ("scaled", "dot"):
        return path, []
    cls = type(attn)
    scores = [("scaled_scores", attn.score), ("dot_scores", model_py.dot_scores)] if attn.kind == "scaled" else \
        [("dot_scores", attn.score)]  # scaled_scores calls model.py's dot_scores
    written = [name for name, function in (*scores, ("SelfAttention.pattern", cls.pattern),
                                           ("SelfAttention.written", cls.written),
                                           ("SelfAttention.visible", cls.visible),
                                           ("SelfAttention.__init__", cls.__init__)) if edited(name, function)]
    if written == ["SelfAttention.__init__"] and sdpa_alone_edited(attn):
        return "fused", written  # it set what sdpa alone reads (self.scale): model.py trains on sdpa, so that runs
    if written:
        return "written", written
    if edited("SelfAttention.sdpa", cls.sdpa):
        return "fused", ["SelfAttention.sdpa"]
    return path, []


@torch.no_grad()
def sdpa_alone_edited(attn):
    """Whether, of attn's two ways to attend, only sdpa computes other attention than model.py as written would
    (an edited __init__ set what sdpa alone reads, self.scale), on random queries, keys and values in float32
    without dropout; where written does (a mask of its own, its scores), the edit is written's."""
    # the residual stream's width from the first matrix that reads it, whatever the learner named it (c_attn)
    width = next(m.in_features for m in attn.modules() if hasattr(m, "in_features")) // attn.n_head
    q, k, v = torch.randn(3, 1, attn.n_head, 6, width, generator=torch.Generator().manual_seed(0)) \
        .to(next(attn.parameters()).device)
    unedited = F.scaled_dot_product_attention(q, k, v, is_causal=attn.causal,
                                              scale=None if attn.kind == "scaled" else 1.0)
    with evaluating(attn):
        return torch.allclose(attn.written(q, k, v), unedited, rtol=1e-4, atol=1e-5) and \
            not torch.allclose(attn.sdpa(q, k, v), unedited, rtol=1e-4, atol=1e-5)


def own_attention(attn):
    """Whether attn.attend is a function of the learner's own, which their edited __init__ set: no path
    replaces it."""
    attend = attn.attend
    function = attend.func if isinstance(attend, partial) else getattr(attend, "__func__", attend)
    return function not in (folded, fused_unless_dropping, getattr(SelfAttention, "sdpa", None),
                            getattr(SelfAttention, "written", None))


def runs_own_sdpa(module):
    """Whether module is attention that runs the learner's own sdpa on every path (edited, or reading what their
    __init__ set, or where the paths cannot be set)."""
    if not isinstance(module, SelfAttention):
        return False
    taken, pieces = path_for_edits(module, "fused")
    return taken == "fused" and bool(pieces)


def attention_path_of(attn):
    """The path attn's attention takes now: 'fused', 'written' or 'folded' (additive and uniform: 'written')."""
    if isinstance(attn.attend, partial):
        return "folded" if attn.attend.func is folded else "fused"
    return "written" if attn.attend == getattr(attn, "written", None) else "fused"


def attention_function(attn, path):
    """attn's attention on `path`, as a function of (q, k, v); the model's own where its scores have no other."""
    if attn.kind not in ("scaled", "dot"):
        return attn.written  # additive and uniform scores are only ever written out
    if path == "fused" and isinstance(attn.attn_dropout, TableDropout):
        return partial(fused_unless_dropping, attn)
    return {"fused": attn.sdpa, "written": attn.written, "folded": partial(folded, attn)}[path]


def fused_unless_dropping(attn, q, k, v):
    """SDPA, but folded while the table's masks drop weights in training: SDPA would draw its own masks."""
    return folded(attn, q, k, v) if attn.training else attn.sdpa(q, k, v)


def folded(attn, q, k, v):
    """attn.written for scaled and dot scores, with the scale and the mask folded into one batched matmul (the
    mask as -inf added to the scores): one pass over the (T, S) scores instead of three."""
    B, H, T, D = q.shape
    S = k.size(2)
    mask = torch.zeros(T, S, dtype=q.dtype, device=q.device)
    if attn.causal:
        mask = mask.masked_fill(~attn.visible(T, S), float("-inf"))
    scale = attn.scale or 1 / math.sqrt(D)
    scores = torch.baddbmm(mask.expand(B * H, T, S), q.reshape(B * H, T, D), k.reshape(B * H, S, D).transpose(1, 2),
                           alpha=scale)
    return attn.attn_dropout(scores.view(B, H, T, S).softmax(dim=-1)) @ v


MASK_CHUNK = 1 << 20  # elements of the mask table drawn from one fixed seed
_mask_tables = {}  # (p, dtype) -> the mask table for that dropout rate and precision


def mask_table(p, dtype, size):
    """At least `size` elements, each 0 with probability p (to within 1/32768) or else 1/(1-p), built chunk by
    chunk from fixed seeds: its first elements are the same however large it has grown, and whatever torch's
    generator drew before."""
    table = _mask_tables.get((p, dtype))
    have = 0 if table is None else table.numel()
    if have < size:
        kept, dropped = torch.tensor(1 / (1 - p), dtype=dtype), torch.zeros((), dtype=dtype)
        chunks = [] if table is None else [table]
        for seed in range(have // MASK_CHUNK, -(-size // MASK_CHUNK)):
            seeded = torch.Generator().manual_seed(seed)
            draws = torch.empty(MASK_CHUNK // 4, dtype=torch.int64).random_(generator=seeded)
            bits = draws.view(torch.int16) & 0x7FFF  # four 15-bit draws from each 63 random bits
            chunks.append(torch.where(bits >= round(p * 32768), kept, dropped))
        table = _mask_tables[p, dtype] = torch.cat(chunks)
    return table


class TableDropout(nn.Module):
    """nn.Dropout on a CPU, with masks cut from a table: in training, each element zeroed with probability p and
    the rest scaled by 1/(1-p).

    torch's generator draws a fresh mask serially, several ns an element, which cost a small model as much as its
    matmuls. Here a mask is a window of a table of random masks at an offset drawn from torch's generator: within
    a window the elements are independent draws, and from one call to the next the window moves by a random amount
    among at least 4M places, so an element dropped in one call is dropped in the next with probability p, as with
    fresh masks. The offset comes from torch's generator (in a compiled block, from inductor's, seeded from
    torch's), so a seed (and a resumed run's restored state) repeats the masks."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        n = x.numel()
        span = max(2 * n, 1 << 22)  # the offsets a window can start at: a function of n alone, never of the past
        offset = int(torch.randint(span, ()))
        return x * mask_table(self.p, x.dtype, span + n)[offset:offset + n].view(x.shape)


class ReLUSquaredFunction(torch.autograd.Function):
    """relu(x)^2 with one kernel each way past the relu: autograd through relu(x).square() runs four more
    element-wise kernels. The backward's 2 * grad * r is one addcmul onto a zero, where grad * (r + r) takes two
    passes; doubling is exact in floating point, so the gradients equal autograd's."""

    @staticmethod
    def forward(ctx, x):
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return torch.addcmul(grad.new_zeros(()), grad, r, value=2)


def fused_relu_squared(x):
    return ReLUSquaredFunction.apply(x)


class CastTokenShift:
    """model.py's token shift in the autocast precision: autocast leaves the norm's output in float32 and casts it
    at the branch's first matmul anyway, so casting first moves half the bytes through the shift each way."""

    def __init__(self, shift):
        self.shift = shift  # model.py's token_shift, as written for

    def __call__(self, h, share, before=None):
        if torch.is_autocast_enabled(h.device.type):
            h = h.to(torch.get_autocast_dtype(h.device.type))
        return self.shift(h, share, before)
