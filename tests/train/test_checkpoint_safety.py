"""Safe checkpoint loading (docs/checkpoints.md): every file is read with `weights_only=True`
(DeepSpeed's own loads included), every failure is a CheckpointError naming the file, a model of
another size or kind is told by name, and a skipped damaged checkpoint is reported."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
import torch

from fsframework.checkpoints import (Checkpoint, CheckpointError, CheckpointWarning, load_model, resolve_checkpoint,
                                     safe_load, weights_only_loads)
from fsframework.train.resume import load_client_state
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

LOADERS = [*(p.relative_to(REPO) for p in sorted((REPO / "fsframework/checkpoints").glob("*.py"))),
           "fsframework/train/resume.py", "fsframework/train/resize.py"]


class _Touch:
    """Unpickling this object creates a file: what a hostile checkpoint could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_cache) -> Path:
    """One rank, ZeRO-3: the weights live in the optimizer shards, which DeepSpeed's own code
    merges (`engine_state_dict`). Checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("zero3")
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.attention.block_size=16", "train.max_steps=4", "train.ckpt_every=2",
            "optim.warmup_steps=1", "train.progress=false", "train.tensorboard=false", "parallel.zero_stage=3")
    return run_dir


@pytest.fixture
def copy(run, tmp_path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _optim_file(ckpt: Path) -> Path:
    return next((ckpt / "ds").glob("zero_pp_rank_0_*optim_states.pt"))


def test_no_load_in_the_checkpoint_code_unpickles_freely():
    for rel in LOADERS:
        tree = ast.parse((REPO / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                unsafe = [k for k in node.keywords if k.arg == "weights_only" and not (
                    isinstance(k.value, ast.Constant) and k.value.value is True)]
                assert not unsafe, f"{rel}:{node.lineno} loads without weights_only=True"
                name = ast.unparse(node.func)
                assert name not in ("pickle.load", "pickle.loads"), f"{rel}:{node.lineno} unpickles freely"


def test_every_file_deepspeed_and_the_loop_write_loads_with_weights_only(run):
    ckpt = run / "checkpoints" / "step_00000004"
    files = sorted(ckpt.rglob("*.pt"))
    assert {p.name for p in files} == {"client_rank0.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt",
                                       "zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    for path in files:
        assert isinstance(safe_load(path, engine=True), dict), path
    # the allow-list is what makes the optimizer shard load: torch alone refuses DeepSpeed's classes
    with pytest.raises(Exception, match="Unsupported global"):
        torch.load(_optim_file(ckpt), weights_only=True)


def test_a_file_that_would_run_code_is_refused_naming_it(copy, tmp_path):
    ckpt = copy / "checkpoints" / "step_00000004"
    marker = tmp_path / "ran"
    for victim in (ckpt / "client_rank0.pt", _optim_file(ckpt)):
        torch.save({"payload": _Touch(marker)}, victim)
    with pytest.raises(CheckpointError, match=r"client_rank0\.pt.*Unsupported global"):
        load_client_state(ckpt, 0)
    # the ZeRO shards are merged by DeepSpeed, whose own torch.load asks for weights_only=False
    with pytest.raises(CheckpointError, match=r"zero_pp_rank_0_mp_rank_00_optim_states\.pt.*Unsupported global"):
        Checkpoint(ckpt).engine_state_dict()
    assert not marker.exists()


@pytest.mark.parametrize("victim", ["client_rank0.pt", "optim", "ds/zero_pp_rank_0_mp_rank_00_model_states.pt"])
def test_a_truncated_file_is_a_checkpoint_error_naming_it(copy, victim):
    ckpt = copy / "checkpoints" / "step_00000004"
    path = _optim_file(ckpt) if victim == "optim" else ckpt / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        if victim == "client_rank0.pt":
            load_client_state(ckpt, 0)
        else:
            Checkpoint(ckpt).engine_state_dict()


def test_deepspeed_loads_inside_the_block_are_weights_only(run):
    ckpt = run / "checkpoints" / "step_00000004"
    original = torch.load
    with weights_only_loads():
        assert torch.load is not original
        with weights_only_loads():  # nested blocks keep the outer one's
            pass
        assert torch.load is not original
        assert isinstance(torch.load(_optim_file(ckpt), weights_only=False), dict)
    assert torch.load is original


def test_a_model_of_another_size_or_kind_names_the_tensors(run):
    ckpt = Checkpoint.open(run)
    with pytest.raises(CheckpointError, match=r"mis-shaped \d+: embed\.weight \(260, 32\) \(model: \(260, 48\)\)"):
        load_model(ckpt, overrides=["model.d_model=48"])
    with pytest.raises(CheckpointError, match=r"missing \d+: layers\.2\."):
        load_model(ckpt, overrides=["model.n_layers=3"])
    with pytest.raises(CheckpointError, match=r"unexpected 6: .*layers\.0\.attn\.lr_norm_weight"):
        load_model(ckpt, overrides=["model.name=tfpp"])  # the FreeSolo checkpoint's cell branch is extra


def test_resolve_names_the_damaged_checkpoint_it_skipped_and_the_one_it_used(copy):
    newest = copy / "checkpoints" / "step_00000004"
    victim = _optim_file(newest)
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.warns(CheckpointWarning) as caught:
        found = resolve_checkpoint(copy)
    assert found.name == "step_00000002"
    messages = [str(w.message) for w in caught]
    assert any("step_00000004" in m and victim.name in m and "bytes" in m for m in messages), messages
    assert any(m.startswith("using checkpoint") and "step_00000002" in m for m in messages), messages


def test_resolve_is_quiet_when_the_newest_checkpoint_is_good(run, recwarn):
    assert resolve_checkpoint(run).name == "step_00000004"
    assert not [w for w in recwarn if issubclass(w.category, CheckpointWarning)]


def test_eval_reports_the_skipped_checkpoint(copy, tmp_path):
    newest = copy / "checkpoints" / "step_00000004"
    victim = _optim_file(newest)
    victim.write_bytes(victim.read_bytes()[:100])
    out = tmp_path / "scores.json"
    proc = run_fsf("eval", str(copy), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "1", "--out",
                   str(out))
    assert "step_00000004" in proc.stderr and "using checkpoint" in proc.stderr and "step_00000002" in proc.stderr
