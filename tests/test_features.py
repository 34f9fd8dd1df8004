"""Sparse autoencoders on a run (gptkit/interp/sae.py, gptkit/interp/features.py, analyze.py features): planted
features found, features switched off by exactly their decoded contribution, CE loss recovered at its two ends, the
saved files read by SAELens as they are, a stopped training continued to the same weights, and each mistake one
line."""

import hashlib
import json
import os
import shutil
import signal

import pytest
import torch

from conftest import assert_one_error_line, check_ok, run_here, tiny_model
from gptkit.base.errors import RunStopped, UserError
from gptkit.interp.features import (ActivationStream, Recipe, features_off, load_sae, measure, recovered, save_sae,
                                    site_activations, site_hook, spliced, train_sae, weights_fingerprint,
                                    weights_of)
from gptkit.interp.hooks import hooked
from gptkit.interp.sae import SparseAutoencoder, Trainer, activation_scale

def matches(text, pattern):
    """Whether text is pattern, each '*' standing for any run of characters (brackets taken as they are)."""
    parts = pattern.split("*")
    if not text.startswith(parts[0]) or not text.endswith(parts[-1]):
        return False
    at = len(parts[0])
    for part in parts[1:-1]:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return at <= len(text) - len(parts[-1]) or len(parts) == 1


SMALL = ["--tokens=4096", "--batch=256", "--features=64", "--k=4", "--eval_tokens=256", "--show=5"]


# ----------------------------------------------------------------------------- the autoencoder


def planted(n, d, d_true, active, generator):
    """n activations, each a sum of `active` of d_true known unit directions with random positive weights."""
    directions = torch.nn.functional.normalize(torch.randn(d_true, d, generator=generator), dim=-1)
    picks = torch.rand(n, d_true, generator=generator).argsort(-1)[:, :active]
    weights = torch.zeros(n, d_true).scatter(1, picks, 1 + torch.rand(n, active, generator=generator))
    return weights @ directions, directions


