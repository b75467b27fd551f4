"""`fsf launch`: validate, snapshot, write the launch script, then print it (dry run),
submit it (SLURM) or start this node's share of the job."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from fsframework.config import Config, to_yaml
from fsframework.launcher.agent import QUIET_CODES
from fsframework.launcher.errors import LaunchError
from fsframework.launcher.plan import LaunchPlan, make_plan, node_commands, shell_join, with_snapshot
from fsframework.launcher.run import run_command
from fsframework.launcher.scripts import SlurmOptions, command_script, slurm_script
from fsframework.launcher.snapshot import Snapshot, take_snapshot
from fsframework.train.restarts import RESTART_ENV, RESTART_REASON_ENV


@dataclass(frozen=True)
class LaunchOptions:
    nodes: int = 1
    gpus_per_node: int = 1
    launcher: str = "torchrun"
    hostfile: Path | None = None
    master_addr: str | None = None
    master_port: int | None = None
    node_rank: int = 0  # which node's command this machine runs (multi-node without SLURM)
    rdzv: bool = False
    slurm: bool = False
    dry_run: bool = False
    slurm_options: SlurmOptions = field(default_factory=SlurmOptions)
    # start the whole job again after a rank fails, at most this many times (one node; see `restarts`)
    max_restarts: int = 0


def _print_summary(console: Console, cfg: Config, plan: LaunchPlan, snap: Snapshot, slurm: bool) -> None:
    dp = plan.world_size // cfg.parallel.sp
    rows = [("run_dir", cfg.run_dir), ("launcher", plan.launcher),
            ("world", f"{plan.nodes} node(s) x {plan.gpus_per_node} process(es) = {plan.world_size} ranks "
                      f"(data parallel {dp} x sequence parallel {cfg.parallel.sp})"),
            ("rendezvous", f"{'first node of the allocation' if slurm else plan.master_addr}:{plan.master_port}"), ("snapshot", str(snap.dir)),
            ("config", str(snap.config))]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        # Unwrapped lines, so paths and commands can be copied whole from any terminal width.
        console.print(Text.assemble((key.ljust(width), "bold"), "  ", value))


def _print_commands(console: Console, plan: LaunchPlan) -> None:
    console.print(Text("environment", style="bold"))
    for key, value in plan.env().items():
        console.print(Text(f"  export {key}={value}"))
    for label, argv in node_commands(plan):
        console.print(Text(label, style="bold"))
        console.print(Text("  " + shell_join(argv)))


def _check_tools(options: LaunchOptions) -> None:
    # Before the snapshot, so a hopeless launch leaves nothing behind.
    if options.slurm and not options.dry_run and shutil.which("sbatch") is None:
        raise LaunchError("sbatch not found on PATH: submit from a SLURM login node, or use --dry-run "
                          "to write and print the batch script only")
    if not options.slurm and not 0 <= options.node_rank < options.nodes:
        raise LaunchError(f"--node-rank={options.node_rank} must lie in [0, --nodes={options.nodes})")


def launch(cfg: Config, options: LaunchOptions, *, invocation: str, console: Console | None = None) -> int:
    """Run `fsf launch`; returns the exit code (of the job when it ran here)."""
    console = console or Console(highlight=False, soft_wrap=True)
    plan = make_plan(run_dir=cfg.run_dir, sp=cfg.parallel.sp, nodes=options.nodes, gpus_per_node=options.gpus_per_node,
                     launcher=options.launcher, hostfile=options.hostfile, master_addr=options.master_addr,
                     master_port=options.master_port, rdzv=options.rdzv, slurm=options.slurm)
    _check_tools(options)
    if options.max_restarts < 0:
        raise LaunchError(f"--max-restarts={options.max_restarts} must be >= 0")
    if options.max_restarts and plan.launcher != "torchrun":
        raise LaunchError("--max-restarts needs --launcher torchrun (its agent tells a failure from bad input, "
                          "preemption and Ctrl-C, which are never restarted)")
    if options.max_restarts and plan.nodes > 1 and not options.slurm:
        raise LaunchError("--max-restarts restarts the job on one node, or with --slurm in its batch script (srun on "
                          "every node); started node by node, rerun the nodes' commands instead (a rerun resumes "
                          "from the newest checkpoint)")
    if options.slurm and "SIGUSR1" not in cfg.train.preempt_signals:
        raise LaunchError("--slurm: the batch script signals the ranks with SIGUSR1 before the time limit, but "
                          f"train.preempt_signals={list(cfg.train.preempt_signals)} lacks it; add SIGUSR1")
    snap = take_snapshot(Path(cfg.run_dir), to_yaml(cfg))
    plan = with_snapshot(plan, snap.config, snap.pythonpath)
    (snap.dir / "command.sh").write_text(command_script(plan, invocation))
    _print_summary(console, cfg, plan, snap, options.slurm)

    if options.slurm:
        log_dir = Path(cfg.run_dir).resolve() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)  # SLURM does not create the directory of --output
        script_path = snap.dir / "job.sbatch"
        script_path.write_text(slurm_script(plan, options.slurm_options, script=script_path, log_dir=log_dir))
        if options.dry_run:
            console.print(Text(f"SLURM batch script {script_path}", style="bold"))
            console.print(Text(script_path.read_text()))
            console.print("[yellow]dry run:[/] nothing submitted")
            return 0
        done = subprocess.run(["sbatch", str(script_path)], capture_output=True, text=True)
        console.print(Text((done.stdout + done.stderr).strip()))
        return done.returncode

    _print_commands(console, plan)
    if options.dry_run:
        console.print(f"[yellow]dry run:[/] nothing started; the same commands are in {snap.dir / 'command.sh'}")
        return 0
    commands = node_commands(plan)
    label, argv = commands[0] if plan.launcher == "deepspeed" else commands[options.node_rank]
    if plan.nodes > 1 and plan.launcher == "torchrun":
        console.print(f"starting {label}; start the other nodes with their own --node-rank "
                      f"(or `bash {snap.dir / 'command.sh'} NODE_RANK`)")
    restart, env = 0, plan.env()
    while True:
        result = run_command(argv, env, forward_signals=plan.launcher == "torchrun")
        if result.returncode in QUIET_CODES and plan.launcher == "torchrun":
            return result.returncode  # stopped on purpose (Ctrl-C, preemption, bad input): the ranks said so
        if not result.returncode:
            return 0
        who = f"rank {result.failed_rank}" if result.failed_rank is not None else "a rank"
        how = result.how or f"failed ({plan.launcher} exit code {result.returncode})"
        if restart == options.max_restarts:
            console.print(f"[bold red]error:[/] {who} {how} and ended the job ({plan.launcher} exit code "
                          f"{result.returncode}); its traceback, if any, is in the output above"
                          + (f" ({restart} restart(s) spent)" if restart else ""))
            return result.returncode
        restart += 1
        reason = f"{who} {how}"
        record_restart(Path(cfg.run_dir), restart, reason, result)
        console.print(f"[yellow]restart {restart} of {options.max_restarts}:[/] {reason}; every rank starts "
                      "again from the newest complete checkpoint")
        env = {**plan.env(), RESTART_ENV: str(restart), RESTART_REASON_ENV: reason}


def record_restart(run_dir: Path, restart: int, reason: str, result) -> None:
    """One line per restart in `<run>/restarts.jsonl`: when, which, why (the trainer's log says it too)."""
    import datetime
    import json

    line = {"restart": restart, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rank": result.failed_rank, "how": result.how, "exit_code": result.returncode, "reason": reason}
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "restarts.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
