"""What the commands run, imported together on first use (`fsframework.cli.common.runtime`).

These modules load numpy, torch and the models (about a second); `fsf --help` and a job's one-line
config error start without them. Modules, not names: a command looks its function up when it
runs, so a test that replaces one (e.g. `fsframework.export.export_checkpoint`) is seen."""

from fsframework import export
from fsframework.data import inspect_shards, loader
from fsframework.eval import calibrate, generate, harness, runner
from fsframework.ops import launch_check
from fsframework.parallel import process_group
from fsframework.train import nonfinite, preemption, trainer

__all__ = ["calibrate", "export", "generate", "harness", "inspect_shards", "launch_check", "loader",
           "nonfinite", "preemption", "process_group", "runner", "trainer"]