def test_planted_features_are_found():
    """On activations built from 64 known sparse directions, the SAE's decoder rows recover at least 90% of
    them with cosine ≥ 0.9."""
    g = torch.Generator().manual_seed(0)
    data, truth = planted(60_000, 32, 64, 3, g)
    sae = SparseAutoencoder(32, 128, 3, torch.Generator().manual_seed(1))
    scale = activation_scale(data[:2048])
    with torch.no_grad():
        sae.b_dec.copy_(data[:2048].mean(0) * scale)
    trainer = Trainer(sae, 3e-3, 3 * 60_000 // 512, dead_after=20_000)
    for epoch in range(3):
        for start in range(0, 60_000, 512):
            trainer.train_step(data[start:start + 512] * scale)
    best = (truth @ torch.nn.functional.normalize(sae.W_dec.detach(), dim=-1).T).max(1).values
    assert (best >= 0.9).float().mean() >= 0.9, best


def test_the_sparse_path_is_the_dense_one_and_k_features_are_kept():
    sae = SparseAutoencoder(16, 64, 5, torch.Generator().manual_seed(0))
    x = torch.randn(7, 3, 16)
    f = sae.encode(x)
    assert f.shape == (7, 3, 64) and ((f > 0).sum(-1) <= 5).all() and (f >= 0).all()
    torch.testing.assert_close(sae(x), sae.decode(f))


def test_a_scale_folded_in_reads_raw_activations_as_the_scaled_ones_were_read():
    sae = SparseAutoencoder(16, 64, 5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.b_enc.normal_()
    x, scale = torch.randn(50, 16), 3.7
    before_f, before_x = sae.encode(x * scale), sae(x * scale) / scale
    sae.fold_scale(scale)
    torch.testing.assert_close(sae.encode(x), before_f, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sae(x), before_x, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- on a model


def test_an_activation_read_within_a_context_is_the_one_arriving_at_its_hook():
    """The explorer reads an SAE's input with parts switched off (meanwhile): those before the hook change what
    arrives; one at the hook itself acts after the read; none of them stays on the model."""
    model = tiny_model()
    hook, idx = site_hook(model, 1, "resid_post"), torch.randint(0, 37, (2, 9))
    plain = site_activations(model, idx, hook)

    def zero(y, name):
        return torch.zeros_like(y)

    at_hook = site_activations(model, idx, hook, hooked(model, {hook: zero}))
    before = site_activations(model, idx, hook, hooked(model, {"blocks.0.hook_resid_post": zero}))
    torch.testing.assert_close(at_hook, plain)
    assert not torch.allclose(before, plain)
    torch.testing.assert_close(site_activations(model, idx, hook), plain)


def test_switching_features_off_subtracts_exactly_their_decoded_contribution():
    model = tiny_model()
    hook = site_hook(model, 1, "resid_post")
    idx = torch.randint(0, 37, (2, 9))
    x = site_activations(model, idx, hook)
    sae = SparseAutoencoder(x.size(-1), 64, 6, torch.Generator().manual_seed(0))
    f = sae.encode(x)
    off = [int(f.flatten(0, 1).sum(0).argmax()), 3]
    seen = {}
    with hooked(model, [(hook, features_off(sae, off)), (hook, lambda y, name: seen.setdefault("y", y))]):
        model(idx)
    expected = x - f[..., off] @ sae.W_dec[off].detach()
    torch.testing.assert_close(seen["y"], expected)
    assert not torch.equal(seen["y"], x)  # a feature that fires was switched off


def exact_sae(d):
    """An SAE whose reconstruction is the activation itself: features ±each coordinate, k = d keeps the d that
    are ≥ 0."""
    sae = SparseAutoencoder(d, 2 * d, d)
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def test_ce_loss_recovered_is_1_for_a_perfect_reconstruction_and_0_for_none():
    model = tiny_model()
    hook = site_hook(model, 0, "resid_post")
    idx, targets = torch.randint(0, 37, (3, 16)), torch.randint(0, 37, (3, 16))
    perfect = measure(model, exact_sae(32), hook, idx, targets, 0.0)
    assert perfect.explained_variance == pytest.approx(1.0, abs=1e-5)
    assert perfect.ce_loss_recovered == pytest.approx(1.0, abs=1e-4) and abs(perfect.delta_loss) < 1e-5
    nothing = exact_sae(32)
    with torch.no_grad():
        nothing.W_dec.zero_()
    none = measure(model, nothing, hook, idx, targets, 0.0)
    assert none.ce_loss_recovered == pytest.approx(0.0, abs=1e-6) and none.spliced_loss == none.zero_loss
    assert recovered(2.0, 3.0, 4.0) == 0.5


def test_splicing_puts_the_reconstruction_in_place_of_the_activation():
    model = tiny_model()
    hook = site_hook(model, 1, "resid_mid")
    idx = torch.randint(0, 37, (2, 8))
    sae = SparseAutoencoder(32, 64, 4, torch.Generator().manual_seed(0))
    seen = {}
    with hooked(model, [(hook, spliced(sae)), (hook, lambda y, name: seen.setdefault("y", y))]):
        model(idx)
    torch.testing.assert_close(seen["y"], sae(site_activations(model, idx, hook)))


@pytest.mark.parametrize("layer, site, expected", [
    (2, "resid_post", "layer 2 is out of range: the model has 2 layers, 0 to 1"),
    (0, "resid", "unknown site 'resid'; choose one of resid_post, resid_mid, mlp_out, attn_out"),
])
def test_a_layer_or_site_that_is_not_there_is_one_line(layer, site, expected):
    with pytest.raises(UserError, match=f"^{expected}$"):
        site_hook(tiny_model(), layer, site)


def test_a_site_the_model_lacks_is_one_line():
    with pytest.raises(UserError, match=r"this model has no mlp_out \(it was built with mlp=False\)"):
        site_hook(tiny_model(mlp=False), 0, "mlp_out")


# ----------------------------------------------------------------------------- the files


def small_sae(trained_run, tmp_path):
    """The session's trained run copied, with a small SAE trained on it by analyze.py features."""
    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    proc = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--json"))
    return out, json.loads(proc.stdout), out / "sae" / "blocks.1.hook_resid_post"


def test_sae_lens_loads_the_saved_sae_and_reconstructs_the_same_activations(trained_run, tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    from gptkit.interp.experiments import open_run

    out, answer, folder = small_sae(trained_run, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [".features.lock", "cfg.json", "features.html", "features.json",
                                                        "gptkit.json", "sae_weights.safetensors"]
    run = open_run(out)
    ours, _, _ = load_sae(folder, run)
    theirs = sae_lens.SAE.load_from_disk(str(folder), device="cpu")
    assert type(theirs).__name__ == "TopKSAE" and theirs.cfg.k == 4 and theirs.cfg.d_sae == 64
    x = site_activations(run.model, torch.randint(0, run.config.vocab_size, (4, 32)), "blocks.1.hook_resid_post")
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), ours.encode(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(theirs.decode(theirs.encode(x)), ours(x), rtol=0, atol=1e-5)
    assert set(answer["metrics"]) == {"l0", "explained_variance", "ce_loss_recovered", "delta_loss", "dead_fraction"}
    assert len(answer["features"]) == 5
    assert {"index", "frequency", "contexts", "promotes", "demotes"} <= set(answer["features"][0])


def test_a_second_run_reads_the_saved_sae_and_a_damaged_or_foreign_one_is_one_line(trained_run, tmp_path):
    out, first, folder = small_sae(trained_run, tmp_path)
    again = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--json"))
    assert json.loads(again.stdout)["metrics"] == first["metrics"] and "trained earlier" in again.stderr
    other = run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--k=5")
    assert_one_error_line(other.stderr, f"error: {folder} holds an SAE trained with other settings (k=4); *")

    weights = folder / "sae_weights.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    assert_one_error_line(run_here("analyze.py", "features", out, "--layer=1", *SMALL).stderr,
                          f"error: {weights} is damaged or was edited *")

    foreign = tmp_path / "foreign"
    shutil.copytree(trained_run[0], foreign)
    shutil.copytree(small_sae(trained_run, tmp_path / "b")[2], foreign / "sae" / "blocks.1.hook_resid_post")
    from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
    ckpt = load_checkpoint(foreign / "best.pt")
    ckpt["model"] = {k: v + 0.01 for k, v in ckpt["model"].items()}
    save_checkpoint(ckpt, foreign / "best.pt")
    line = assert_one_error_line(run_here("analyze.py", "features", foreign, "--layer=1", *SMALL).stderr)
    assert "was trained on other weights than this run's checkpoint" in line


def train_split(run):
    """The train split of the run's dataset, in windows of its block size."""
    from gptkit.data.dataset import Split, load_meta

    folder, meta = load_meta(run.trained_on["data_dir"], run.trained_on["dataset"])
    return Split(folder, "train", meta, run.config.block_size)


RECIPE = Recipe("blocks.1.hook_resid_post", 64, 4, 256 * 12, 256, 2e-3, 0)


def stop_at_step_5(run, folder, monkeypatch, recipe=RECIPE, made=False):
    """A training of recipe in folder (made already, or made now) stopped by Ctrl-C during its fifth step, its
    state saved."""
    step = Trainer.train_step

    def stop_at_5(self, x):
        if self.step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, x)
    monkeypatch.setattr(Trainer, "train_step", stop_at_5)
    folder.mkdir(parents=True, exist_ok=made)
    with pytest.raises(RunStopped, match=f"stopped by SIGINT at step 5 of {recipe.steps}, saved in .*training.pt"):
        train_sae(run.model, train_split(run), recipe, folder, weights_of(run))
    monkeypatch.setattr(Trainer, "train_step", step)


def assert_same_weights(a, b):
    for name, p in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], p, rtol=0, atol=0)


def test_a_stopped_training_continues_to_the_same_weights(trained_run, tmp_path, monkeypatch):
    from gptkit.interp.experiments import open_run

    run = open_run(trained_run[0])
    whole, _, _ = train_sae(run.model, train_split(run), RECIPE, tmp_path / "whole", weights_of(run),
                            say=lambda line: None)
    stop_at_step_5(run, tmp_path / "stopped", monkeypatch)
    lines = []
    continued, _, _ = train_sae(run.model, train_split(run), RECIPE, tmp_path / "stopped", weights_of(run),
                                say=lines.append)
    assert lines == ["continuing the stopped training at step 5 of 12"]
    assert_same_weights(whole, continued)


def test_a_stopped_training_on_weights_trained_since_starts_again_and_says_why(trained_run, tmp_path, monkeypatch):
    """Continued after the run trained further, a training would mix two models' activations and claim the new
    weights: it starts again on them, with one line naming the iterations."""
    from gptkit.interp.experiments import open_run

    run = open_run(trained_run[0])
    stop_at_step_5(run, tmp_path / "stopped", monkeypatch)
    with torch.no_grad():
        run.model.lm_head.weight.mul_(1.5)
        run.model.transformer.h[0].attn.c_proj.weight.mul_(1.5)
    later = run.iteration
    run.iteration += 10  # best.pt as the run left it ten steps later
    fresh, _, _ = train_sae(run.model, train_split(run), RECIPE, tmp_path / "fresh", weights_of(run),
                            say=lambda line: None)
    lines = []
    again, _, _ = train_sae(run.model, train_split(run), RECIPE, tmp_path / "stopped", weights_of(run),
                            say=lines.append)
    state = tmp_path / "stopped" / "training.pt"
    assert lines == [f"note: the stopped training in {state} was trained on best.pt as it was at iteration "
                     f"{later}; it now holds iteration {later + 10}'s weights; starting it again on these weights"]
    assert_same_weights(fresh, again)


def test_progress_is_told_in_lines_where_stderr_is_a_file(trained_run, tmp_path, monkeypatch, capsys):
    """Trained with stderr in a file (no terminal), the SAE says how far it is, here at every step."""
    from gptkit.base import progress
    from gptkit.interp.experiments import open_run

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0)
    run = open_run(trained_run[0])
    train_sae(run.model, train_split(run), RECIPE, tmp_path / "sae", weights_of(run))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 12
    assert lines[4].startswith(f"training an SAE on {RECIPE.hook}: 5/12 step (42%), ")
    assert "elapsed, about " in lines[4]


