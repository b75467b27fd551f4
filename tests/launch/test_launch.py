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


@pytest.mark.parametrize("args, given", [(("--slurm", "--dry-run"), None),
                                         (("--master-addr", "node0", "--dry-run"), "node0"),
                                         (("--master-addr", "node0", "--rdzv", "--dry-run"), "node0")],
                         ids=["slurm", "master-addr", "rdzv"])
def test_two_node_command_script_takes_node_0_from_the_scheduler_or_refuses(tmp_path, args, given):
    """`bash command.sh NODE_RANK` on every node: node 0's address comes from MASTER_ADDR, the SLURM
    allocation or the launch's --master-addr, never 127.0.0.1; with none it stops in one line."""
    res, snap = launch(tmp_path, "--nodes", "2", "--gpus-per-node", "2", *args)
    assert res.exit_code == 0, res.output
    script = snap / "command.sh"
    assert "127.0.0.1" not in script.read_text()
    bin_dir = tmp_path / "bin"  # stand-ins: scontrol names the allocation's hosts; python prints its arguments
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nprintf "gpu-a\\ngpu-b\\n"\n')
    (bin_dir / "python").write_text('#!/bin/sh\necho "$@"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    text = script.read_text().replace(f"exec {sys.executable} ", f"exec {bin_dir / 'python'} ")
    script.write_text(text)
    base = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "SLURM_JOB_NODELIST")}
    base["PATH"] = f"{bin_dir}:{base['PATH']}"

    def run(**env):
        return subprocess.run(["bash", str(script), "1"], env={**base, **env}, capture_output=True, text=True)

    endpoint = "--rdzv_endpoint {}:29500" if "--rdzv" in args else "--master_addr {} --master_port 29500"
    done = run()
    if given is None:
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.strip().splitlines() == ["error: no address of node 0 for this 2-node job: set "
                                                    "MASTER_ADDR, or run inside the SLURM allocation"]
    else:
        assert done.returncode == 0 and endpoint.format(given) in done.stdout, done
    done = run(SLURM_JOB_NODELIST="gpu-[a-b]")
    assert done.returncode == 0 and endpoint.format(given or "gpu-a") in done.stdout, done
    done = run(MASTER_ADDR="10.0.0.7", SLURM_JOB_NODELIST="gpu-[a-b]")
    assert done.returncode == 0 and endpoint.format("10.0.0.7") in done.stdout, done
    if "--rdzv" not in args:
        assert '--node_rank 1 ' in done.stdout


@pytest.mark.parametrize("first, codes, expected", [
    (130, [130, 130], 130), (75, [75, -15], 75), (2, [2, 2], 2), (130, [130, 1], None), (1, [1, 130], None),
    (-9, [-9, 130], None), (0, [0], None)])
def test_the_agent_ends_as_the_ranks_did(first, codes, expected):
    from fsframework.launcher.agent import job_exit_code

    assert job_exit_code(first, codes) == expected


def _job(tmp_path: Path, *argv: str, signal_after_steps: int | None = None, sig=None):
    """Run ARGV in a process group of its own, as a shell runs a command in a terminal; optionally
    send `sig` to the whole group (a terminal's Ctrl-C) once `signal_after_steps` more steps are logged."""
    import signal as signals
    import time

    metrics = tmp_path / "run" / "metrics.jsonl"
    before = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.Popen(list(argv), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        if signal_after_steps is not None:
            deadline = time.monotonic() + 180
            while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= before + signal_after_steps):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.1)
            os.killpg(proc.pid, sig or signals.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signals.SIGKILL)
    return proc.returncode, out, err


TINY = ("data.seq_len=64", "data.micro_batch_size=2", "data.embedded_python_chars=200000",
        "data.embedded_retrieval_docs=40", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
        "model.name=tfpp", "train.max_steps=100000", "train.ckpt_every=3", "optim.warmup_steps=2",
        "train.progress=false", "train.tensorboard=false")


def _launch_cmd(tmp_path: Path, data_cache: str) -> list[str]:
    return [sys.executable, "-m", "fsframework", "launch", QUICKSTART, f"run_dir={tmp_path / 'run'}",
            f"data.cache_dir={data_cache}", *TINY, "--gpus-per-node", "2"]


