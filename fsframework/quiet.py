"""What a run prints besides its own lines: the libraries' messages that tell the user nothing.

Every `fsf` process calls `start()` first (the CLI's callback; torchrun's ranks are `fsf`
processes too), which installs the filters below, each narrowed to one library's message by
category, module and text, never all warnings of a kind. `set_log_level("verbose")`
(`train.log_level=verbose`, applied by the trainer once DeepSpeed is imported) takes them away
again and raises DeepSpeed's logger to INFO; `set_log_level("quiet")` puts them back.

What is filtered, and why it does not apply to this framework:

- torch's FutureWarning that `all_gather_into_tensor` and `reduce_scatter_tensor` are deprecated,
  several per ZeRO-3 step (43 of a 10-step run's 100 lines on 2 ranks): DeepSpeed's communication
  backend calls them, not fsframework; the replacement is DeepSpeed's to adopt.
- mosaicml-streaming's "you will resume training from the wrong sample", logged by every rank
  group of a sequence-parallel run (`replication` > 1) at every epoch start, resumed or not: it
  asks the caller to count a replicated sample once in `StreamingDataset.state_dict`, which
  fsframework's loader does (`fsframework.data.sample_loader.SampleCountingLoader.state_dict`
  divides by `replication`); SP resumes are tested exact.
- DeepSpeed's "You are using ZeRO with an untested optimizer": the optimizer is fsframework's
  `SkippableAdamW`, a subclass of torch's AdamW (DeepSpeed's list matches exact types), passed on
  purpose with `zero_allow_untested_optimizer` (fsframework.parallel.deepspeed_config).
- DeepSpeed's merge of ZeRO shards into one state dict (`zero_to_fp32`, when a ZeRO-3
  checkpoint is evaluated or exported) prints four lines of its progress and two tqdm bars: see
  `merging_zero_shards`.

fsframework's own `CheckpointWarning` (a damaged checkpoint skipped) is printed as one line,
`warning: MESSAGE`, without Python's file, line number and source line of the call.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import warnings
from typing import Iterator

QUIET, VERBOSE = "quiet", "verbose"
LOG_LEVELS = (QUIET, VERBOSE)

# (message regex, category, module regex) of the warnings filtered; the module is where Python
# attributes the warning: torch's deprecation decorator warns at its caller, the c10d wrapper
WARNINGS = [
    (r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated", FutureWarning,
     r"torch\.distributed\.c10d_logger"),
]

DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed.utils.logging's logger (its own handler on stdout, no propagation)
STREAMING_LOGGER = "streaming.base.dataset"


class DropMessages(logging.Filter):
    """Drops a logger's records whose message contains one of `texts`."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


LOG_FILTERS = {
    DEEPSPEED_LOGGER: DropMessages("You are using ZeRO with an untested optimizer"),
    STREAMING_LOGGER: DropMessages("Otherwise, you will resume training from the wrong sample"),
}

_level = QUIET


def start() -> None:
    """A process's start: the quiet filters, and fsframework's own warnings on one line."""
    warnings.formatwarning = _one_line_for_ours
    set_log_level(QUIET)


def set_log_level(level: str) -> None:
    """`train.log_level`: "quiet" filters the messages above; "verbose" shows them and
    DeepSpeed's INFO lines (its engine's settings, its checkpoint loading), as the libraries
    print them. Call again once DeepSpeed is imported: its import sets its logger to WARNING."""
    global _level
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {LOG_LEVELS}")
    _level = level
    # filterwarnings first removes an equal filter, so the newest call's action comes first
    action = "ignore" if level == QUIET else "default"  # default: Python's own for these categories
    for message, category, module in WARNINGS:
        warnings.filterwarnings(action, message=message, category=category, module=module)
    for name, dropper in LOG_FILTERS.items():
        (logging.getLogger(name).addFilter if level == QUIET else logging.getLogger(name).removeFilter)(dropper)
    deepspeed = logging.Logger.manager.loggerDict.get(DEEPSPEED_LOGGER)
    if isinstance(deepspeed, logging.Logger) and deepspeed.handlers:  # created by DeepSpeed's import
        threshold = logging.INFO if level == VERBOSE else logging.WARNING  # WARNING: DeepSpeed's default
        deepspeed.setLevel(threshold)
        for handler in deepspeed.handlers:
            handler.setLevel(threshold)


def verbose() -> bool:
    return _level == VERBOSE


@contextlib.contextmanager
def merging_zero_shards() -> Iterator[None]:
    """Around DeepSpeed's `zero_to_fp32` merge: unless verbose, without its progress lines on
    stdout ("Processing zero checkpoint", "Detected checkpoint of type", ...) and its tqdm bars
    ("Loading checkpoint shards", "Gathering sharded weights"), which say nothing the framework's
    own lines do not; its errors are raised as before."""
    if verbose():
        yield
        return
    from deepspeed.utils import zero_to_fp32

    bars = zero_to_fp32.tqdm
    zero_to_fp32.tqdm = functools.partial(bars, disable=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        zero_to_fp32.tqdm = bars


_python_format = warnings.formatwarning  # Python's own, for every other warning


class UserFacingWarning(UserWarning):
    """A warning of the framework's own that is a message for the user (e.g. `CheckpointWarning`, a
    damaged checkpoint skipped), printed as one line without the source line that raised it."""


def _one_line_for_ours(message, category, filename, lineno, line=None) -> str:
    if issubclass(category, UserFacingWarning):  # a message for the user, not a place in the code
        return f"warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)