def test_the_stream_never_holds_more_than_its_buffer(trained_run):
    from gptkit.data.dataset import Split, load_meta
    from gptkit.interp.experiments import open_run

    run = open_run(trained_run[0])
    folder, meta = load_meta(run.trained_on["data_dir"], run.trained_on["dataset"])
    stream = ActivationStream(run.model, Split(folder, "train", meta, 32), "blocks.0.hook_resid_post", 64,
                              buffer_windows=8)
    for _ in range(50):
        assert stream.next().shape == (64, run.config.n_embd)
        assert stream.buffer.size(0) <= 2 * 64 + 8 * 32 // 2 + 8 * 32


@pytest.mark.parametrize("args, expected", [
    (["--layer=5"], "error: layer 5 is out of range: the model has 2 layers, 0 to 1"),
    (["--site=resid"], "error: unknown site 'resid'; choose one of resid_post, resid_mid, mlp_out, attn_out"),
    (["--k=64", "--features=64"], "error: k must be below features (got k=64, features=64)"),
    (["--k=300"], "error: k must be below features (got k=300, features=256)"),
    (["--tokens=100", "--batch=256"], "error: tokens must be at least one batch of 256 activations to train on *"),
    (["--batch=100000", "--tokens=100000"], "error: the train split has * tokens: too few to train an SAE on *"),
])
def test_mistakes_are_one_line(trained_run, args, expected):
    proc = run_here("analyze.py", "features", trained_run[0], *args)
    line = assert_one_error_line(proc.stderr)
    assert matches(line, expected), line
    assert not (trained_run[0] / "sae").exists()


def test_a_model_without_an_mlp_has_no_mlp_out(tmp_path, data_dir):
    from test_analyze import saved_run

    meta = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))
    out = saved_run(tmp_path / "attn", meta["vocab"], {"dataset": "tiny", "data_dir": str(data_dir)}, mlp=False)
    assert_one_error_line(run_here("analyze.py", "features", out, "--site=mlp_out", *SMALL).stderr,
                          "error: this model has no mlp_out (it was built with mlp=False); choose resid_post or "
                          "attn_out")


