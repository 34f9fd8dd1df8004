"""bench.py's benchmarks (benchmarks/): the throughput comparison runs, the side-by-side tables state the
ratios, and the sampling benchmark reports both decoding rates."""

import json
import math
import os
import re

import pytest
import torch

import bench
from benchmarks import busy, chat_pipeline, common, fair, presets, startup, throughput, train_speed
from gptkit.base.errors import UserError
from model import GPT


def test_throughput_times_the_baseline_and_the_config_in_alternating_rounds(capsys, monkeypatch):
    timed = []
    seconds_per_step = throughput.seconds_per_step
    monkeypatch.setattr(throughput, "seconds_per_step", lambda step, steps, device: timed.append((step, steps)) or
                        seconds_per_step(step, steps, device))
    bench.main(["throughput", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                "--steps=6", "--rounds=3", "--warmup=1", "--compiled=False"])
    out = capsys.readouterr().out
    assert "fp32 AdamW GPT-2" in out and "config/shakespeare_char.py" in out
    baseline, config = timed[0][0], timed[1][0]
    assert baseline is not config and timed == [(baseline, 2), (config, 2)] * 3  # the candidates take turns
    assert re.search(r"throughput ratio, config/shakespeare_char.py: \d+\.\d+x", out)
    assert re.search(r"GFLOP/s = +\d+% of the float32 matmul peak measured here", out)


def test_throughput_times_the_vocabulary_asked_for(monkeypatch):
    """GPT-2's shape is timed with its 50,304-token head: its largest matmul and the loss it feeds."""
    heads = []
    monkeypatch.setattr(GPT, "flops_per_token", lambda model, seq_len: heads.append(model.lm_head.out_features)
                        or 1.0)
    bench.main(["throughput", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                "--vocab_size=97", "--steps=1", "--rounds=1", "--warmup=0", "--compiled=False"])
    assert heads == [97, 97]  # the baseline and the config alike


def test_the_datasheet_mfu_is_added_only_where_the_device_has_a_known_peak(monkeypatch):
    assert throughput.datasheet_mfu(1e12, "cpu", "bfloat16") == ""  # a CPU's peak is measured, never looked up
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    assert throughput.datasheet_mfu(494.5e12, "cuda", "bfloat16") == ", 50.0% MFU of the datasheet's 989 TFLOP/s"
    assert throughput.datasheet_mfu(247.25e12, "cuda", "float32") == ", 50.0% MFU of the datasheet's 494 TFLOP/s"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Some Future GPU")
    assert throughput.datasheet_mfu(1e12, "cuda", "bfloat16") == ""


def test_the_timed_step_is_the_trainings_own(monkeypatch):
    """throughput and dropout time train.py's step: gptkit.training.state's clip, step and clear, with the precision and
    attention path that a fresh run settles."""
    from gptkit.base.settings import parse_config
    from gptkit.training.train_config import TrainConfig

    clips, step_optimizers = [], common.step_optimizers
    monkeypatch.setattr(common, "step_optimizers", lambda model, optimizers, scaler, grad_clip: clips.append(grad_clip)
                        or step_optimizers(model, optimizers, scaler, grad_clip))
    tcfg = parse_config(TrainConfig, ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                                      "--grad_clip=0.5", "--dtype=float32", "--attention_path=written"])
    step, model, dtype, path = common.training_step(tcfg, "cpu", vocab_size=11)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert clips == [0.5] and (dtype, path) == ("float32", "written")
    assert all(p.grad is None for p in model.parameters())  # cleared after the step, as train.py clears them
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_dropout_bench_times_both_rates_and_states_the_share_of_the_steps(tmp_path, capsys):
    config = tmp_path / "tiny.py"
    config.write_text("n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\nbatch_size = 2\ndtype = 'float32'\n")
    bench.main(["dropout", f"--config={config}", "--dropout=0.2", "--rounds=3", "--steps=1", "--warmup=0"])
    out = capsys.readouterr().out
    medians = {p: float(ms) for p, ms in re.findall(r"^dropout (0\.0|0\.2) +(\d+\.\d) ms a step", out, re.M)}
    share = re.search(r"^dropout 0\.2 costs (-?\d+\.\d)% of the steps$", out, re.M)
    assert set(medians) == {"0.0", "0.2"} and share
    without, with_dropout = medians["0.0"], medians["0.2"]
    rounding = 100 * 0.05 / with_dropout * (1 + without / with_dropout) + 0.05  # the printed figures' rounding
    assert abs(float(share[1]) - 100 * (1 - without / with_dropout)) <= rounding


