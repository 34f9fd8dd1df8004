"""gptkit/machine/stand_ins.py: each kernel against the plain piece of model.py it stands in for (the same numbers, or
the same function at a stated tolerance, or for the dropout table the same statistics), and what installing does."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from conftest import MODERN, REPO, check_ok, random_tokens, run_script, tiny_model
from gptkit.interp.hooks import hooked
from gptkit.machine import stand_ins
from gptkit.machine.stand_ins import ATTENTION_PATHS, TableDropout, by_rule, install
from gptkit.sampling.decoding import generate
from model import SelfAttention

DROPOUT_MODEL = dict(MODERN, dropout=0.1, token_shift=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_dropout_zeroes_a_share_p_and_scales_the_rest_as_f_dropout_does(dtype):
    """Over 2M elements the zeroed share is p to within 0.2%, what is kept is scaled by exactly 1/(1-p), the
    gradient flows through the same mask, each call takes a new mask from torch's generator (so a seed repeats
    it), and outside training, or with p = 0, it is the identity."""
    x = torch.ones(2_000_000, dtype=dtype, requires_grad=True)
    drop = TableDropout(0.25)
    torch.manual_seed(0)
    y = drop(x)
    assert abs((y == 0).float().mean().item() - 0.25) < 0.002
    assert torch.equal(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75)) and y.dtype == dtype
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    torch.manual_seed(0)
    assert torch.equal(drop(x), y) and not torch.equal(drop(x), y)
    assert drop.eval()(x) is x and TableDropout(0.0)(x) is x


def test_table_dropout_masks_change_from_call_to_call_and_never_depend_on_the_past():
    """An element dropped in one call is dropped in the next with probability p, as with fresh masks (a table
    reused at one offset would drop it again); and a seed gives the same masks in a process whose table grew for
    bigger tensors first, as a resumed run's must."""
    x, drop = torch.ones(1_000_000), TableDropout(0.2)
    torch.manual_seed(3)
    first = [drop(x) == 0 for _ in range(4)]
    for a, b in zip(first, first[1:]):
        assert abs((a & b).float().mean().item() - 0.2 * 0.2) < 0.002
    drop(torch.ones(5_000_000))  # grows the table beyond what the calls above used
    torch.manual_seed(3)
    assert all(torch.equal(drop(x) == 0, mask) for mask in first)


def test_relu_squared_function_gives_autograd_s_numbers_exactly():
    """Doubling is exact in floating point, so the one-kernel backward's 2 * grad * r equals autograd's."""
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = torch.randn(64, 48, dtype=dtype, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        grad = torch.randn(64, 48, dtype=dtype)
        y = stand_ins.fused_relu_squared(x)
        y.backward(grad)
        F.relu(x_ref).square().backward(grad)
        assert torch.equal(y, F.relu(x_ref).square()) and torch.equal(x.grad, x_ref.grad)


def train_step(model, idx, dtype, seed=5):
    """Logits, loss and gradients of one forward and backward pass in dtype, dropout drawn from `seed`."""
    model.train().zero_grad()
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
        logits, loss = model(idx, idx)
    loss.backward()
    return logits.detach().float(), loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 0.0), (torch.bfloat16, 0.05)])