def test_the_weights_fingerprint_follows_the_weights():
    a, b = tiny_model(seed=0), tiny_model(seed=0)
    assert weights_fingerprint(a) == weights_fingerprint(b)
    with torch.no_grad():
        b.lm_head.weight[0, 0] += 1e-3
    assert weights_fingerprint(a) != weights_fingerprint(b)


def test_saved_files_refuse_a_link(tmp_path):
    sae = SparseAutoencoder(8, 16, 2)
    (tmp_path / "cfg.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UserError, match="is a link, and the tool writes this file itself"):
        save_sae(tmp_path, sae, "blocks.0.hook_resid_post", "run", {})
    assert not (tmp_path / "elsewhere.json").exists()


def test_the_api_encodes_decodes_and_switches_features_off_with_heads(trained_run, tmp_path):
    """run.features(hook) is the SAE analyze.py saved; features go off in the same `with` block as heads, and
    their effect is the hook's: the activation there minus their decoded contribution."""
    from gptkit.interp.experiments import open_run

    out, answer, folder = small_sae(trained_run, tmp_path)
    run = open_run(out)
    hook = "blocks.1.hook_resid_post"
    f = run.features(hook)
    assert f.d_sae == 64 and f.metrics["explained_variance"] == answer["metrics"]["explained_variance"]
    assert [row["index"] for row in f.table[:5]] == [row["index"] for row in answer["features"]]
    idx = run.to_tokens(torch.randint(0, run.tok.vocab_size, (2, 20)))
    _, cache = run.run_with_cache(idx, hook)
    x = cache[hook]
    acts = f.encode(x)
    torch.testing.assert_close(f.decode(acts), f.sae(x))
    firing = int(acts.flatten(0, 1).sum(0).argmax())
    with run.ablated(heads=["L0H1"], features={hook: [firing]}) as off:
        assert off.label == f"L0H1, {hook} F{firing}"
        _, changed = run.run_with_cache(idx, hook)
        with run.ablated(heads=["L0H1"]):
            _, heads_only = run.run_with_cache(idx, hook)
    expected = heads_only[hook] - f.encode(heads_only[hook])[..., [firing]] @ f.sae.W_dec[[firing]]
    torch.testing.assert_close(changed[hook], expected)


@pytest.mark.parametrize("features, expected", [
    ({"blocks.1.hook_resid_post": [64]}, "feature 64 is out of range: the SAE at blocks.1.hook_resid_post has "
                                         "features 0 to 63"),
    ({"blocks.1.hook_resid_post": [True]}, "features are given by index, a whole number or a list of them*"),
    ({"blocks.0.hook_resid_post": [1]}, "no SAE in */sae/blocks.0.hook_resid_post; train one with*"),
    ({"nowhere": [1]}, "features are read at a hook point of the model, e.g. 'blocks.0.hook_resid_post'; got*"),
    ([1, 2], "features to switch off are given as {hook: [index, ...]}*"),
])
def test_features_that_name_nothing_are_one_line(trained_run, tmp_path, features, expected):
    from gptkit.interp.experiments import open_run

    out, _, _ = small_sae(trained_run, tmp_path)
    with pytest.raises(UserError) as e:
        with open_run(out).ablated(features=features):
            pass
    assert matches(str(e.value), expected), str(e.value)


def test_a_step_removes_the_gradient_along_each_decoder_row_and_chains_no_graph_onto_it():
    """The decoder's rows are renormalised after each step: their gradient along themselves is removed first, in
    no_grad (done with autograd on, each step's gradient held a graph of the last: memory grew 2 MB a step)."""
    sae = SparseAutoencoder(8, 32, 2, torch.Generator().manual_seed(0))
    trainer = Trainer(sae, 1e-3, 10, 100)
    trainer.opt.step = lambda: None  # the gradient as the step would see it
    trainer.train_step(torch.randn(64, 8))
    grad = sae.W_dec.grad
    assert grad.grad_fn is None and not grad.requires_grad
    torch.testing.assert_close((grad * sae.W_dec.detach()).sum(-1), torch.zeros(32), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- what it needs, and its answers


def test_safetensors_is_installed_with_the_tool_not_only_with_its_tests():
    """analyze.py features saves and reads the SAE's weights with safetensors: requirements.txt names it."""
    from conftest import REPO

    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert "safetensors" in {line.split("#")[0].strip().split("=")[0] for line in lines}


def strict_json(text):
    """JSON as a strict parser reads it: NaN and Infinity, which Python's json writes, are refused."""
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_figure_that_cannot_be_computed_is_null_with_its_reason(tmp_path, data_dir):
    """At a site that is zero at every token (an MLP whose output projection starts at zero, as a run at step 0
    has), explained variance and CE loss recovered cannot be computed: null in --json and in gptkit.json, each
    with a note, and 'n/a (why)' in the table."""
    from test_analyze import saved_run

    meta = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))
    out = saved_run(tmp_path / "zero", meta["vocab"], {"dataset": "tiny", "data_dir": str(data_dir)},
                    zero_init_proj=True)
    proc = check_ok(run_here("analyze.py", "features", out, "--layer=0", "--site=mlp_out", *SMALL, "--json"))
    metrics = strict_json(proc.stdout)["metrics"]
    hook = "blocks.0.hook_mlp_out"
    assert metrics["explained_variance"] is None and metrics["ce_loss_recovered"] is None
    assert metrics["explained_variance_note"] == (f"the activations at {hook} are the same at every token, so "
                                                  "there is no variance to explain")
    assert metrics["ce_loss_recovered_note"] == (f"zeroing {hook} leaves the loss as it is, so there is no loss "
                                                 "to recover")
    assert strict_json((out / "sae" / hook / "gptkit.json").read_text())["metrics"]["explained_variance"] is None
    again = check_ok(run_here("analyze.py", "features", out, "--layer=0", "--site=mlp_out", *SMALL))
    assert f"explained variance n/a (the activations at {hook} are the same at every token" in again.stdout


