"""`fsf launch`: start a training job on many GPUs or nodes (torchrun, DeepSpeed or SLURM)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import List, Optional

import typer

from fsframework.cli.common import fail, flag, input_file, load_job_config
from fsframework.launcher.errors import LaunchError
from fsframework.launcher.launch import LaunchOptions, launch
from fsframework.launcher.scripts import SlurmOptions


def launch_command(
    config: Path = typer.Argument(..., help="YAML job file"),
    overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides"),
    nodes: int = typer.Option(1, "--nodes", help="number of nodes"),
    gpus_per_node: int = typer.Option(1, "--gpus-per-node", help="processes (GPUs) per node"),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", help="lines 'HOST slots=N', node 0 first"),
    slurm: bool = flag("write a SLURM batch script and submit it with sbatch (requeued when preempted)", "--slurm"),
    dry_run: bool = flag("write the snapshot and scripts, print them, start nothing", "--dry-run"),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="address of node 0 (default: first "
                                              "host of --hostfile, or 127.0.0.1 on one node)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="default: a free port on one node, "
                                              "29500 on several"),
    launcher: str = typer.Option("torchrun", "--launcher", help="torchrun | deepspeed"),
    node_rank: int = typer.Option(0, "--node-rank", help="which node's command to run here (several nodes, no SLURM)"),
    max_restarts: int = typer.Option(int(os.environ.get("FSF_MAX_RESTARTS", "0") or 0), "--max-restarts",
                                     help="start the job again when a rank dies or fails (not on bad input, "
                                          "preemption or Ctrl-C), at most N times, from the newest checkpoint "
                                          "(one node; default: $FSF_MAX_RESTARTS, else 0)"),
    rdzv: bool = flag("several nodes: c10d rendezvous instead of fixed node ranks", "--rdzv"),
    time: str = typer.Option("24:00:00", "--time", help="SLURM time limit"),
    partition: Optional[str] = typer.Option(None, "--partition", help="SLURM partition"),
    account: Optional[str] = typer.Option(None, "--account", help="SLURM account"),
    cpus_per_task: Optional[int] = typer.Option(None, "--cpus-per-task", help="SLURM CPUs per node (default 8 per GPU)"),
    signal_lead: int = typer.Option(300, "--signal-lead", min=1, help="SLURM: seconds before --time at which the "
                                    "job checkpoints and requeues itself (SIGUSR1)"),
) -> None:
    """Launch training of CONFIG on --nodes x --gpus-per-node ranks, from a snapshot of the code and config.

    Example: fsf launch yamls/quickstart.yaml --nodes 2 --gpus-per-node 8 --slurm --time 12:00:00
    """

    cfg = load_job_config(config, overrides)
    if hostfile is not None:
        input_file(hostfile, "--hostfile")
    options = LaunchOptions(nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher, hostfile=hostfile,
                            master_addr=master_addr, master_port=master_port, node_rank=node_rank, rdzv=rdzv,
                            slurm=slurm, dry_run=dry_run, max_restarts=max_restarts,
                            slurm_options=SlurmOptions(time=time, cpus_per_task=cpus_per_task, partition=partition,
                                                       account=account, signal_lead_s=signal_lead,
                                                       max_restarts=max_restarts))
    try:
        code = launch(cfg, options, invocation=shlex.join(["fsf", "launch", str(config), *(overrides or []),
                                                           "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node),
                                                           "--launcher", launcher]))
    except LaunchError as exc:
        fail(str(exc))
    if code:  # the launched job's own exit code
        raise typer.Exit(code)