def summary(wall_s, hits):
    return {"wall_s": wall_s, "final_val": 1.5, "iters": 10, "dtype": "float32", "tok_s": 1000.0, "gflops": 1.0,
            "peak_pct": 40.0, "hit": hits}


def test_train_table_compares_times_to_each_target(capsys):
    classic = summary(80.0, {1.886: 60.0, 1.6: None})
    default = summary(150.0, {1.886: 20.0, 1.6: 120.0})
    train_speed.print_train_table({"classic": classic, "default": default}, [1.886, 1.6])
    out = capsys.readouterr().out
    assert ("time to 1.886: the default gets there 4.0x sooner than the classic run's wall time, "
            "3.0x sooner than the classic run does") in out
    assert "time to 1.6: the default gets there 0.7x sooner than the classic run's wall time; the classic run never" in out
    assert re.search(r"time to val <= 1.6 +never +120.0 s", out) and re.search(r"% of matmul peak +40% +40%", out)
    assert "the default's whole run took 1.88 of the classic run's wall time" in out


def test_run_summary_reads_what_the_run_recorded(tmp_path, monkeypatch):
    import json

    records = [{"kind": "run", "iter": 0, "device": "cpu", "dtype": "bfloat16", "flops_per_token": 1e6},
               {"kind": "eval", "iter": 0, "train_loss": 4.2, "val_loss": 4.2, "elapsed_s": 2.0},
               {"kind": "train", "iter": 10, "loss": 2.0, "lr": 1e-3, "tokens": 1000, "elapsed_s": 3.0},
               {"kind": "eval", "iter": 10, "train_loss": 1.8, "val_loss": 1.8, "elapsed_s": 3.5},
               {"kind": "train", "iter": 20, "loss": 1.7, "lr": 1e-3, "tokens": 3000, "elapsed_s": 4.0},
               {"kind": "eval", "iter": 20, "train_loss": 1.7, "val_loss": 1.7, "elapsed_s": 4.5},
               {"kind": "final", "iter": 20, "val_loss": 1.75, "val_tokens": 99, "elapsed_s": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(common, "matmul_peak", lambda dtype, device: {"bfloat16": 4e9}[dtype])
    s = common.run_summary(tmp_path, [1.886, 1.6], wall_s=6.0)
    assert (s["wall_s"], s["iters"], s["final_val"], s["dtype"]) == (6.0, 20, 1.75, "bfloat16")
    assert s["tok_s"] == 2000.0 and s["gflops"] == 2.0 and s["peak_pct"] == 50.0
    assert s["hit"] == {1.886: 3.5, 1.6: None}


def test_a_run_with_one_train_record_has_no_rate_and_its_real_iterations(tmp_path, capsys):
    """Rates need two train records; the iteration count is where the run ended, not where it last logged."""
    import json

    records = [{"kind": "run", "iter": 0, "device": "cpu", "dtype": "float32", "flops_per_token": 1e6},
               {"kind": "eval", "iter": 0, "train_loss": 4.2, "val_loss": 4.2, "elapsed_s": 2.0},
               {"kind": "train", "iter": 10, "loss": 2.0, "lr": 1e-3, "tokens": 1000, "elapsed_s": 3.0},
               {"kind": "eval", "iter": 25, "train_loss": 1.8, "val_loss": 1.8, "elapsed_s": 3.5},
               {"kind": "final", "iter": 25, "val_loss": 1.75, "val_tokens": 99, "elapsed_s": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    s = common.run_summary(tmp_path, [1.886], wall_s=6.0)
    assert s["iters"] == 25 and s["tok_s"] is None and s["gflops"] is None
    train_speed.print_train_table({"classic": s, "default": s}, [1.886])
    out = capsys.readouterr().out
    assert re.search(r"iterations +25 +25", out) and re.search(r"tokens/s +n/a +n/a", out)
    assert "tokens/s: n/a (a run logged fewer than two train records" in out


def test_a_benchmark_never_clears_a_run_folder_in_use(tmp_path):
    """bench.py empties its run folders before each run, but only under their lock."""
    from gptkit.base.errors import UserError
    from gptkit.run.run_folder import RunDir

    folder = tmp_path / "default"
    with RunDir(folder).locked():
        (folder / "metrics.jsonl").write_text("{}\n")
        with pytest.raises(UserError, match="is in use by another run"):
            common.clear_run_folder(folder)
        assert (folder / "metrics.jsonl").exists()
    common.clear_run_folder(folder)
    assert not folder.exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="bench.py prepare reads memory from /proc")
def test_prepare_bench_measures_our_prepare_and_the_training_read(tmp_path, capsys):
    """A small corpus through bench.py prepare, ours only: it is made with its huge single-line documents,
    prepared, read by train.py, and the table gives each one's exit status, speed, memory and disk."""
    from conftest import make_text
    text = tmp_path / "text.txt"
    text.write_text(make_text(200_000), encoding="utf-8")
    bench.main(["prepare", f"--input={text}", "--size_gb=0.002", "--tokenizer=char", "--workers=1", "--val_fraction=0.2",
                f"--work_dir={tmp_path / 'w'}", "--train_iters=2", "--huge_mb=0.3"])
    out = capsys.readouterr().out
    for name in ("ours", "training reads ours"):
        assert re.search(rf"\n{name} +0 +\d+\.\d +[-\d.]+ +\d\.\d\dGB +\d\.\d\dGB", out), out
    lines = (tmp_path / "w" / "corpus-0.002GB-3x0.3MB.jsonl").read_text(encoding="utf-8").splitlines()
    assert sum(len(json.loads(line)["text"]) == int(0.3 * 2 ** 20) for line in lines) == 3
    assert not (tmp_path / "w" / "data").exists()  # removed afterwards, being as big as the corpus


def test_prepare_bench_refuses_a_nanogpt_checkout_it_cannot_point_at_a_file(tmp_path):
    from gptkit.base.errors import UserError

    script = tmp_path / "data" / "openwebtext" / "prepare.py"
    script.parent.mkdir(parents=True)
    script.write_text("num_proc = 8\nload_dataset('somewhere else')\n", encoding="utf-8")
    with pytest.raises(UserError, match="is not the script this benchmark knows how to point at a local file"):
        bench.main(["prepare", f"--nanogpt_dir={tmp_path}", f"--work_dir={tmp_path / 'w'}"])


@pytest.mark.slow
def test_presets_bench_trains_each_preset_once_per_seed_and_states_the_mean(tmp_path, capsys):
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40)
    tiny = ("--max_iters=3 --max_time=0 --n_layer=1 --n_head=2 --n_embd=16 --block_size=16 --batch_size=2 "
            "--eval_interval=1 --eval_iters=1 --log_interval=1 --final_eval_tokens=64 --dtype=float32 "
            "--attention_path=fused --compile=False")
    bench.main(["presets", f"--input={text}", f"--work_dir={tmp_path / 'w'}", "--configs=config/shakespeare_char.py",
                "--targets=9.0", "--seeds=1,2", f"--args={tiny}"])
    out = capsys.readouterr().out
    rows = re.findall(r"^config/shakespeare_char.py +(\d+) +(\d\.\d{4}) +[\d.]+ s +3 +float32$", out, re.M)
    assert [seed for seed, _ in rows] == ["1", "2"] and rows[0][1] != rows[1][1]  # the seed reached train.py
    losses = [float(loss) for _, loss in rows]
    mean = re.search(r"^config/shakespeare_char.py: mean (\d\.\d{4}) over 2 seeds \((\d\.\d{4})-(\d\.\d{4}), std ",
                     out, re.M)
    assert abs(float(mean[1]) - sum(losses) / 2) <= 1e-4 and (float(mean[2]), float(mean[3])) == tuple(sorted(losses))
    assert out.rstrip().endswith("target <= 9.0: met")


def test_presets_table_states_budget_and_target_misses(capsys):
    runs = [summary(301.0, {}), summary(299.0, {})]
    runs[1]["final_val"] = 1.46
    presets.print_presets_table({"c.py": runs}, {"c.py": 1.45}, {"c.py": 300}, [1, 2])
    out = capsys.readouterr().out
    assert ("c.py: mean 1.4800 over 2 seeds (1.4600-1.5000, std 0.0283); wall time 299.0-301.0 s, OVER max_time "
            "300 s; target <= 1.45: missed") in out


def test_train_bench_fits_a_run_to_the_classic_wall_time(capsys):
    classic, fitted = summary(80.0, {1.886: 60.0}), summary(79.5, {1.886: 20.0})
    train_speed.print_train_table({"classic": classic, "fitted": fitted}, [1.886])
    assert ("fitted to the classic run's wall time, the default's whole run took 79.5 s against 80.0 s (within) "
            "and ended at 1.5000, the classic run at 1.5000") in capsys.readouterr().out
    with pytest.raises(ValueError, match="'fitted' with 'classic'"):
        train_speed.TrainBenchConfig(runs="default,fitted")


def test_busy_table_sets_each_run_beside_the_idle_run_of_its_seed(capsys):
    """Each busy run is compared with the idle run of its seed: its shape and precision the same or not; then each
    condition's mean val loss, how many runs kept the idle choices, and the slowest start."""
    def run(seed, shape, dtype, start, val):
        return {"seed": seed, "shape": shape, "dtype": dtype, "start_s": start, "val": val, "iters": 1000}

    idle = [run(1, "4 x 128", "bfloat16", 2.5, 1.45), run(2, "4 x 128", "bfloat16", 2.6, 1.47)]
    one_busy = [run(1, "4 x 128", "bfloat16", 4.0, 1.46), run(2, "3 x 128", "bfloat16", 5.0, 1.49)]
    busy.print_busy_table({"idle": idle, "one busy": one_busy, "two busy": []})
    out = capsys.readouterr().out
    assert re.search(r"^ +2 one busy +3 x 128 +bfloat16 +5\.0 s +1\.4900  no$", out, re.M)
    assert re.search(r"^ +1 one busy +4 x 128 +bfloat16 +4\.0 s +1\.4600  yes$", out, re.M)
    assert "one busy : mean val loss 1.4750 over 2 runs; idle's shape and precision in 1 of 2; first step at most " \
           "5.0 s" in out
    assert "two busy" not in out.split("\n\n")[-1]


def test_bench_sample_reports_both_rates_and_the_speedup(capsys):
    bench.main(["sample", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--max_new_tokens=40",
                "--warmup_tokens=2", "--pos_emb=rope", "--dtype=float32"])
    out = capsys.readouterr().out
    assert "with KV cache (float32):" in out and "without cache (float32):" in out and "tokens/s" in out
    assert "speedup: " in out and "same tokens: yes" in out
    with pytest.raises(UserError, match="unknown benchmark"):
        bench.main(["nope"])
    with pytest.raises(UserError, match="modes must be"):
        bench.main(["sample", "--modes=fast"])


def test_analyze_times_every_head_s_ablation_and_a_patching_heatmap(capsys, monkeypatch):
    """The default's configured shape with random weights; a CPU without fast bf16 times float32 alone."""
    from benchmarks import analyze_speed

    monkeypatch.setattr(analyze_speed, "fast_dtype", lambda device: "bfloat16")
    bench.main(["analyze", "--tokens=256", "--prompt_tokens=8", "--rounds=1"])
    out = capsys.readouterr().out
    assert "model 4 layers x 4 heads x 128 wide, block_size 128, vocabulary 65, random weights" in out
    for dtype in ("float32", "bfloat16"):
        assert re.search(rf"every head's zero-ablation delta \(16 heads\) on 256 tokens, {dtype}: \d+\.\d+ s", out)
    assert re.search(r"patching heatmap of a 8-token prompt \(4 x 8 residual cells, 16 heads\), float32: \d", out)


@pytest.mark.slow
def test_bench_explore_load_reports_each_client_and_a_verdict_per_criterion(capsys):
    """The load part in miniature, on its small random model: every figure it promises is printed, and the
    server answered everything."""
    bench.main(["explore", "--out_dir=", "--parts=load", "--clients=3", "--client_tokens=30", "--slow_readers=1",
                "--slow_seconds=1", "--disconnects=2", "--loads=5", "--mixed_requests=24", "--phase_seconds=60"])
    out = capsys.readouterr().out
    rows = re.findall(r"^ +(\d+) +(\d+) ms +30 +[\d.]+$", out, re.MULTILINE)
    assert [int(client) for client, _ in rows] == [1, 2, 3], out
    assert re.search(r"5 model loads .*: median \d+ ms", out) and re.search(r"memory over 24 mixed requests", out)
    verdicts = re.findall(r"^(PASS|FAIL)  (.*)$", out, re.MULTILINE)
    assert len(verdicts) == 4 and all(v == "PASS" for v, line in verdicts if "memory" not in line), out


@pytest.mark.slow
def test_bench_explore_speed_times_each_stream_beside_sample_s_decoding_just_before(capsys):
    """The speed part in miniature, on its small random model: each streamed generation is paired with the
    in-process cached decoding timed just before it, and the median share is printed."""
    bench.main(["explore", "--out_dir=", "--parts=speed", "--max_tokens=20", "--text_tokens=16", "--repeats=1",
                "--stream_rounds=2"])
    out = capsys.readouterr().out
    pairs = re.findall(r"streaming: [\d.]+ tokens/s, \d+% of sample.py's cached decoding just before", out)
    assert len(pairs) == 2 and re.search(r"streaming, median of 2: \d+% of sample.py's cached decoding", out), out


# ---------------------------------------------------------------------------------------------- bench.py tokenizers


def test_each_bpe_block_reads_about_as_many_characters_as_the_char_model():
    from benchmarks.tokenizers import block_for

    assert [block_for(128, per_token) for per_token in (1.0, 1.94, 2.44, 3.26)] == [128, 64, 56, 40]
    assert block_for(128, 40.0) == 8 and block_for(32, 0.99) == 32  # at least 8; to a multiple of 8


def test_the_text_is_cut_once_by_characters_and_val_characters_the_train_text_lacks_are_left_out(tmp_path, capsys):
    from benchmarks.tokenizers import split_text

    train_file, val = split_text("abcabcabc\nab" + "Zc~a", 0.25, tmp_path)  # 16 characters: train 12, val 4
    assert train_file.read_text(encoding="utf-8") == "abcabcabc\nab" and val == "ca"
    assert (tmp_path / "val.txt").read_text(encoding="utf-8") == "ca"
    assert "note: 'Z', '~' in the held-out text never occur in the train text" in capsys.readouterr().out


def test_val_score_is_every_token_s_surprise_once_in_consecutive_windows():
    """Total nats of a text in block_size windows, each token scored once from the tokens before it in its window
    (the explorer's surprise_bits, window by window); the first token and its characters left out."""
    from benchmarks.tokenizers import val_score
    from gptkit.data.tokenizer import CharTokenizer
    from gptkit.interp.hooks import surprise_bits
    from model import GPT, GPTConfig

    text = "to be, or not to be: that is the question."[:41]  # 41 characters: 40 targets, 5 windows of 8
    tok = CharTokenizer(sorted(set(text)))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, pos_emb="rope"))
    nats, tokens, chars = val_score(model.eval(), tok, text)
    ids = torch.tensor([tok.encode(text)])
    bits = sum(surprise_bits(model, ids[:, s:s + 8], ids[:, s + 1:s + 9]).sum().item() for s in range(0, 40, 8))
    assert (tokens, chars) == (40, 40) and abs(nats - bits * math.log(2)) < 1e-3
    assert not model.training