def test_the_feature_page_says_what_it_lists_and_keeps_each_context_on_its_line(trained_run, tmp_path):
    _, answer, folder = small_sae(trained_run, tmp_path)
    page = (folder / "features.html").read_text(encoding="utf-8")
    assert "<title>5 of 64 features of blocks.1.hook_resid_post</title>" in page
    assert "<h1>5 of 64 features of blocks.1.hook_resid_post, k=4: those that fire most often</h1>" in page
    assert any("\n" in "".join(c[:3]) for row in answer["features"] for c in row["contexts"]), "no newline to show"
    items = [line for line in page.splitlines() if "<li>" in line or "</li>" in line]
    assert items and all(line.count("<li>") == line.count("</li>") for line in items)  # a context never breaks
    assert "↵" in page


def test_a_stopped_training_says_so_on_stderr_and_json_stays_alone_on_stdout(trained_run, tmp_path, monkeypatch):
    from gptkit.interp.experiments import open_run

    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    run = open_run(out)
    recipe = Recipe(RECIPE.hook, 64, 4, 4096, 256, 2e-3, 0)  # SMALL's
    stop_at_step_5(run, out / "sae" / recipe.hook, monkeypatch, recipe)
    proc = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--json"))
    assert strict_json(proc.stdout)["hook"] == recipe.hook
    assert "continuing the stopped training at step 5 of 16" in proc.stderr


def test_a_training_stopped_under_start_over_is_continued_by_the_same_command(saved, tmp_path, monkeypatch):
    """Its line says the same command continues it: with --start_over=True given again, it does (to the weights a
    start from scratch gives), rather than deleting its state and training from the start again."""
    from gptkit.interp.experiments import open_run

    out = tmp_path / "run"
    shutil.copytree(saved, out)
    recipe = Recipe(RECIPE.hook, 64, 4, 4096, 256, 2e-3, 1)  # SMALL's, another seed: the SAE there is replaced
    stop_at_step_5(open_run(out), out / "sae" / HOOK, monkeypatch, recipe, made=True)
    proc = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--seed=1", "--start_over=True"))
    assert "continuing the stopped training at step 5 of 16" in proc.stderr
    fresh = tmp_path / "fresh"
    shutil.copytree(saved, fresh)
    check_ok(run_here("analyze.py", "features", fresh, "--layer=1", *SMALL, "--seed=1", "--start_over=True"))
    for name in ("sae_weights.safetensors", "features.json"):
        assert (out / "sae" / HOOK / name).read_bytes() == (fresh / "sae" / HOOK / name).read_bytes()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_trained_sae_is_measured_is_one_line_and_keeps_its_training(saved, tmp_path, monkeypatch,
                                                                                      signum):
    """After the last step, the SAE is measured and its rows found before it is saved: a stop then says so in one
    line, and the same command takes the trained state up and saves the SAE an unstopped command saves."""
    import gptkit.interp.features as features

    out = tmp_path / "run"
    shutil.copytree(saved, out)
    shutil.rmtree(out / "sae")
    measure = features.measure

    def unheard(s, frame):  # where the command hears no SIGTERM, its default would end pytest itself
        raise AssertionError("SIGTERM was not taken as a stop")

    monkeypatch.setattr(features, "measure", lambda *a: (os.kill(os.getpid(), signum), measure(*a))[1])
    outside = signal.signal(signal.SIGTERM, unheard)
    try:
        proc = run_here("analyze.py", "features", out, "--layer=1", *SMALL)
    finally:
        signal.signal(signal.SIGTERM, outside)
    state = out / "sae" / HOOK / "training.pt"
    assert_one_error_line(proc.stderr, f"error: stopped by {signal.Signals(signum).name} while measuring the SAE; "
                                       f"its training is saved in {state}, and the same command measures and saves it")
    assert proc.returncode == 128 + signum and state.is_file()
    monkeypatch.setattr(features, "measure", measure)
    again = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL))
    assert "continuing the stopped training at step 16 of 16" in again.stderr and not state.exists()
    for name in ("sae_weights.safetensors", "features.json"):
        assert (out / "sae" / HOOK / name).read_bytes() == (saved / "sae" / HOOK / name).read_bytes()


def test_a_stop_while_the_sae_is_saved_is_taken_once_its_files_are_all_saved(saved, tmp_path, monkeypatch):
    """Some of its files alone would be refused by the next command as not an SAE this tool saved."""
    import gptkit.interp.features as features

    out = tmp_path / "run"
    shutil.copytree(saved, out)
    shutil.rmtree(out / "sae")
    write, calls = features.write_whole, []

    def stopped_midway(path, data, **how):  # Ctrl-C as the second of its files is written
        calls.append(path)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        write(path, data, **how)

    monkeypatch.setattr(features, "write_whole", stopped_midway)
    check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL))
    monkeypatch.setattr(features, "write_whole", write)
    assert "the SAE trained earlier" in check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL)).stderr


