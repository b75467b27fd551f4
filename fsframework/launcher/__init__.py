"""Multi-GPU / multi-node launch: torchrun and DeepSpeed command lines, hostfiles,
SLURM batch scripts and code snapshots (`fsf launch`).

Nothing here imports torch: a dry run must work on a login node without GPUs.
"""

from fsframework.launcher.errors import LaunchError
from fsframework.launcher.hostfile import Host, read_hostfile
from fsframework.launcher.plan import LaunchPlan, deepspeed_command, torchrun_command
from fsframework.launcher.snapshot import Snapshot, take_snapshot

__all__ = ["Host", "LaunchError", "LaunchPlan", "Snapshot", "deepspeed_command", "read_hostfile", "take_snapshot",
           "torchrun_command"]
