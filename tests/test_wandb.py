"""wandb logging, kept offline: a run directory appears under out_dir/wandb, and no network is needed."""

import pytest

from checkpoint import load_checkpoint
from conftest import check_ok, run_script
from metrics import read_metrics

pytest.importorskip("wandb")


def test_wandb_offline_run_directory(prepared, tmp_path):
    data_dir, _, _ = prepared
    out = tmp_path / "out"
    proc = check_ok(run_script(
        "train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}", "--device=cpu",
        "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
        "--max_iters=4", "--eval_interval=2", "--eval_iters=1", "--log_interval=2", "--warmup_iters=1",
        "--wandb_log=True", "--wandb_project=tests", "--wandb_run_name=tiny-run",
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
             "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")},
        timeout=180))
    assert "Traceback" not in proc.stderr
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir()) if (out / "wandb").exists() else "no wandb folder"
    assert list(runs[0].glob("*.wandb")), "the offline run holds no .wandb log file"
    # the run id is kept in the checkpoint, so a resumed run continues the same wandb run
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["wandb_id"] and ckpt["wandb_id"] in runs[0].name
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "train"] == [2, 4]