# ----------------------------------------------------------------------------- each checkpoint's SAE


HOOK = "blocks.1.hook_resid_post"


def changed_weights(path, iterations=0):
    """The checkpoint at path with other weights, and iter_num moved on by `iterations`."""
    from gptkit.run.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(path)
    ckpt["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in ckpt["model"].items()}
    ckpt["iter_num"] += iterations
    save_checkpoint(ckpt, path)
    return ckpt["iter_num"]


def test_saes_of_two_checkpoints_live_side_by_side_and_one_in_anothers_place_is_named(run):
    """best.pt's SAE in sae/<hook>/, latest.pt's in sae/latest/<hook>/: neither replaces the other, the plain
    command and the API read each checkpoint's own, and one moved into best.pt's place names the checkpoint it
    belongs to."""
    from gptkit.interp.experiments import open_run

    changed_weights(run / "latest.pt")
    best = strict_json(check_ok(run_here("analyze.py", "features", run, "--layer=1", *SMALL, "--json")).stdout)
    latest = check_ok(run_here("analyze.py", "features", run, "--layer=1", *SMALL, "--checkpoint=latest",
                               "--json"))
    assert strict_json(latest.stdout)["folder"] == str(run / "sae" / "latest" / HOOK)
    assert best["folder"] == str(run / "sae" / HOOK)
    again = check_ok(run_here("analyze.py", "features", run, "--layer=1", *SMALL, "--json"))
    assert "the SAE trained earlier, from " + str(run / "sae" / HOOK) in again.stderr
    assert strict_json(again.stdout)["metrics"] == best["metrics"]
    of_best, of_latest = open_run(run).features(HOOK), open_run(run, "latest").features(HOOK)
    assert of_best.metrics["clean_loss"] != of_latest.metrics["clean_loss"]

    shutil.rmtree(run / "sae" / HOOK)
    (run / "sae" / "latest" / HOOK).rename(run / "sae" / HOOK)
    assert_one_error_line(run_here("analyze.py", "features", run, "--layer=1", *SMALL).stderr,
                          f"error: the SAE in {run / 'sae' / HOOK} belongs to latest.pt (--checkpoint=latest), "
                          f"not to best.pt: move it to {run / 'sae' / 'latest' / HOOK}, where that checkpoint's "
                          "SAE is read, or train one on these weights with --start_over=True")


def test_an_sae_of_weights_the_run_trained_past_names_both_iterations(run):
    check_ok(run_here("analyze.py", "features", run, "--layer=1", *SMALL))
    was = changed_weights(run / "best.pt", iterations=30) - 30
    assert_one_error_line(run_here("analyze.py", "features", run, "--layer=1", *SMALL).stderr,
                          f"error: the SAE in {run / 'sae' / HOOK} was trained on best.pt as it was at "
                          f"iteration {was}; it now holds iteration {was + 30}'s weights; train it again on these "
                          "weights with --start_over=True")


# ----------------------------------------------------------------------------- the files, checked


@pytest.fixture(scope="module")
def saved(trained_run, tmp_path_factory):
    """A copy of the session's run with a small SAE at HOOK, trained once for the tests that damage a copy."""
    out = tmp_path_factory.mktemp("saved") / "run"
    shutil.copytree(trained_run[0], out)
    check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL))
    return out


def sealed(folder, name, change):
    """The SAE in folder with file `name` changed by change(its content) and every checksum made to match it:
    damaged as a learner who knows the format would, or tampered consistently."""
    from safetensors.torch import load_file, save_file

    from gptkit.interp.features import own_checksum

    ours = json.loads((folder / "gptkit.json").read_text(encoding="utf-8"))
    if name == "gptkit.json":
        change(ours)
    elif name == "sae_weights.safetensors":
        state = load_file(folder / name)
        change(state)
        save_file(state, folder / name)
    else:
        content = json.loads((folder / name).read_text(encoding="utf-8"))
        change(content)
        (folder / name).write_text(json.dumps(content), encoding="utf-8")
    for kept in ours.get("files", {}):
        if (folder / kept).is_file():  # a name ours lists, even one outside the folder
            ours["files"][kept] = hashlib.sha256((folder / kept).read_bytes()).hexdigest()
    ours["checksum"] = own_checksum(ours)
    (folder / "gptkit.json").write_text(json.dumps(ours), encoding="utf-8")


def nan_at(name):
    def change(state):
        state[name].view(-1)[0] = float("nan")
    return change