def test_hugging_face_s_encoder_for_the_trained_ranks_gives_tiktoken_s_tokens():
    from benchmarks.tokenizers import hugging_face_encoder
    from conftest import make_text
    from gptkit.data.bpe import train_bpe
    from gptkit.data.tokenizer import TrainedBPE

    text = make_text(20_000)
    tok = TrainedBPE(train_bpe([text], 400))
    assert hugging_face_encoder(tok).encode(text).ids == tok.encode(text)


def test_tokenizers_bench_refuses_settings_it_makes_itself():
    from benchmarks.tokenizers import TokenizersBenchConfig

    with pytest.raises(ValueError, match="args must not set --block_size"):
        TokenizersBenchConfig(args="--n_layer=2 --block_size=64")
    with pytest.raises(ValueError, match="parts must name one or more of compare, speed"):
        TokenizersBenchConfig(parts="compare,sped")
    with pytest.raises(ValueError, match="vocab_size 200 is too small"):
        TokenizersBenchConfig(vocab_sizes="512,200")


@pytest.mark.slow
def test_tokenizers_bench_compares_characters_and_bpes_in_bits_per_character(tmp_path, capsys):
    """The compare part in miniature: a char-level and two BPE datasets of the train text alone, a few steps of a
    tiny model each, every best.pt scored on the held-out text; bits per character = total nats / (ln 2 x
    characters), which the table's nats per token and characters per token agree with."""
    from benchmarks.tokenizers import val_score
    from conftest import make_text
    from gptkit.data.dataset import load_meta
    from gptkit.interp.experiments import open_run

    text = tmp_path / "input.txt"
    text.write_text(make_text(60_000) + "Zounds!\n", encoding="utf-8")  # 'Z' only in the held-out text
    work = tmp_path / "w"
    tiny = ("--max_iters=3 --n_layer=1 --n_head=2 --n_embd=16 --batch_size=4 --eval_interval=3 --eval_iters=1 "
            "--dtype=float32 --attention_path=fused --compile=False --threads=1")
    bench.main(["tokenizers", "--parts=compare", f"--input={text}", "--vocab_sizes=257,300", "--max_time=60",
                "--char_block=32", f"--work_dir={work}", f"--args={tiny}"])
    out = capsys.readouterr().out
    assert "note: 'Z' in the held-out text never occur in the train text" in out
    rows = re.findall(r"^(chars|bpe257|bpe300) +(\d+) +(\d\.\d\d) +(\d\.\d\d) +(\d+) +([\d,]+) +([\d,]+) +3 +"
                      r"(\d+\.\d{4}) +(\d+\.\d{4})$", out, re.M)
    assert [r[0] for r in rows] == ["chars", "bpe257", "bpe300"], out
    train_text = (work / "train.txt").read_text(encoding="utf-8")
    val_text = (work / "val.txt").read_text(encoding="utf-8")
    assert train_text + val_text == text.read_text(encoding="utf-8").replace("Z", "")
    for name, vocab, _, per_token, block, _, _, bits, nats in rows:
        assert abs(float(bits) - float(nats) / (math.log(2) * float(per_token))) <= 0.01 * float(bits)
        _, meta = load_meta(str(work / "data"), name)
        assert meta["train_chars"] + meta["val_chars"] == len(train_text)  # the tokenizer saw the train text alone
        run = open_run(work / f"out-{name}")
        assert run.model.config.block_size == int(block)
        total, _, chars = val_score(run.model, run.tok, val_text)
        assert f"{total / (math.log(2) * chars):.4f}" == bits
    assert int(rows[1][4]) == 32 and int(rows[2][4]) < 32  # the bytes' block is the char model's; merges shorten it


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the speed part reads memory from /proc")
def test_tokenizers_bench_times_training_a_bpe_and_three_encoders(tmp_path, capsys, tiktoken_cache):
    from benchmarks.prepare_cost import make_corpus
    from conftest import make_text

    corpus = tmp_path / "corpus.jsonl"
    make_corpus(make_text(200_000), corpus, 2_000_000, huge_docs=1, huge_bytes=300_000)
    bench.main(["tokenizers", "--parts=speed", f"--corpus={corpus}", "--speed_vocab=300", "--encode_mb=0.3",
                "--rounds=1", f"--work_dir={tmp_path / 'w'}"])
    out = capsys.readouterr().out
    assert re.search(r"trained a 300-token BPE on 0\.00 GB in \d+\.\d s \(\d+\.\d MB/s\), peak resident memory "
                     r"\d\.\d\d GB", out), out
    assert re.search(r"at most 120 s: (PASS|FAIL); at most 1 GB: (PASS|FAIL)", out)
    rates = re.findall(r"^  (trained 300, tiktoken|trained 300, Hugging Face|GPT-2 \(\w+\), tiktoken).* (\d+\.\d\d) "
                       r"MB/s  \(cores busy: (\d\.\d\d)\)$", out, re.M)
    assert len(rates) == 3 and all(float(mb_s) > 0 for _, mb_s, _ in rates), out
    assert re.search(r"trained against GPT-2, both through tiktoken: \d+\.\d\dx GPT-2's MB/s per core: (PASS|FAIL)", out)
    assert re.search(r"Hugging Face's encoder gave tiktoken's tokens for (\d+) of the first \1 pieces", out), out


