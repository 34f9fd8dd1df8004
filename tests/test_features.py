"""Sparse autoencoders on a run (gptkit/interp/sae.py, gptkit/interp/features.py, analyze.py features): planted
features found, features switched off by exactly their decoded contribution, CE loss recovered at its two ends, the
saved files read by SAELens as they are, a stopped training continued to the same weights, and each mistake one
line."""

import json
import os
import shutil
import signal

import pytest
import torch

from conftest import assert_one_error_line, check_ok, run_here, tiny_model
from gptkit.base.errors import RunStopped, UserError
from gptkit.interp.features import (ActivationStream, Recipe, features_off, load_sae, measure, recovered, save_sae,
                                    site_activations, site_hook, spliced, train_sae, weights_fingerprint)
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
    assert sorted(p.name for p in folder.iterdir()) == ["cfg.json", "features.html", "features.json", "gptkit.json",
                                                        "sae_weights.safetensors"]
    run = open_run(out)
    ours, _, _ = load_sae(folder, run.model)
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


def test_a_stopped_training_continues_to_the_same_weights(trained_run, tmp_path, monkeypatch):
    from gptkit.data.dataset import Split, load_meta
    from gptkit.interp.experiments import open_run

    run = open_run(trained_run[0])
    folder, meta = load_meta(run.trained_on["data_dir"], run.trained_on["dataset"])
    split = Split(folder, "train", meta, run.config.block_size)
    recipe = Recipe("blocks.1.hook_resid_post", 64, 4, 256 * 12, 256, 2e-3, 0)
    whole, _, _ = train_sae(run.model, split, recipe, tmp_path / "whole", say=lambda line: None)

    step = Trainer.train_step

    def stop_at_5(self, x):  # Ctrl-C during the fifth step
        if self.step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, x)
    monkeypatch.setattr(Trainer, "train_step", stop_at_5)
    (tmp_path / "stopped").mkdir()
    with pytest.raises(RunStopped, match="stopped by SIGINT at step 5 of 12, saved in .*training.pt; the same "):
        train_sae(run.model, split, recipe, tmp_path / "stopped")
    monkeypatch.setattr(Trainer, "train_step", step)
    lines = []
    continued, _, _ = train_sae(run.model, split, recipe, tmp_path / "stopped", say=lines.append)
    assert lines == ["continuing the stopped training at step 5 of 12"]
    for name, p in whole.state_dict().items():
        torch.testing.assert_close(continued.state_dict()[name], p, rtol=0, atol=0)


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