OUTSIDE = "../../../outside.txt"  # a file of the user's, beside the run, that a gptkit.json names
DAMAGES = [  # (the file, its change, what the line says is wrong with it)
    ("gptkit.json", lambda o: o.pop("metrics"), "it has no metrics"),
    ("gptkit.json", lambda o: o["metrics"].pop("dead_fraction"), "metrics has no dead_fraction"),
    ("gptkit.json", lambda o: o["metrics"].update(dead_fraction=float("nan")),
     "metrics.dead_fraction is nan, not a number from 0 to 1"),
    ("gptkit.json", lambda o: o["files"].update({OUTSIDE: ""}),
     f"its files name '{OUTSIDE}', not one of the SAE's own"),
    ("gptkit.json", lambda o: o.update(format=3), "format is 3, not a format this tool reads"),
    ("gptkit.json", lambda o: o["recipe"].update(k=0), "recipe.k is 0, not a whole number"),
    ("gptkit.json", lambda o: o.update(run_weights=1), "run_weights is 1, not a sha256"),
    ("cfg.json", lambda c: c.update(k=0), "k is 0, not a whole number of at least 1"),
    ("cfg.json", lambda c: c.update(k=64), "k is 64, not below d_sae (64)"),
    ("cfg.json", lambda c: c.update(d_in="32"), "d_in is '32', not a whole number of at least 1"),
    ("cfg.json", lambda c: c.update(d_in=16), "d_in is 16, not the model's width at the hook"),
    ("cfg.json", lambda c: c.pop("metadata"), "it has no metadata"),
    ("sae_weights.safetensors", nan_at("W_enc"), "W_enc holds numbers that are not finite (NaN or infinity)"),
    ("sae_weights.safetensors", lambda s: s.pop("b_enc"),
     "it holds W_dec, W_enc, b_dec, not W_enc, b_enc, W_dec, b_dec"),
    ("sae_weights.safetensors", lambda s: s.update(b_dec=s["b_dec"].double()),
     "b_dec is float64 (32,), not float32 (32,)"),
    ("features.json", lambda t: t[0].update(frequency="often"),
     "rows[0].frequency is 'often', not a number from 0 to 1"),
    ("features.json", lambda t: t[1].update(index=64), "its rows are not of distinct features 0 to 63"),
]


@pytest.mark.parametrize("name, change, what", DAMAGES, ids=[d[2][:40] for d in DAMAGES])
def test_a_damaged_or_consistently_tampered_file_is_one_line(saved, tmp_path, name, change, what):
    """Every checksum made to match, a wrong type, a missing key, NaN weights or a value out of range is still
    one line naming the file and what is wrong: never a traceback, never used."""
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    (tmp_path / "outside.txt").write_text("the user's own\n")  # OUTSIDE, seen from the SAE's folder
    sealed(out / "sae" / HOOK, name, change)
    proc = run_here("analyze.py", "features", out, "--layer=1", *SMALL)
    assert_one_error_line(proc.stderr, f"error: {out / 'sae' / HOOK / name} is damaged: {what}*")
    assert (tmp_path / "outside.txt").read_text() == "the user's own\n"