def test_startup_bench_counts_the_runs_that_took_the_first_runs_choices(monkeypatch, capsys, tmp_path):
    """bench.py startup's `same`: each condition's runs against the first run's shape, precision, path and
    kernels, the odd ones named; its options refused in one line."""
    taken = iter([("4x128", "bfloat16", "folded", "relu2")] * 5 + [("3x128", "float32", "fused", "relu2")])
    monkeypatch.setattr(startup, "run_train", lambda cfg, work, name, extra, wisdom: (1.0, [], tmp_path))
    monkeypatch.setattr(startup, "chosen", lambda out: next(taken))
    monkeypatch.setattr(startup, "busy", lambda processes: __import__("contextlib").nullcontext())
    startup.same(startup.StartupBenchConfig(runs=2), tmp_path, tmp_path)
    out = capsys.readouterr().out
    assert "idle      2 of 2 took 4x128 bfloat16 folded relu2" in out
    assert "two busy  1 of 2 took 4x128 bfloat16 folded relu2; others: [('3x128', 'float32', 'fused', 'relu2')]" in out
    with pytest.raises(ValueError, match=r"parts must be some of startup, same \(got"):
        startup.StartupBenchConfig(parts="startup,warmup")


def test_features_bench_times_the_command_and_measures_its_own_memory(trained_run, tmp_path, capsys):
    """bench.py features on a run already trained: the whole command's time, its peak memory (its own, not the
    training run's before it), and each metric against its target; the 20 most frequent features' contexts. The
    SAE it trains goes beside a copy of the run's checkpoint in its work folder: the run's own stays."""
    import shutil

    from gptkit.interp.features import OURS_FILE, sae_folder

    out = tmp_path / "run"
    shutil.copytree(trained_run[0], out)
    yours = sae_folder(out, "blocks.1.hook_resid_post", "best") / OURS_FILE
    yours.parent.mkdir(parents=True)
    yours.write_text("the SAE you trained")
    bench.main(["features", f"--out_dir={out}", f"--work_dir={tmp_path / 'bench'}", "--layer=1", "--features=64",
                "--k=4", "--extra=--tokens=4096 --batch=256 --eval_tokens=256"])
    assert yours.read_text() == "the SAE you trained"
    printed = capsys.readouterr().out
    rows = {line[:22].strip(): line[22:].split() for line in printed.splitlines() if line[:1].isalpha()}
    assert float(rows["whole command"][0]) > 0 and 0.05 < float(rows["peak memory"][0]) < 8
    for metric in ("explained variance", "ce loss recovered", "delta loss", "dead fraction"):
        assert math.isfinite(float(rows[metric][0])) and rows[metric][-1] == "met", rows[metric]  # met or NOT met
    assert "the 20 most frequent features" in printed


