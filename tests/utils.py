"""Helpers for tests: the repository root, tiny config overrides, running the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Small enough that a CPU trains a few steps in seconds.
TINY_DATA = ["data.seq_len=64", "data.micro_batch_size=2", "data.embedded_python_chars=200000",
             "data.embedded_retrieval_docs=40"]
TINY_MODEL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2"]



def positions_of(rows: list[list[int]]):
    """`[B, T]` int64: each token's position inside its document, from each row's document lengths (the
    packed-documents ops' `positions`, written out independently of fsframework.models.documents)."""
    import torch

    return torch.stack([torch.cat([torch.arange(length) for length in row]) for row in rows])

def tiny_model(name: str, vocab_size: int, **attention):
    """A 2-layer, 2-head model of any registered kind with small attention shapes (window 16,
    cells of 4, blocks of 8) and the reference ops, in eval mode; FS-B gets thresholds of 1.
    `attention`: other `AttentionConfig` fields (e.g. route_score)."""
    import torch

    from fsframework.config import AttentionConfig, ModelConfig
    from fsframework.models.freesolo_attention import set_fsb_thresholds
    from fsframework.models.registry import build_model

    att = AttentionConfig(**{**dict(window=16, cell_size=4, block_size=8, top_k=2, recent_cells=2, retained_cells=3,
                                    impl="reference"), **attention})
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=2,
                                    attention=att)).eval()
    if name == "fsb":  # both forests need thresholds (any will do for these tests)
        set_fsb_thresholds(model, [[1.0, 1.0]] * 2, source="test")
    return model


def assert_future_tokens_do_not_change_past(model, *, atol: float = 0.0) -> None:
    """Changing tokens 30.. of a 50-token input leaves the logits of positions < 30 unchanged
    (within `atol`; 0 means bit-identical) and changes later ones."""
    import torch

    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 50))
    changed = tokens.clone()
    changed[:, 30:] = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    if atol == 0.0:
        assert torch.equal(a[:, :30], b[:, :30])
    else:
        torch.testing.assert_close(a[:, :30], b[:, :30], rtol=0, atol=atol)
    assert not torch.allclose(a[:, 30:], b[:, 30:])


def run_fsf(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `fsf ARGS` inside this process (typer's CliRunner), with what the command changes
    in the process put back afterwards (see `tests.in_process`); the result has a process's
    fields: returncode, stdout, stderr. Costs no interpreter start (torch, DeepSpeed and
    streaming are imported once per test process); use `run_fsf_process` where the test is
    about the process itself (exit by signal, `python -m fsframework`, os._exit)."""
    from tests.in_process import invoke_fsf

    proc = invoke_fsf(list(args), env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"fsf {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_fsf_process(*args: str, env: dict | None = None, check: bool = True,
                    timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m fsframework ARGS` in a fresh process, as a user would."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "fsframework", *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"fsf {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def load_tool(script: str):
    """The module of `tools/SCRIPT` (a script, not a package module), for tests that call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / "tools" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(script: str, *args: str, code: str | None = None, env: dict | None = None, check: bool = True,
             timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python tools/SCRIPT ARGS` from the repository root, as a user would (with `code`: `python -c
    CODE ARGS`, with tools/ first on the path, for a GPU tool's CPU-reachable parts): one thread per
    process (a tool's own workers set theirs), stdout and stderr captured; with `check` a non-zero exit
    fails the test with the tool's output."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if code is not None:
        code = f"import sys; sys.path.insert(0, 'tools'); sys.argv = [{script!r}, *sys.argv[1:]]\n{code}"
    command = [sys.executable, *(["-c", code] if code is not None else [f"tools/{script}"]), *args]
    proc = subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_ahead_threads(wait_s: float = 0.0, besides: frozenset = frozenset()) -> list[str]:
    """Threads of this process inside mosaicml-streaming's per-epoch read-ahead loops, other than
    `besides` (those an earlier test of the process left), after waiting up to `wait_s` seconds
    for them to end (a stopped epoch's threads leave at their next poll)."""
    import threading
    import time
    import traceback

    deadline = time.monotonic() + wait_s
    while True:
        frames = sys._current_frames()
        names = [t.name for t in threading.enumerate() if t.ident in frames and t.name not in besides and any(
            f.name in ("_prepare_thread", "_ready_thread") for f in traceback.extract_stack(frames[t.ident]))]
        if not names or time.monotonic() >= deadline:
            return names
        time.sleep(0.01)
