"""FS-L continued pretraining starts from FS weights with a fresh optimizer and schedule."""

from __future__ import annotations

import json

from fsframework.checkpoints import consolidated_state_dict, read_config, resolve_checkpoint
from fsframework.config import load_config
from fsframework.models.registry import build_model
from tests.utils import REPO, TINY_DATA, run_fsf

FS_TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.attention.cell_size=4",
           "model.attention.block_size=8", "model.attention.window=8", "model.attention.top_k=2",
           "model.attention.retained_cells=3", "model.attention.recent_cells=1", "train.progress=false",
           "train.tensorboard=false", "optim.warmup_steps=2"]


def test_fsl_cpt_from_fs_checkpoint(tmp_path, data_cache):
    fs_run, fsl_run = tmp_path / "fs", tmp_path / "fsl"
    common = [f"data.cache_dir={data_cache}", *TINY_DATA, *FS_TINY]
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={fs_run}", "model.name=fs",
            "train.max_steps=4", "train.ckpt_every=4", *common)
    # lr 1e-9: the two steps leave the loaded weights in place, so the checkpoint shows what was loaded
    proc = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={fsl_run}", "model.name=fsl",
                   f"train.init_from={fs_run}", "train.max_steps=2", "train.ckpt_every=2", "optim.lr=1e-9", *common)
    assert "initialised weights from" in proc.stdout
    records = [json.loads(line) for line in (fsl_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2], "a fresh run, not a resume of the FS steps"
    assert records[0]["lr"] == records[1]["lr"] / 2, "the schedule restarts at its warmup"
    # the FS weights load into the FS-L model exactly (same parameters, pruning is routing only)
    import torch

    source = consolidated_state_dict(resolve_checkpoint(fs_run))
    loaded = consolidated_state_dict(resolve_checkpoint(fsl_run))
    assert loaded.keys() == source.keys()
    assert all(torch.allclose(loaded[k], source[k], atol=1e-6) for k in source)
    own_init = build_model(read_config(fsl_run / "config.yaml").model).state_dict()
    assert not torch.allclose(loaded["embed.weight"], own_init["embed.weight"], atol=1e-3)

    missing = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={tmp_path / 'x'}", "model.name=fsl",
                      f"train.init_from={tmp_path / 'nowhere'}", *common, check=False)
    assert missing.returncode == 2 and f"{tmp_path / 'nowhere'}: not found" in missing.stderr
    assert not (tmp_path / "x").exists()


def test_init_from_a_plain_weights_file(tmp_path, data_cache):
    """A state dict saved outside the trainer (as `experiments/copy_drill.py --save` writes it: under
    "model") starts a run with exactly those weights; a file that does not fit is named."""
    import torch

    common = [f"data.cache_dir={data_cache}", *TINY_DATA, *FS_TINY, "model.name=fs"]
    cfg = load_config(REPO / "yamls/quickstart.yaml", common)
    torch.manual_seed(7)
    weights = build_model(cfg.model).state_dict()
    torch.save({"args": {}, "step": 3, "model": weights}, tmp_path / "drill.pt")
    run = tmp_path / "run"
    proc = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", f"train.init_from={tmp_path / 'drill.pt'}",
                   "train.max_steps=1", "train.ckpt_every=1", "optim.lr=1e-9", *common)
    assert "initialised weights from" in proc.stdout
    trained = consolidated_state_dict(resolve_checkpoint(run))
    # one step at lr 1e-9 leaves the loaded weights (not the run's own seeded init) in place
    assert all(torch.allclose(trained[k], v.float(), atol=1e-6) for k, v in weights.items())
    assert not torch.allclose(trained["embed.weight"], build_model(cfg.model).state_dict()["embed.weight"], atol=1e-3)

    torch.save(build_model(load_config(REPO / "yamls/quickstart.yaml", [*common, "model.d_model=64"]).model)
               .state_dict(), tmp_path / "wider.pt")
    wrong = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={tmp_path / 'y'}",
                    f"train.init_from={tmp_path / 'wider.pt'}", *common, check=False)
    assert wrong.returncode == 2 and "does not fit model fs: mis-shaped" in wrong.stderr
    assert "embed.weight (260, 64) (model: (260, 32))" in wrong.stderr
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    junk = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={tmp_path / 'z'}",
                   f"train.init_from={tmp_path / 'junk.pt'}", *common, check=False)
    assert junk.returncode == 2 and "is not a readable torch file" in junk.stderr