@pytest.mark.ranks
def test_ctrl_c_under_fsf_launch_ends_with_the_ranks_line_and_130(tmp_path, data_cache):
    """2 CPU ranks: a Ctrl-C (SIGINT to the terminal's process group) ends `fsf launch` with the
    ranks' one line and code 130; no SignalException traceback or ChildFailedError report."""
    from fsframework.train.preemption import EXIT_INTERRUPTED

    code, out, err = _job(tmp_path, *_launch_cmd(tmp_path, data_cache), signal_after_steps=4)
    assert code == EXIT_INTERRUPTED, out + err
    assert len([line for line in out.splitlines() if "interrupted (SIGINT) at step" in line]) == 1, out
    assert "a rerun resumes from" in out and "error:" not in out + err
    assert err.strip() == "", err


@pytest.mark.ranks
def test_sigterm_under_fsf_launch_ends_with_the_preemption_line_and_75(tmp_path, data_cache):
    import signal as signals

    from fsframework.train.preemption import EXIT_PREEMPTED

    code, out, err = _job(tmp_path, *_launch_cmd(tmp_path, data_cache), signal_after_steps=4, sig=signals.SIGTERM)
    assert code == EXIT_PREEMPTED, out + err
    assert "preempted (SIGTERM) at step" in out and "error:" not in out + err
    assert err.strip() == "", err


@pytest.mark.ranks
def test_a_config_error_under_torchrun_is_one_line_from_rank_0(tmp_path):
    """Every rank finds the typo; rank 0 alone says so. The agent of `fsf launch` then ends with
    that line and code 2; raw torchrun adds its own failure report and exit code 1 (its agent's
    output, which the ranks cannot change)."""
    args = ["--nproc_per_node", "2", "-m", "fsframework", "train", QUICKSTART, f"run_dir={tmp_path / 'run'}",
            "parallel.sp=2", "train.max_stepz=3"]
    line = "error: invalid config key 'train.max_stepz'"
    code, out, err = _job(tmp_path, sys.executable, "-m", "fsframework.launcher.agent", *args)
    assert code == 2 and out == "", out + err
    assert len(err.strip().splitlines()) == 1 and err.startswith(line), err
    code, out, err = _job(tmp_path, sys.executable, "-m", "torch.distributed.run", *args)
    assert code == 1 and err.count(line) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_root_cause_names_the_rank_and_how_it_ended(tmp_path):
    from fsframework.launcher.run import root_cause

    report = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-07_16:00:00",
              "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 4242)"]
    assert root_cause(report) == (1, "was killed by SIGKILL")
    assert root_cause([*report[:4], "  exitcode  : 1 (pid: 4242)"]) == (1, "exited with code 1")
    assert root_cause(["no report"]) == (None, None)


@pytest.mark.parametrize("args, message", [(("--max-restarts", "-1"), "must be >= 0"),
                                           (("--max-restarts", "1", "--launcher", "deepspeed"), "needs --launcher torchrun"),
                                           (("--max-restarts", "1", "--nodes", "2", "--master-addr", "n0"),
                                            "restarts the job on one node, or with --slurm")])
def test_max_restarts_errors(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "fsframework", "launch", QUICKSTART, f"run_dir={tmp_path / 'r'}",
                           *args, "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_the_slurm_script_restarts_a_failed_job_step(tmp_path):
    """`--max-restarts` under `--slurm`: the batch script runs srun again after a failure (not after bad
    input, preemption or Ctrl-C), at most N times, telling the ranks the restart's number; bash reads it."""
    proc = subprocess.run([sys.executable, "-m", "fsframework", "launch", QUICKSTART, f"run_dir={tmp_path / 'r'}",
                           "--slurm", "--nodes", "2", "--dry-run", "--max-restarts", "3"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = next((tmp_path / "r" / "launch").glob("*/job.sbatch")).read_text()
    assert 'case "$code" in 0|2|75|130) break ;; esac' in script and '[ "$restart" -ge 3 ]' in script
    assert 'export FSF_RESTART="$restart"' in script and script.count("srun ") == 1
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
