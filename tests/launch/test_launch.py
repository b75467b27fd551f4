"""`fsf launch`: command lines, scripts, hostfiles and snapshots from dry runs (no GPU, no
process group), failure reporting with a stand-in launcher, and one real 2-rank CPU run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsframework.cli import app
from fsframework.launcher.plan import make_plan, with_snapshot
from fsframework.launcher.run import run_command
from tests.utils import REPO

QUICKSTART = str(REPO / "yamls" / "quickstart.yaml")


def launch(tmp_path: Path, *args: str, overrides: tuple[str, ...] = ()):
    """Invoke `fsf launch` in-process; returns (result, the snapshot dir or None)."""
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["launch", QUICKSTART, f"run_dir={run_dir}", *overrides, *args])
    snaps = sorted((run_dir / "launch").glob("*")) if (run_dir / "launch").is_dir() else []
    return result, (snaps[-1] if snaps else None)


def line_with(output: str, needle: str) -> str:
    found = [line.strip() for line in output.splitlines() if needle in line]
    assert found, f"no line with {needle!r} in:\n{output}"
    return found[0]


def test_dry_run_one_node_torchrun(tmp_path):
    res, snap = launch(tmp_path, "--nodes", "1", "--gpus-per-node", "2", "--master-port", "29511", "--dry-run")
    assert res.exit_code == 0, res.output
    cmd = line_with(res.output, "--nnodes")
    assert cmd.endswith(f"--nnodes 1 --nproc_per_node 2 --node_rank 0 --master_addr 127.0.0.1 --master_port 29511 "
                        f"-m fsframework train {snap / 'config.yaml'}")
    assert f"export PYTHONPATH={snap / 'src'}:{snap / 'src' / 'kernels'}" in res.output
    assert "export OMP_NUM_THREADS=" in res.output and "nothing started" in res.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_dry_run_two_nodes_torchrun_prints_one_command_per_node(tmp_path):
    res, snap = launch(tmp_path, "--nodes", "2", "--gpus-per-node", "4", "--master-addr", "node0", "--dry-run",
                       overrides=("parallel.sp=2",))
    assert res.exit_code == 0, res.output
    for rank in (0, 1):
        cmd = line_with(res.output, f"--node_rank {rank} ")
        assert "--nnodes 2 --nproc_per_node 4" in cmd and "--master_addr node0 --master_port 29500" in cmd
    assert "8 ranks (data parallel 4 x sequence parallel 2)" in res.output
    script = (snap / "command.sh").read_text()
    assert 'NODE_RANK=${1:-0}' in script and '--node_rank "$NODE_RANK"' in script


def test_dry_run_two_nodes_rendezvous(tmp_path):
    res, _ = launch(tmp_path, "--nodes", "2", "--gpus-per-node", "2", "--master-addr", "node0", "--rdzv", "--dry-run")
    assert res.exit_code == 0, res.output
    cmd = line_with(res.output, "--nnodes")
    assert "--rdzv_id run --rdzv_backend c10d --rdzv_endpoint node0:29500" in cmd
    assert "--node_rank" not in cmd  # ignored by torchrun under c10d, so not printed


def test_dry_run_deepspeed_one_and_two_nodes(tmp_path):
    res, snap = launch(tmp_path / "one", "--launcher", "deepspeed", "--gpus-per-node", "2", "--master-port", "29512",
                       "--dry-run")
    assert res.exit_code == 0, res.output
    assert line_with(res.output, "--num_nodes").endswith(
        f"--num_nodes 1 --num_gpus 2 --master_addr 127.0.0.1 --master_port 29512 --module fsframework train "
        f"{snap / 'config.yaml'}")
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nnode-a slots=8\n\nnode-b slots=8  # spare\nnode-c slots=8\n")
    res, snap = launch(tmp_path / "two", "--launcher", "deepspeed", "--nodes", "2", "--gpus-per-node", "8",
                       "--hostfile", str(hosts), "--dry-run")
    assert res.exit_code == 0, res.output
    assert line_with(res.output, "--num_nodes").endswith(
        f"--hostfile {hosts} --num_nodes 2 --num_gpus 8 --master_addr node-a --master_port 29500 --module "
        f"fsframework train {snap / 'config.yaml'}")


def test_slurm_script(tmp_path):
    res, snap = launch(tmp_path, "--slurm", "--dry-run", "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu",
                       "--account", "lab", "--time", "02:00:00")
    assert res.exit_code == 0, res.output
    script = (snap / "job.sbatch").read_text()
    assert script.splitlines()[-1] in res.output  # the dry run prints the script
    run_dir = tmp_path / "run"
    for line in ("#SBATCH --job-name=run", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=32", "#SBATCH --time=02:00:00",
                 "#SBATCH --partition=gpu", "#SBATCH --account=lab", f"#SBATCH --output={run_dir}/logs/%x-%j.out",
                 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)', "export PYTHONSAFEPATH=1",
                 f"export PYTHONPATH={snap / 'src'}:{snap / 'src' / 'kernels'}"):
        assert line in script, line
    srun = line_with(script, "srun ")
    assert srun.startswith("srun --kill-on-bad-exit=1 bash -c '")
    assert ('--nnodes 2 --nproc_per_node 4 --node_rank "$SLURM_NODEID" --master_addr "$MASTER_ADDR" '
            f"--master_port 29500 -m fsframework train {snap / 'config.yaml'}'") in srun
    assert (run_dir / "logs").is_dir()
    bash = subprocess.run(["bash", "-n", str(snap / "job.sbatch")], capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr


def _fake_slurm_tools(bin_dir: Path) -> None:
    """srun: a job step that exits 1 (torchrun's code for a rank's 75) when signalled with USR1;
    scancel signals it; scontrol names a node or records a requeue."""
    bin_dir.mkdir()
    tools = {
        "srun": 'echo $$ > "$STATE/step.pid"\ntrap \'exit 1\' USR1\n[ -n "$STEP_DONE" ] && exit 0\n'
                'while true; do sleep 0.05; done',
        "scancel": 'echo "scancel $*" >> "$STATE/calls"\nkill -USR1 "$(cat "$STATE/step.pid")"',
        "scontrol": '[ "$1" = show ] && { echo node-a; exit 0; }\necho "scontrol $*" >> "$STATE/calls"',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)


def test_slurm_script_requeues_after_the_preemption_signal(tmp_path):
    import signal
    import time

    res, snap = launch(tmp_path, "--slurm", "--dry-run", "--signal-lead", "120")
    assert res.exit_code == 0, res.output
    script = snap / "job.sbatch"
    assert "#SBATCH --signal=B:USR1@120" in script.read_text() and "#SBATCH --requeue" in script.read_text()
    srun = line_with(script.read_text(), "srun ")
    assert srun.startswith("""srun --kill-on-bad-exit=1 bash -c 'trap "" USR1; exec """)
    _fake_slurm_tools(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STATE": str(tmp_path),
           "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-a"}
    # finished before the time limit: the step's own exit code, no requeue
    done = subprocess.run(["bash", str(script)], env={**env, "STEP_DONE": "1"}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and not (tmp_path / "calls").exists(), done.stderr
    (tmp_path / "step.pid").unlink()
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "step.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)  # what SLURM sends --signal-lead seconds before --time
    out, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    assert (tmp_path / "calls").read_text().splitlines() == ["scancel --signal=USR1 42", "scontrol requeue 42"]
    assert "requeueing job 42" in out


def test_slurm_submits_with_sbatch_or_says_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    res, snap = launch(tmp_path, "--slurm")
    assert res.exit_code == 2 and "sbatch not found on PATH" in res.output and snap is None
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "sbatch"
    fake.write_text("#!/bin/sh\necho \"Submitted batch job 42 ($1)\"\n")
    fake.chmod(0o755)
    res, snap = launch(tmp_path, "--slurm")
    assert res.exit_code == 0, res.output
    assert f"Submitted batch job 42 ({snap / 'job.sbatch'})" in res.output


@pytest.mark.parametrize("content, args, message", [
    (None, ("--nodes", "2"), "hosts: not found"),
    ("node-a slots=4\nnode-b four\n", ("--nodes", "2"), ":2: 'node-b four' is not a hostfile line"),
    ("node-a slots=0\n", ("--nodes", "1"), ":1: 'node-a slots=0' is not a hostfile line"),
    ("node-a slots=4\nnode-a slots=4\n", ("--nodes", "2"), "host 'node-a' is listed twice"),
    ("# none\n", ("--nodes", "1"), "lists no hosts"),
    ("node-a slots=4\n", ("--nodes", "2"), "lists 1 host(s) but --nodes is 2"),
    ("node-a slots=4\nnode-b slots=2\n", ("--nodes", "2"), "fewer slots on node-b (slots=2)"),
], ids=["missing", "bad-line", "zero-slots", "duplicate", "empty", "too-few-hosts", "too-few-slots"])
def test_hostfile_errors(tmp_path, content, args, message):
    hosts = tmp_path / "hosts"
    if content is not None:
        hosts.write_text(content)
    res, snap = launch(tmp_path, *args, "--gpus-per-node", "4", "--hostfile", str(hosts), "--dry-run")
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output
    assert snap is None  # validated before anything is written


@pytest.mark.parametrize("args, message", [
    (("--nodes", "2", "--launcher", "deepspeed"), "needs --hostfile"),
    (("--nodes", "2"), "needs --master-addr"),
    (("--launcher", "mpirun"), "--launcher='mpirun' is not allowed"),
    (("--slurm", "--launcher", "deepspeed"), "use --launcher torchrun"),
    (("--nodes", "2", "--master-addr", "n0", "--node-rank", "2"), "--node-rank=2 must lie in [0, --nodes=2)"),
], ids=["deepspeed-no-hostfile", "no-master-addr", "unknown-launcher", "slurm-deepspeed", "node-rank"])
def test_option_errors(tmp_path, args, message):
    res, _ = launch(tmp_path, *args, "--dry-run")
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output


def test_world_size_must_be_a_multiple_of_sp(tmp_path):
    res, snap = launch(tmp_path, "--nodes", "1", "--gpus-per-node", "6", "--dry-run", overrides=("parallel.sp=4",))
    assert res.exit_code == 2
    assert "1 x 6 = 6 is not a multiple of parallel.sp=4" in " ".join(res.output.split())
    assert snap is None
    res, _ = launch(tmp_path, "--nodes", "2", "--gpus-per-node", "6", "--master-addr", "n0", "--dry-run",
                    overrides=("parallel.sp=4",))
    assert res.exit_code == 0, res.output


def test_bad_config_exits_2_naming_the_key(tmp_path):
    res, snap = launch(tmp_path, "--dry-run", overrides=("train.max_stepz=3",))
    assert res.exit_code == 2 and "train.max_stepz" in res.output
    res, _ = launch(tmp_path, "--dry-run", overrides=("parallel.zero_stage=5",))
    assert res.exit_code == 2 and "parallel.zero_stage" in res.output
    assert snap is None


def test_snapshot_holds_resolved_config_and_source_without_caches(tmp_path):
    res, snap = launch(tmp_path, "--dry-run", overrides=("train.max_steps=7", "model.d_model=64"))
    assert res.exit_code == 0, res.output
    config = (snap / "config.yaml").read_text()
    assert "max_steps: 7" in config and "d_model: 64" in config and f"run_dir: {tmp_path / 'run'}" in config
    src = snap / "src"
    for path in ("fsframework/cli/__init__.py", "fsframework/launcher/plan.py", "fsframework/config/job.py",
                 "kernels/fsf_kernels/__init__.py", "yamls/quickstart.yaml", "pyproject.toml"):
        assert (src / path).is_file(), path
    leftovers = [p for p in src.rglob("*") if p.name in ("__pycache__", ".venv", "runs", "data_cache")
                 or p.suffix == ".pyc" or p.name.endswith(".egg-info")]
    assert leftovers == []
    assert (snap / "command.sh").is_file()
    res, second = launch(tmp_path, "--dry-run")
    assert second != snap  # a second launch in the same second gets its own snapshot


def test_snapshot_leaves_out_caches_environments_and_runs(tmp_path, monkeypatch):
    from fsframework.launcher import snapshot

    tree = tmp_path / "checkout"
    for path in ("fsframework/__init__.py", "fsframework/__pycache__/x.cpython-311.pyc", "fsframework/y.pyc",
                 "kernels/fsf_kernels/__init__.py", "kernels/fsf_kernels/.pytest_cache/v", "yamls/a.yaml",
                 "yamls/runs/old/metrics.jsonl", "yamls/data_cache/shard.mds", "kernels/.venv/bin/python"):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("x")
    monkeypatch.setattr(snapshot, "source_items", lambda: {name: tree / name for name in ("fsframework", "kernels",
                                                                                          "yamls")})
    snap = snapshot.take_snapshot(tmp_path / "run", "run_dir: run\n")
    copied = sorted(str(p.relative_to(snap.src)) for p in snap.src.rglob("*") if p.is_file())
    assert copied == ["fsframework/__init__.py", "kernels/fsf_kernels/__init__.py", "yamls/a.yaml"]
    assert snap.config.read_text() == "run_dir: run\n"


def test_launch_environment_imports_the_snapshot_not_the_checkout(tmp_path):
    res, snap = launch(tmp_path, "--dry-run")
    assert res.exit_code == 0, res.output
    plan = with_snapshot(make_plan(run_dir="run", sp=1, nodes=1, gpus_per_node=1), snap / "config.yaml",
                         [snap / "src", snap / "src" / "kernels"])
    # Run from the repository root, where a plain `python -m` would find the live checkout first.
    env = {**os.environ, **plan.env()}
    probe = "import fsframework, fsf_kernels; print(fsframework.__file__); print(fsf_kernels.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(snap / "src")) for line in out.stdout.split()), out.stdout


def test_failing_rank_is_named_and_its_exit_code_returned(tmp_path, capsys):
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(
        "import sys\n"
        "print('[rank1]: RuntimeError: boom', file=sys.stderr)\n"
        "print('Failures:\\n[0]:\\n  rank      : 0 (local_rank: 0)\\n  exitcode  : -15', file=sys.stderr)\n"
        "print('Root Cause (first observed failure):\\n[0]:\\n  rank      : 1 (local_rank: 1)', file=sys.stderr)\n"
        "sys.exit(3)\n")
    result = run_command([sys.executable, str(fake)], {"PYTHONPATH": "x"})
    assert result.returncode == 3 and result.failed_rank == 1
    assert "RuntimeError: boom" in capsys.readouterr().err  # passed through as it came
