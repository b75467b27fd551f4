"""What to start where: world size, rendezvous address, and the torchrun / DeepSpeed
command lines of one job. Pure functions of the options, so a dry run and the tests
see exactly what a real launch runs."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fsframework.config import ConfigError, check_world_size
from fsframework.launcher.errors import LaunchError
from fsframework.launcher.hostfile import Host, read_hostfile

LAUNCHERS = ("torchrun", "deepspeed")
DEFAULT_PORT = 29500  # torchrun's default; every node of a job must agree on it


class Shell(str):
    """An argument the shell expands at run time (`"$SLURM_NODEID"`): written unquoted."""


def shell_join(argv: list[str]) -> str:
    return " ".join(a if isinstance(a, Shell) else shlex.quote(a) for a in argv)


def _executable(name: str) -> str:
    # The launcher script installed beside this interpreter, so ranks run the same
    # Python environment as `fsf`, even when that environment is not activated.
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LaunchPlan:
    nodes: int
    gpus_per_node: int
    launcher: str = "torchrun"
    master_addr: str = "127.0.0.1"
    # False when nothing named node 0's address (--slurm: the allocation's first host, known at run time)
    master_addr_given: bool = True
    master_port: int = DEFAULT_PORT
    job_name: str = "fsf"
    rdzv: bool = False  # multi-node torchrun: c10d rendezvous instead of fixed node ranks
    hosts: tuple[Host, ...] = ()
    hostfile: Path | None = None
    omp_threads: int = 1
    workdir: Path = field(default_factory=Path.cwd)  # relative paths of the config resolve here
    config: Path = Path("config.yaml")  # the snapshot's resolved config
    pythonpath: tuple[Path, ...] = ()  # the snapshot's import roots

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def env(self) -> dict[str, str]:
        """Variables every rank needs. PYTHONSAFEPATH stops `python -m` from putting the
        working directory (often a live checkout) ahead of the snapshot on sys.path."""
        return {"PYTHONPATH": os.pathsep.join(map(str, self.pythonpath)), "PYTHONSAFEPATH": "1",
                "OMP_NUM_THREADS": str(self.omp_threads)}

    def host_label(self, node_rank: int) -> str:
        return self.hosts[node_rank].name if self.hosts else f"node {node_rank}"


def make_plan(*, run_dir: str, sp: int, nodes: int, gpus_per_node: int, launcher: str = "torchrun",
              hostfile: Path | None = None, master_addr: str | None = None, master_port: int | None = None,
              rdzv: bool = False, slurm: bool = False, omp_threads: int | None = None) -> LaunchPlan:
    """Check the options against each other and the config; raise LaunchError naming the option."""
    if launcher not in LAUNCHERS:
        raise LaunchError(f"--launcher={launcher!r} is not allowed; choose one of {', '.join(LAUNCHERS)}")
    if nodes < 1 or gpus_per_node < 1:
        raise LaunchError(f"--nodes ({nodes}) and --gpus-per-node ({gpus_per_node}) must be >= 1")
    world = nodes * gpus_per_node
    try:
        check_world_size(world, sp, world=f"world size --nodes x --gpus-per-node = {nodes} x {gpus_per_node} =")
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    if slurm and launcher != "torchrun":
        raise LaunchError("--slurm starts one torchrun per node with srun; use --launcher torchrun")
    if slurm and hostfile is not None:
        raise LaunchError("--slurm takes its nodes from the allocation; drop --hostfile")
    hosts = tuple(read_hostfile(hostfile, nodes=nodes, gpus_per_node=gpus_per_node)) if hostfile else ()
    if launcher == "deepspeed" and nodes > 1 and not hosts:
        raise LaunchError(f"--launcher deepspeed on {nodes} nodes needs --hostfile (lines 'HOST slots=N')")
    master_addr_given = master_addr is not None or bool(hosts) or nodes == 1
    if master_addr is None:
        if hosts:
            master_addr = hosts[0].name
        elif nodes == 1 or slurm:
            master_addr = "127.0.0.1"  # SLURM scripts replace it with the first node of the allocation
        else:
            raise LaunchError(f"--nodes {nodes} without --slurm needs --master-addr (the address of node 0) "
                              "or --hostfile")
    if master_port is None:
        # A single node owns its rendezvous: a free port lets several jobs share a machine.
        master_port = _free_port() if nodes == 1 and not slurm else DEFAULT_PORT
    if omp_threads is None:
        omp_threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    job_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(run_dir).name) or "fsf"
    return LaunchPlan(nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher, master_addr=master_addr,
                      master_addr_given=master_addr_given, master_port=master_port, job_name=job_name, rdzv=rdzv, hosts=hosts,
                      hostfile=Path(hostfile).resolve() if hostfile else None, omp_threads=omp_threads)


def with_snapshot(plan: LaunchPlan, config: Path, pythonpath: list[Path]) -> LaunchPlan:
    return dataclasses.replace(plan, config=config, pythonpath=tuple(pythonpath))


def train_args(plan: LaunchPlan) -> list[str]:
    # The snapshot's config already holds the overrides, so none are repeated here.
    return ["fsframework", "train", str(plan.config)]


def agent_command() -> list[str]:
    """torchrun, as `fsframework.launcher.agent` runs it: the job ends as its ranks did (exit
    code 130 on Ctrl-C, 75 when preempted, 2 on bad input, each said in one line by the ranks)
    instead of in torchrun's failure report and exit code 1. The interpreter of `fsf`, so ranks
    run the same Python environment even when it is not activated."""
    return [sys.executable, "-m", "fsframework.launcher.agent"]


def torchrun_command(plan: LaunchPlan, node_rank: int | str = 0, *, master_addr: str | None = None) -> list[str]:
    """`torchrun ...` (through `agent_command`) for one node. `node_rank` / `master_addr` may be
    Shell values that a batch script expands on each node."""
    addr = master_addr if master_addr is not None else plan.master_addr
    argv = [*agent_command(), "--nnodes", str(plan.nodes), "--nproc_per_node", str(plan.gpus_per_node)]
    if plan.nodes > 1 and plan.rdzv:
        # Ranks are handed out by the rendezvous, so node_rank would be ignored; omit it.
        argv += ["--rdzv_id", plan.job_name, "--rdzv_backend", "c10d",
                 "--rdzv_endpoint", (Shell if isinstance(addr, Shell) else str)(f"{addr}:{plan.master_port}")]
    else:
        argv += ["--node_rank", node_rank if isinstance(node_rank, Shell) else str(node_rank),
                 "--master_addr", addr, "--master_port", str(plan.master_port)]
    return argv + ["-m", *train_args(plan)]


def deepspeed_command(plan: LaunchPlan) -> list[str]:
    """`deepspeed ...`: one command on node 0 that reaches the others over ssh (pdsh)."""
    argv = [_executable("deepspeed")]
    if plan.hostfile is not None:
        argv += ["--hostfile", str(plan.hostfile)]
    argv += ["--num_nodes", str(plan.nodes), "--num_gpus", str(plan.gpus_per_node),
             "--master_addr", plan.master_addr, "--master_port", str(plan.master_port), "--module", *train_args(plan)]
    return argv


def node_commands(plan: LaunchPlan) -> list[tuple[str, list[str]]]:
    """(label, argv) of every command to start: one per node for torchrun, one in all for DeepSpeed."""
    if plan.launcher == "deepspeed":
        return [("all nodes (from node 0)", deepspeed_command(plan))]
    return [(f"node_rank {r} ({plan.host_label(r)})", torchrun_command(plan, r)) for r in range(plan.nodes)]