def test_gptkit_json_edited_without_its_checksum_is_one_line(saved, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    path = out / "sae" / HOOK / "gptkit.json"
    ours = json.loads(path.read_text(encoding="utf-8"))
    ours["metrics"]["explained_variance"] = 0.99
    path.write_text(json.dumps(ours), encoding="utf-8")
    assert_one_error_line(run_here("analyze.py", "features", out, "--layer=1", *SMALL).stderr,
                          f"error: {path} is damaged: it was edited (its checksum differs from the one saved "
                          "with it); train the SAE again with --start_over=True")
    check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--start_over=True"))


def test_files_no_gptkit_json_claims_are_refused_and_replaced_only_with_start_over(trained_run, saved, tmp_path):
    """Another tool's SAE at the names an SAE writes (SAELens's own files), or one whose gptkit.json was deleted,
    is the user's: one line naming them, never overwritten, until --start_over=True replaces them with a note."""
    theirs = tmp_path / "theirs"
    shutil.copytree(trained_run[0], theirs)
    folder = theirs / "sae" / HOOK
    folder.mkdir(parents=True)
    mine = {"cfg.json": '{"d_in": 64, "d_sae": 512}', "sae_weights.safetensors": "my weights",
            "features.json": '["my rows"]'}
    for name, text in mine.items():
        (folder / name).write_text(text)
    assert_one_error_line(run_here("analyze.py", "features", theirs, "--layer=1", *SMALL).stderr,
                          f"error: {folder} holds sae_weights.safetensors, cfg.json, features.json but no "
                          "gptkit.json: not an SAE this tool saved, or one whose gptkit.json was deleted; move them "
                          "elsewhere, or pass --start_over=True to replace them")
    assert {name: (folder / name).read_text() for name in mine} == mine

    out = tmp_path / "run"
    shutil.copytree(saved, out)
    (out / "sae" / HOOK / "gptkit.json").unlink()
    line = assert_one_error_line(run_here("analyze.py", "features", out, "--layer=1", *SMALL).stderr)
    assert "cfg.json, features.json, features.html but no gptkit.json" in line
    proc = check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--start_over=True"))
    assert f"note: replacing the SAE in {out / 'sae' / HOOK} (--start_over=True)" in proc.stderr
    assert (out / "sae" / HOOK / "gptkit.json").is_file()


def test_a_second_features_on_the_same_folder_is_one_line_and_writes_nothing(trained_run, tmp_path):
    """Two trainings in one SAE folder would each write their files over the other's (an SAE of one recipe and
    gptkit.json of the other, the one that said it saved its SAE finding it replaced): the second stops at once."""
    import fcntl

    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    folder = out / "sae" / HOOK
    folder.mkdir(parents=True)
    with open(folder / ".features.lock", "w") as held:  # as a first analyze.py features holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        proc = run_here("analyze.py", "features", out, "--layer=1", *SMALL)
    assert_one_error_line(proc.stderr, f"error: {folder} is in use by another analyze.py features (process 4242); "
                                       "wait for it to end")
    assert [p.name for p in folder.iterdir()] == [".features.lock"]
    check_ok(run_here("analyze.py", "features", out, "--layer=1", *SMALL))  # once it is free
    assert (folder / "gptkit.json").is_file()


def test_features_refused_before_training_leaves_no_folder_for_its_lock(trained_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    proc = run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--batch=4096")  # its split holds less
    assert "too few to train an SAE on batches of 4,096" in assert_one_error_line(proc.stderr)
    assert not (out / "sae").exists()


@pytest.mark.parametrize("kind", ["link", "pipe"])
def test_a_link_or_a_pipe_in_place_of_a_file_is_one_line_and_never_read(saved, tmp_path, kind):
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    path = out / "sae" / HOOK / "features.json"
    if kind == "link":
        shutil.copy(path, tmp_path / "elsewhere.json")
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere.json")
        expected = f"error: {path} is a link; an SAE's files are its own, never read or written through a link: " \
                   "remove it"
    else:
        path.unlink()
        os.mkfifo(path)  # read, it would wait for a writer for ever
        expected = f"error: {path} is not a regular file (a pipe, a device or a folder); remove it"
    assert_one_error_line(run_here("analyze.py", "features", out, "--layer=1", *SMALL).stderr, expected)


@pytest.mark.parametrize("where", ["sae", "sae/latest"])
def test_an_sae_folder_that_is_a_link_is_one_line_and_nothing_is_written_through_it(trained_run, tmp_path, where):
    """out/sae (or the folder of latest.pt's SAEs) linked to another run's: training there would write the SAE into
    that run's folder."""
    out, theirs = tmp_path / "run", tmp_path / "theirs"
    shutil.copytree(trained_run[0], out)
    theirs.mkdir()
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    (out / where).symlink_to(theirs)
    proc = run_here("analyze.py", "features", out, "--layer=1", *SMALL, "--checkpoint=latest")
    assert_one_error_line(proc.stderr, f"error: {out / where} is a link; an SAE's files are kept in its run's own "
                                       "folder, never read or written through a link: remove it")
    assert list(theirs.iterdir()) == []


# ----------------------------------------------------------------------------- shapes and sizes


def test_encode_refuses_a_tensor_of_no_dimension_or_another_width_naming_the_shape():
    from gptkit.interp.features import Features

    sae = SparseAutoencoder(8, 16, 2)
    f = Features(sae, "blocks.0.hook_resid_post", {"metrics": {}}, [])
    for x in (torch.tensor(1.0), torch.zeros(3, 7)):
        with pytest.raises(UserError) as e:
            f.encode(x)
        assert str(e.value) == ("the SAE reads activations it encodes as a tensor of shape (..., 8), 8 numbers a "
                                f"token; got one of shape {tuple(x.shape)}")
    with pytest.raises(UserError, match=r"^the SAE reads feature values it decodes as a tensor of shape"):
        f.decode(torch.zeros(4))
    with pytest.raises(UserError, match="^activations are numbers .*; got a str$"):
        f.encode("abc")
    assert f.encode(torch.zeros(8)).shape == (16,)


def test_an_sae_too_large_for_memory_is_one_line_before_any_work(trained_run):
    proc = run_here("analyze.py", "features", trained_run[0], "--layer=1", "--features=1000000000",
                    "--tokens=4096", "--batch=256")
    line = assert_one_error_line(proc.stderr)
    assert matches(line, "error: an SAE of 1,000,000,000 features on blocks.1.hook_resid_post would need about * "
                         "of memory to train and measure, more than the * free here; the largest --features that "
                         "fits is about *"), line
    assert not (trained_run[0] / "sae").exists()


def test_the_largest_features_said_to_fit_is_the_largest_that_passes(monkeypatch):
    import dataclasses

    from gptkit.interp import features

    monkeypatch.setattr(features, "free_memory", lambda: 2 ** 30)
    idx = torch.zeros(8, 32, dtype=torch.long)
    recipe = Recipe(HOOK, 10 ** 6, 16, 4096, 256, 2e-3, 0)
    with pytest.raises(UserError, match="more than the 1.0 GiB free here") as e:
        features.check_memory(recipe, 32, idx, 65)
    largest = int(str(e.value).rpartition("about ")[2].replace(",", ""))
    features.check_memory(dataclasses.replace(recipe, features=largest), 32, idx, 65)
    with pytest.raises(UserError):
        features.check_memory(dataclasses.replace(recipe, features=largest + 1), 32, idx, 65)


def test_a_chat_model_s_markers_are_shown_by_name_in_a_feature_s_contexts_and_tokens():
    """Its rows showed the markers' private-use characters, which no font draws, where every other tool writes
    <|user|>: in analyze.py features' table and page, and the explorer's feature rows."""
    from gptkit.data.conversations import MARKERS
    from gptkit.data.tokenizer import CharTokenizer
    from gptkit.interp.features import feature_rows

    tok = CharTokenizer("".join(sorted(set("0123456789+ab\n"))) + "".join(MARKERS.values()))
    model = tiny_model(vocab_size=tok.vocab_size)
    sae = SparseAutoencoder(model.config.n_embd, 8, 4, torch.Generator().manual_seed(0))
    idx = torch.tensor([tok.encode("".join(MARKERS.values()) * 3 + "12+3")] * 2)
    rows = feature_rows(model, tok, sae, "blocks.0.hook_resid_post", idx, 8, width=4)
    shown = json.dumps([[*r["promotes"], *r["demotes"], *(t for c in r["contexts"] for t in c[:3])] for r in rows],
                       ensure_ascii=False)
    assert not any(c in shown for c in MARKERS.values()) and "<|user|>" in shown