def test_without_dropout_the_kernels_compute_the_plain_model_s_function(dtype, tolerance):
    """At p = 0 every kernel computes what the plain model does: in float32 the very same numbers (the shift's
    cast does nothing there); under bfloat16 autocast the shift in bfloat16 rounds otherwise, within `tolerance`
    of the logits."""
    config = dict(DROPOUT_MODEL, dropout=0.0)
    idx = random_tokens((4, 16))
    plain = train_step(tiny_model(**config), idx, dtype)
    fast = tiny_model(**config)
    install(fast, stand_ins.KERNELS)
    got = train_step(fast, idx, dtype)
    if tolerance == 0:
        assert torch.equal(got[0], plain[0]) and all(torch.equal(a, b) for a, b in zip(got[2], plain[2]))
    else:
        assert 0 < (got[0] - plain[0]).abs().max() < tolerance
        assert abs(got[1] - plain[1]) < tolerance / 10


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("kind", ["scaled", "dot"])
def test_the_three_attention_paths_agree(kind, causal):
    """SDPA's kernel, the softmax written out as the notes write it, and the same folded into one matmul: the same
    outputs and gradients, also when new queries follow cached keys."""
    model = tiny_model(attention=kind, causal=causal, pos_emb="rope", qk_norm=True, attention_weights=0.5)
    idx = random_tokens((2, 10))
    results, runs = [], []
    for path in ATTENTION_PATHS:
        assert stand_ins.set_attention_path(model, path) == (path, [])
        results.append(train_step(model, idx, torch.float32))
        runs.append(generate(model.eval(), idx[:, :3], 20, temperature=0.0) if causal else None)
    for logits, _, grads in results[1:]:
        torch.testing.assert_close(logits, results[0][0], atol=1e-5, rtol=1e-5)
        for a, b in zip(grads, results[0][2]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert all(run is None or torch.equal(run, runs[0]) for run in runs)


def test_with_table_dropout_every_path_draws_the_same_masks():
    """With dropout every path draws the same masks from one seed, so which one start-up timed fastest changes
    nothing; 'fused' runs folded in training, since SDPA would draw its own, and SDPA in evaluation."""
    model = tiny_model(**DROPOUT_MODEL)
    install(model, by_rule("cpu"), "fused")
    idx = random_tokens((4, 16))
    seen = []
    for path in ("written", "folded", "fused"):
        stand_ins.set_attention_path(model, path)
        seen.append(train_step(model, idx, torch.float32))
    for other in seen[1:]:
        assert abs(other[1] - seen[0][1]) < 1e-5 and torch.allclose(other[2][0], seen[0][2][0], atol=1e-6)
    assert torch.equal(seen[2][0], seen[1][0])  # fused, in training: the folded path itself
    sdpa = []
    with torch.no_grad(), hooked(model.eval(), {"blocks.0.attn.hook_z": lambda z, name: sdpa.append(z)}):
        model(idx)
    attn = model.transformer.h[0].attn
    attn.attend = attn.sdpa
    with torch.no_grad(), hooked(model, {"blocks.0.attn.hook_z": lambda z, name: sdpa.append(z)}):
        model(idx)
    assert torch.equal(sdpa[0], sdpa[1])


def test_install_swaps_what_the_model_has_and_the_rule_keeps_gpu_masks():
    model = tiny_model(**DROPOUT_MODEL)
    install(model, by_rule("cpu"))
    kinds = {type(m).__name__ for m in model.modules()}
    assert "TableDropout" in kinds and "Dropout" not in kinds
    block = model.transformer.h[0]
    assert block.mlp.act is stand_ins.fused_relu_squared and isinstance(block.shift, stand_ins.CastTokenShift)
    assert by_rule("cuda") == ["relu2", "shift_cast"] and by_rule("cpu") == list(stand_ins.KERNELS)
    gelu = tiny_model(dropout=0.1)
    install(gelu, ["relu2", "shift_cast"])  # nothing of theirs to swap, and nn.Dropout stays
    assert "TableDropout" not in {type(m).__name__ for m in gelu.modules()} and gelu.transformer.h[0].shift is None
    assert gelu.transformer.h[0].mlp.act is F.gelu
    with pytest.raises(ValueError, match="unknown kernels: fast"):
        install(gelu, ["fast"])


def test_install_passes_over_an_mlp_or_block_written_without_act_or_shift():
    """A learner's MLP calling its activation directly, or a Block without the token shift, has no self.act or
    self.shift: nothing for relu2 or shift_cast to stand in for, and installing leaves them so."""
    model = tiny_model(**DROPOUT_MODEL)
    block = model.transformer.h[0]
    del block.mlp.act, block.shift
    install(model, by_rule("cpu"))
    assert not hasattr(block.mlp, "act") and not hasattr(block, "shift")
    assert isinstance(model.transformer.h[1].shift, stand_ins.CastTokenShift)


def test_a_model_py_without_token_shift_still_trains(tmp_path, data_dir):
    """The token shift taken out of model.py, its function too: the kernels import nothing of it, so the tools run
    the model as written, rather than asking for the function back."""
    project = tmp_path / "project"
    project.mkdir()
    for part in ("model.py", "train.py", "gptkit"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, project / part)
    source = (REPO / "model.py").read_text()
    function = source[source.index("def token_shift("):source.index("class Block(")]
    line = "self.shift = token_shift if config.token_shift else None"
    assert source.count(line) == 1
    (project / "model.py").write_text(source.replace(function, "").replace(line, "self.shift = None"))
    check_ok(run_script(project / "train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={tmp_path / 'o'}",
                        "--device=cpu", "--max_iters=2", "--max_time=0", "--eval_interval=2", "--eval_iters=1",
                        "--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=2",
                        "--final_eval_tokens=64", cwd=project, timeout=300))


# ---------------------------------------------------------------------------------------------- the learner's edits

def test_every_piece_a_kernel_stands_in_for_is_the_code_it_was_written_for():
    """model.py as committed: each fingerprint matches, so every kernel installs. A change to one of these pieces
    that its kernel still matches updates its fingerprint in WRITTEN_FOR (the message names the new one)."""
    import model as model_py
    for piece, recorded in {**stand_ins.WRITTEN_FOR, **stand_ins.WATCHED_WRITE_OUT}.items():
        owner, _, name = piece.rpartition(".")
        function = getattr(getattr(model_py, owner) if owner else model_py, name)
        assert stand_ins.code_fingerprint(function) == recorded, f"{piece}: now {stand_ins.code_fingerprint(function)}"


def test_an_edit_a_watched_pass_writes_out_in_its_own_code_is_noted(monkeypatch):
    """A pass that watches hook_scale writes out the norm, one that watches the pattern the attention, and one
    that starts partway through GPT.forward's tail: an edited layer_norm (its eps, say), sdpa or GPT.forward
    runs in the model but not there, and the note says so."""
    import model as model_py
    assert stand_ins.unwatched_edits() is None
    monkeypatch.setattr(model_py, "layer_norm", lambda x, norm: F.layer_norm(x, norm.weight.shape, norm.weight,
                                                                              norm.bias, eps=1.0))
    said = ("edited, but a pass that watches the attention pattern or a norm's scale, or starts partway through the "
            "model (patching, head ablation, the logit lens), writes out its own copy: what it shows may differ from "
            "what your model computes")
    assert stand_ins.unwatched_edits() == f"note: model.py's layer_norm is {said}"
    forward = model_py.GPT.forward
    monkeypatch.setattr(model_py.GPT, "forward", lambda self, idx, targets=None, cache=None: forward(self, idx,
                                                                                                      targets, cache))
    assert stand_ins.unwatched_edits() == f"note: model.py's layer_norm and GPT.forward are {said}"


def test_a_fingerprint_follows_the_code_not_its_comments_or_layout():
    def plain():
        def relu_squared(x):
            return F.relu(x).square()
        return relu_squared

    def commented():
        def relu_squared(x):
            """Said otherwise."""
            return F.relu(x).square()  # a comment, and the layout changed
        return relu_squared

    def identity():
        def relu_squared(x):
            return x
        return relu_squared

    assert stand_ins.code_fingerprint(plain()) == stand_ins.code_fingerprint(commented()) == \
        stand_ins.WRITTEN_FOR["relu_squared"]
    assert stand_ins.code_fingerprint(identity()) != stand_ins.WRITTEN_FOR["relu_squared"]


def edited_model(monkeypatch, piece, function, **config):
    """A tiny model whose `piece` of model.py is `function`, as a learner's edit to model.py would make it."""
    import model as model_py
    owner, _, name = piece.rpartition(".")
    monkeypatch.setattr(getattr(model_py, owner) if owner else model_py, name, function)
    if name == "relu_squared":
        monkeypatch.setattr(model_py, "ACTIVATIONS", dict(model_py.ACTIVATIONS, relu2=function))
    if name in ("scaled_scores", "dot_scores"):
        monkeypatch.setattr(model_py, "SCORES", dict(model_py.SCORES, **{name.split("_")[0]: function}))
    return tiny_model(**{**DROPOUT_MODEL, "dropout": 0.0, **config})


def relu_squared(x):  # an edit: ReLU^2 made the identity
    return x


def token_shift(h, share, before=None):  # an edit: the shift made twice as strong
    return h + 2 * share.to(h.dtype) * (F.pad(h[:, :-1], (0, 0, 1, 0)) - h)


def scaled_scores(attn, q, k):  # an edit: the scale set to 1
    return q @ k.transpose(-2, -1)


def pattern(self, q, k):  # an edit: the softmax replaced by a normalised relu
    scores = torch.relu(self.score(self, q, k)).masked_fill(~self.visible(q.size(2), k.size(2)), 0)
    return self.hook_pattern(scores / (scores.sum(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize("piece, edit, kernel, path", [
    ("relu_squared", relu_squared, "relu2", "folded"), ("token_shift", token_shift, "shift_cast", "folded"),
    ("scaled_scores", scaled_scores, None, "written"), ("SelfAttention.pattern", pattern, None, "written")])
def test_a_kernel_steps_aside_for_an_edited_piece_and_the_edit_runs(monkeypatch, piece, edit, kernel, path):
    """Installed on a model whose piece was edited, the kernel (or the fast attention path) steps aside, one line
    says which and why, and the model computes what the edited model.py says: its loss is the plain edited model's,
    not the unedited kernels' one."""
    idx = random_tokens((2, 12))
    unedited = tiny_model(**dict(DROPOUT_MODEL, dropout=0.0))
    install(unedited, stand_ins.KERNELS, "folded")
    plain = edited_model(monkeypatch, piece, edit)
    for block in plain.transformer.h:  # the edited model.py as written out, no kernel anywhere
        block.attn.attend = block.attn.written
    fast = edited_model(monkeypatch, piece, edit)
    taken, lines = install(fast, stand_ins.KERNELS, "folded")
    assert taken == path and len(lines) == 1
    where = "kernels: " + kernel + " steps aside" if kernel else "attention: the written path instead of folded"
    assert lines[0].startswith(where) and f"model.py's {piece} is not the code" in lines[0]
    with torch.no_grad():
        want, got, before = plain(idx, idx)[1], fast(idx, idx)[1], unedited(idx, idx)[1]
    torch.testing.assert_close(got, want)
    assert abs(got.item() - before.item()) > 1e-4


def test_an_edited_sdpa_takes_the_fused_path_from_every_other_one(monkeypatch):
    def sdpa(self, q, k, v):  # an edit: attend twice as much to the values
        return 2 * F.scaled_dot_product_attention(q, k, v, is_causal=True)

    model = edited_model(monkeypatch, "SelfAttention.sdpa", sdpa)
    edit = "model.py's SelfAttention.sdpa is not the code"
    assert [install(model, [], path) for path in ATTENTION_PATHS] == [
        ("fused", [f"attention: the fused path: {edit} the written and folded paths stand in for, so yours runs"]),
        ("fused", [f"attention: the fused path instead of written: {edit} the written path stands in for, so yours "
                   "runs"]),
        ("fused", [f"attention: the fused path instead of folded: {edit} the folded path stands in for, so yours "
                   "runs"])]


@pytest.mark.parametrize("path", ATTENTION_PATHS)
def test_an_edited_init_that_sets_its_own_attention_keeps_it_on_every_path(monkeypatch, path):
    """An __init__ edited to pick attention of the learner's own: no path replaces it, and one line says the
    edited __init__ is what runs."""
    init = SelfAttention.__init__

    def edited_init(self, config):
        init(self, config)
        self.attend = lambda q, k, v: self.written(q / 2, k, v)  # an edit: the queries halved

    model = edited_model(monkeypatch, "SelfAttention.__init__", edited_init)
    taken, lines = install(model, [], path)
    assert lines and "model.py's SelfAttention.__init__ is not the code" in lines[0]
    idx = random_tokens((2, 12))
    plain = tiny_model(**{**DROPOUT_MODEL, "dropout": 0.0})
    plain.load_state_dict(model.state_dict())
    for block in plain.transformer.h:
        block.attn.attend = lambda q, k, v, attn=block.attn: attn.written(q / 2, k, v)
    with torch.no_grad():
        torch.testing.assert_close(model(idx, idx)[1], plain(idx, idx)[1])


@pytest.mark.parametrize("path", ATTENTION_PATHS)
def test_an_init_edited_to_set_what_sdpa_alone_reads_runs_sdpa_on_every_path(monkeypatch, path):
    """An __init__ that sets SDPA's scale (1/d for 1/sqrt(d)), which the written-out attention never reads: the
    paths that stand in for written would drop the edit, so every path is the fused one, model.py's sdpa with the
    learner's scale, and the model computes what model.py alone computes; with dropout, SDPA draws its own masks."""
    init = SelfAttention.__init__

    def edited_init(self, config):
        init(self, config)
        self.scale = 1.0 / (config.n_embd // config.n_head)  # an edit: muP's 1/d

    model = edited_model(monkeypatch, "SelfAttention.__init__", edited_init, dropout=0.1)
    idx = random_tokens((2, 12))
    with torch.no_grad():
        want = model.eval()(idx, idx)[1]
    taken, lines = install(model, stand_ins.KERNELS, path)
    assert taken == "fused" and "model.py's SelfAttention.__init__ is not the code" in lines[0]
    assert type(model.transformer.h[0].attn.attn_dropout) is torch.nn.Dropout
    with torch.no_grad():
        assert torch.equal(model.eval()(idx, idx)[1], want)


def test_a_query_key_value_matrix_renamed_in_init_and_project_trains_on_every_path(monkeypatch):
    """sed 's/self.c_attn/self.qkv/g' model.py: the check of what an edited __init__ set read the head width off
    c_attn, and the run stopped before its first step."""
    init, project = SelfAttention.__init__, SelfAttention.project

    def renamed_init(self, config):
        init(self, config)
        self.qkv = self.c_attn
        del self.c_attn

    def renamed_project(self, x, rotary):
        self.c_attn = self.qkv  # the code as written, read through the new name
        try:
            return project(self, x, rotary)
        finally:
            del self.c_attn

    monkeypatch.setattr(SelfAttention, "project", renamed_project)
    model = edited_model(monkeypatch, "SelfAttention.__init__", renamed_init)
    idx = random_tokens((2, 12))
    with torch.no_grad():
        want = model.eval()(idx, idx)[1]
    for path in ATTENTION_PATHS:
        install(model, stand_ins.KERNELS, path)
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(idx, idx)[1], want)


@pytest.mark.parametrize("name", stand_ins.PATH_METHODS)
def test_a_renamed_method_the_paths_call_leaves_model_py_s_own_attention_to_run(monkeypatch, name):
    """A learner who renames a method the attention paths call by name (pattern to attention_weights, its callers
    with it) still trains and samples: on every path the attention runs as model.py's __init__ set it up, with one
    line, and the model computes what model.py alone computes."""
    idx = random_tokens((2, 12))
    plain = tiny_model(**{**DROPOUT_MODEL, "dropout": 0.0}).eval()
    with torch.no_grad():
        want = plain(idx, idx)[1]
    method = getattr(SelfAttention, name)
    monkeypatch.delattr(SelfAttention, name)
    for block in plain.transformer.h:  # its callers call it by its new name, which this stands for
        block.attn.__dict__[name] = method.__get__(block.attn)
    for path in ATTENTION_PATHS:
        assert install(plain, [], path) == ("fused", [
            f"attention: model.py's SelfAttention has no {name}, which the tools' attention paths call by name: it "
            "runs as its __init__ sets it up"])
        with torch.no_grad():
            assert torch.equal(plain(idx, idx)[1], want)


def test_a_model_loaded_from_a_checkpoint_runs_an_edited_attention(monkeypatch, tmp_path):
    """sample.py, analyze.py and the explorer build their model through model_from_checkpoint: where the learner
    edited the written-out attention, that model runs the edit too, as training did."""
    from dataclasses import asdict

    from gptkit.machine.stand_ins import attention_path_of
    from gptkit.run.checkpoint import model_from_checkpoint
    trained = tiny_model(**dict(DROPOUT_MODEL, dropout=0.0))
    ckpt = {"model": trained.state_dict(), "model_args": asdict(trained.config)}
    assert {attention_path_of(b.attn) for b in model_from_checkpoint(ckpt, "x.pt").transformer.h} == {"fused"}
    edited_model(monkeypatch, "scaled_scores", scaled_scores)
    assert {attention_path_of(b.attn) for b in model_from_checkpoint(ckpt, "x.pt").transformer.h} == {"written"}


def recording_edit(piece, original, ran):
    """A learner's edit to `piece`: the numbers of `original`, and `piece` noted in `ran` each time it runs."""
    def edit(*args, **kwargs):
        ran.add(piece)
        return original(*args, **kwargs)
    edit.__name__ = original.__name__  # install() knows an activation or a shift by its name
    return edit


# every piece a kernel or attention path stands in for, each with the attention kinds whose paths cover it
COVERED = {"relu_squared": ["scaled"], "token_shift": ["scaled"], "scaled_scores": ["scaled"],
           "dot_scores": ["scaled", "dot"], "SelfAttention.pattern": ["scaled", "dot"],
           "SelfAttention.written": ["scaled", "dot"], "SelfAttention.visible": ["scaled", "dot"],
           "SelfAttention.sdpa": ["scaled", "dot"], "SelfAttention.__init__": ["scaled", "dot"]}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("piece, kind", [(piece, kind) for piece, kinds in COVERED.items() for kind in kinds])
def test_every_edit_to_a_piece_a_stand_in_covers_runs_in_training_and_sampling(monkeypatch, piece, kind, path,
                                                                               dropout):
    """Each piece of model.py a kernel or path stands in for, edited: its edit runs in a training step under
    every kernel and path, and in sampling from a model loaded as sample.py loads it; on any path asked, one line
    names the piece. (An edit to dot_scores once never ran, nor said so: the scaled attention's fast paths skipped
    the dot_scores that scaled_scores calls.)"""
    from dataclasses import asdict

    import model as model_py
    from gptkit.run.checkpoint import model_from_checkpoint
    assert set(COVERED) == set(stand_ins.WRITTEN_FOR), "a new stand-in's pieces belong in COVERED"
    owner, _, name = piece.rpartition(".")
    ran = set()
    edit = recording_edit(piece, getattr(getattr(model_py, owner) if owner else model_py, name), ran)
    model = edited_model(monkeypatch, piece, edit, attention=kind, dropout=dropout)
    taken, lines = install(model, by_rule("cpu"), path)
    assert len(lines) == 1 and f"model.py's {piece} is not the code" in lines[0], lines
    train_step(model, random_tokens((2, 12)), torch.float32)
    assert ran == {piece}, f"{piece} did not run in training on the {path} path"
    ran.clear()
    sampler = model_from_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config)}, "x.pt")
    generate(sampler.eval(), random_tokens((1, 3)), 6, temperature=0.0)
    assert ran == {piece}, f"{piece} did not run in sampling"


EDITS = {  # a learner's edits to model.py, as text: (what they replace, with what)
    "ReLU² made the identity": ("    return F.relu(x).square()", "    return x"),
    "the token shift removed": ("self.shift = token_shift if config.token_shift else None", "self.shift = None"),
    "the score scale changed": ("* (1.0 / math.sqrt(k.size(-1)))", "* 1.0"),
    "the MLP returning zeros": ("return self.dropout(self.c_proj(self.act(self.c_fc(x))))",
                                "return torch.zeros_like(x)"),
    "the softmax replaced": ("F.softmax(self.hook_attn_scores(scores), dim=-1)",
                             "torch.sigmoid(self.hook_attn_scores(scores))"),
    "the dot products doubled": ("    return q @ k.transpose(-2, -1)", "    return 2 * (q @ k.transpose(-2, -1))"),
    "a sliding window of 4": ("dtype=torch.bool).tril(),", "dtype=torch.bool).tril() & ~torch.ones(config.block_size, "
                                                           "config.block_size, dtype=torch.bool).tril(-4),"),
}


def loss_after_20_steps(project, data_dir, out):
    """train.py of `project` under the default config for 20 steps: (its loss at step 20, what it printed)."""
    proc = check_ok(run_script(project / "train.py", "config/shakespeare_char.py", f"--data_dir={data_dir}",
                               "--dataset=tiny", f"--out_dir={out}", "--device=cpu", "--max_iters=20", "--max_time=0",
                               "--seed=1", "--log_interval=20", "--eval_interval=20", "--eval_iters=1",
                               "--final_eval_tokens=256", cwd=project, timeout=300))
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    return train[-1]["loss"], proc.stdout


@pytest.mark.slow
def test_each_edit_to_model_py_changes_what_the_default_config_trains(tmp_path, data_dir):
    """The project copied, model.py edited as a learner would, and trained under the default config: every edit
    changes the loss after 20 steps, and where a kernel or path stood in for the edited piece, a line says it
    stepped aside. Unedited, nothing steps aside."""
    project = tmp_path / "project"
    project.mkdir()
    for part in ("model.py", "train.py", "gptkit", "config"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, project / part)
    unedited, said = loss_after_20_steps(project, data_dir, tmp_path / "unedited")
    assert "steps aside" not in said and "instead of" not in said
    source = (REPO / "model.py").read_text()
    for name, (old, new) in EDITS.items():
        assert source.count(old) == 1, name
        (project / "model.py").write_text(source.replace(old, new))
        loss, said = loss_after_20_steps(project, data_dir, tmp_path / name.replace(" ", "_"))
        assert abs(loss - unedited) > 1e-3, f"{name}: {loss} against {unedited} unedited"
        if name in ("ReLU² made the identity", "the score scale changed", "the softmax replaced",
                    "the dot products doubled", "a sliding window of 4"):
            assert "model.py's" in said and "so yours runs" in said, name