def test_timeline_bench_refuses_a_part_it_does_not_have():
    with pytest.raises(UserError, match="parts: unknown part 'speed'; choose from cost, induction"):
        bench.main(["timeline", "--parts=speed"])


def test_the_fairness_benchmarks_edits_apply_to_model_py_and_each_trains(tmp_path):
    """Each edit finds the text it replaces in today's model.py, and the edited model builds and steps."""
    import importlib.util

    from conftest import train_config
    for name in fair.EDITS:
        copy = fair.edited_checkout(name, tmp_path)
        spec = importlib.util.spec_from_file_location(f"edited_{copy.name}", copy / "model.py")
        edited = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(edited)
        cfg = train_config(pos_emb="rope", mlp_act="relu2").model
        model = edited.GPT(type(cfg)(**{**cfg.__dict__, "vocab_size": 11, "n_layer": 1, "n_embd": 16, "n_head": 2,
                                        "block_size": 8}))
        _, loss = model(torch.zeros((2, 8), dtype=torch.long), torch.zeros((2, 8), dtype=torch.long))
        loss.backward()
        assert torch.isfinite(loss)


def test_the_time_a_run_said_is_its_busy_line_or_else_its_plan():
    plan = "steps: 1,204, planned from max_time=150 at this machine's idle speed (105 ms a step; with the " \
           "evaluations and the final score, about 149 s idle): the same command"
    assert fair.said_seconds(plan) == 149
    assert fair.said_seconds(plan + "\nnote: this machine is busy (a step takes 1.9x its idle time): the run "
                                 "trains its 1,204 steps all the same, in about 4m12s rather than 149 s") == 252
    assert fair.said_seconds("nothing said") is None


