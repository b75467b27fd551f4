"""Generated launch scripts: `command.sh` for torchrun / DeepSpeed and a SLURM batch
script rendered from `launch/slurm.sbatch.tmpl`."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from fsframework.launcher.errors import LaunchError
from fsframework.launcher.plan import LaunchPlan, Shell, deepspeed_command, shell_join, torchrun_command

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class SlurmOptions:
    time: str = "24:00:00"
    cpus_per_task: int | None = None  # None: 8 per GPU
    partition: str | None = None
    account: str | None = None
    # seconds before the time limit at which SLURM signals the job to checkpoint and requeue
    signal_lead_s: int = 300
    # how many times the batch script starts a failed job step again (`fsf launch --max-restarts`)
    max_restarts: int = 0

    def cpus(self, gpus_per_node: int) -> int:
        return self.cpus_per_task or 8 * gpus_per_node


def template_path() -> Path:
    """`launch/` beside the package: the repository's (or snapshot's) top-level folder."""
    return Path(__file__).resolve().parents[2] / "launch" / "slurm.sbatch.tmpl"


def render(template: str, values: dict[str, str]) -> str:
    """Fill `{{name}}` placeholders; a placeholder without a value is an error, not a blank."""
    missing = sorted({m for m in _PLACEHOLDER.findall(template) if m not in values})
    if missing:
        raise LaunchError(f"SLURM template has placeholders without values: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _pythonpath(plan: LaunchPlan) -> str:
    return shlex.quote(":".join(map(str, plan.pythonpath)))


def command_script(plan: LaunchPlan, invocation: str) -> str:
    """A shell script that starts this node's part of the job: `bash command.sh [NODE_RANK]`."""
    lines = ["#!/bin/bash", f"# Written by: {invocation}"]
    if plan.launcher == "torchrun" and plan.nodes > 1 and not plan.rdzv:
        lines.append("# Run on every node with its rank: bash command.sh NODE_RANK")
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(plan.workdir))}",
              f"export PYTHONPATH={_pythonpath(plan)}${{PYTHONPATH:+:$PYTHONPATH}}", "export PYTHONSAFEPATH=1",
              f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{plan.omp_threads}}}"]
    if plan.launcher == "deepspeed":
        lines.append(f"exec {shell_join(deepspeed_command(plan))}")
    elif plan.nodes == 1:
        argv = torchrun_command(plan, Shell('"$NODE_RANK"'))
        lines += ["NODE_RANK=${1:-0}", f"exec {shell_join(argv)}"]
    else:
        argv = torchrun_command(plan, Shell('"$NODE_RANK"'), master_addr=Shell('"$MASTER_ADDR"'))
        lines += ["NODE_RANK=${1:-0}", *_master_addr_lines(plan), f"exec {shell_join(argv)}"]
    return "\n".join(lines) + "\n"


def _master_addr_lines(plan: LaunchPlan) -> list[str]:
    """Shell lines that set MASTER_ADDR, node 0's address, on every node of a multi-node job, or
    stop with one line when nothing names it: 127.0.0.1 would start a job of its own on each node."""
    if plan.master_addr_given:
        lines = ["# Node 0's address: MASTER_ADDR from the environment, else the one given at launch.",
                 f"MASTER_ADDR=${{MASTER_ADDR:-{shlex.quote(plan.master_addr)}}}"]
    else:
        lines = ["# Node 0's address: MASTER_ADDR from the environment, else the first host of the SLURM allocation.",
                 'if [ -z "${MASTER_ADDR:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
                 '    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                 "fi"]
    lines += ['if [ -z "${MASTER_ADDR:-}" ]; then',
              f'    echo "error: no address of node 0 for this {plan.nodes}-node job: set MASTER_ADDR, or run '
              'inside the SLURM allocation" >&2',
              "    exit 2",
              "fi"]
    return lines


def slurm_script(plan: LaunchPlan, options: SlurmOptions, *, script: Path, log_dir: Path) -> str:
    """The batch script of `--slurm`: one srun task per node, each running torchrun; requeued
    after a preemption signal ahead of the time limit (`options.signal_lead_s`)."""
    # Fixed node ranks from SLURM: every task knows its rank, so no c10d rendezvous is needed.
    static = dataclasses.replace(plan, rdzv=False)
    node = torchrun_command(static, Shell('"$SLURM_NODEID"'), master_addr=Shell('"$MASTER_ADDR"'))
    extra = [f"#SBATCH --{name}={value}" for name, value in (("partition", options.partition),
                                                              ("account", options.account)) if value]
    values = {"script": str(script), "job_name": plan.job_name, "nodes": str(plan.nodes),
              "gpus_per_node": str(plan.gpus_per_node), "cpus_per_task": str(options.cpus(plan.gpus_per_node)),
              "time": options.time, "log_dir": str(log_dir), "extra_sbatch": "\n".join(extra),
              "workdir": shlex.quote(str(plan.workdir)), "pythonpath": _pythonpath(plan),
              "omp_threads": str(max(1, options.cpus(plan.gpus_per_node) // plan.gpus_per_node)),
              "signal_lead": str(options.signal_lead_s), "max_restarts": str(options.max_restarts),
              # torchrun ignores USR1 (inherited by its workers, which install their own handler):
              # the preemption signal reaches the training ranks, not the agent that would die of it
              "node_command": shlex.quote('trap "" USR1; exec ' + shell_join(node))}
    path = template_path()
    if not path.is_file():
        raise LaunchError(f"SLURM template not found: {path}")
    return render(path.read_text(), values)