def test_a_run_is_held_to_the_idle_runs_weights_bit_for_bit():
    idle = {"weights": {"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.bfloat16)}}
    same = {"weights": {k: v.clone() for k, v in idle["weights"].items()}}
    moved = {"weights": {"a": torch.tensor([1.0, 1.0, 1.5]), "b": torch.zeros(2, dtype=torch.bfloat16)}}
    assert fair.weights_against(idle, idle) == ""
    assert fair.weights_against(same, idle) == "; the idle run's weights bit for bit"
    assert fair.weights_against(moved, idle) == "; weights up to 0.5 from the idle run's"


def test_the_chat_bench_measures_each_block_update_against_its_base_and_the_share_a_low_rank_holds():
    base = {"transformer.h.0.attn.c_attn.weight": torch.eye(4), "transformer.h.0.mlp.c_fc.weight": torch.eye(4),
            "transformer.h.0.ln_1.weight": torch.ones(4), "transformer.wte.weight": torch.ones(6, 4)}
    rank_one = torch.outer(torch.tensor([1.0, 2, 0, 0]), torch.tensor([0.0, 0, 3, 4]))  # norm sqrt(5) * 5
    tuned = {**base, "transformer.h.0.attn.c_attn.weight": torch.eye(4) + rank_one,
             "transformer.h.0.mlp.c_fc.weight": torch.eye(4) * 3,  # an update of 2 I: four equal directions
             "transformer.wte.weight": torch.zeros(6, 4)}  # not a block matrix: left out
    line = chat_pipeline.update_sizes(base, tuned, rank=2)
    # norms over the identity's 2: the rank-one update's 5 sqrt(5) / 2 = 5.6, 2 I's 4 / 2 = 2.0; the top two
    # directions hold all of the rank-one update and half of 2 I
    assert line == ("full SFT's updates to the blocks' 2 matrices: 2.0-5.6 times the base matrix in norm; their top "
                    "2 directions hold 50-100% of each one's energy")


def test_the_chat_bench_compares_lora_with_sft_at_the_time_and_steps_each_took(capsys):
    """The target compares LoRA with full SFT at equal time: the line says each one's steps and seconds beside the
    gap in accuracy, averaged over the tasks."""
    from types import SimpleNamespace

    def scored(*accuracies):
        return {"tasks": {t: {"n": 1000, "accuracy": a} for t, a in zip(("addition", "reverse", "sort"), accuracies)},
                "text_val_loss": 1.5}
    found = {"out-chat": scored(1.0, 1.0, 0.97), "out-lora": scored(0.01, 0.49, 0.28)}
    sampled = {"tasks": {"addition": {"n": 200, "pass_at": {"1": 0.5, "8": 0.9, "64": 1.0}}}}
    spent = {"base": 150.0, "prepare": 6.0, "sft": 191.2, "lora": 189.4, "sft_early": 109.0, "rl": 109.0}
    chat_pipeline.report(SimpleNamespace(rl_task="addition"), spent, found, {"out-chat": 1700, "out-lora": 2363},
                         sampled, sampled, [1.3, 1.2, 1.4])
    assert ("LoRA -73.0 points against SFT at equal time, 2,363 steps in 189 s against 1,700 in 191 s (within 3)"
            in capsys.readouterr().out)


def test_a_work_dir_holding_files_no_benchmark_made_is_refused_and_kept(tmp_path):
    """A benchmark replaces the runs and datasets it makes in its folder: pointed at one of yours (your project's
    root, with its out/ and data/), it refuses in one line before any work; a new, empty or marked folder, or a
    benchmark's default one, it makes its own."""
    from types import SimpleNamespace

    from conftest import assert_one_error_line, run_here

    yours = tmp_path / "project"
    (yours / "out").mkdir(parents=True)
    (yours / "out" / "best.pt").write_text("your model")
    with pytest.raises(UserError, match=rf"--work_dir={re.escape(str(yours))} holds files no benchmark made \(out\)"):
        common.own_work_dir(SimpleNamespace(work_dir=str(yours)))
    proc = run_here("bench.py", "chat", f"--work_dir={yours}")
    assert proc.returncode == 1 and "holds files no benchmark made (out)" in assert_one_error_line(proc.stderr)
    assert sorted(p.name for p in yours.iterdir()) == ["out"] and (yours / "out" / "best.pt").read_text() == "your model"
    (tmp_path / "out-bench-chat" / "out").mkdir(parents=True)  # a benchmark's default folder from before the mark
    for folder in (tmp_path / "new", tmp_path / "out-bench-chat"):
        assert common.own_work_dir(SimpleNamespace(work_dir=str(folder))) == folder
        assert (folder / common.WORK_MARK).exists()
        (folder / "run").mkdir()
        common.own_work_dir(SimpleNamespace(work_dir=str(folder)))  # its own now, whatever it holds
