"""What a run prints besides its own lines (fsframework.quiet): the libraries' messages that say
nothing to a user are filtered by default, each by its source and text, and `train.log_level=verbose`
brings them back with DeepSpeed's INFO lines; a skipped damaged checkpoint is one plain line.
(tests/parallel/test_train_parallel.py checks the log of a real SP + ZeRO-3 resume on 2 ranks.)"""

from __future__ import annotations

import io
import logging
import warnings

import pytest

from fsframework import quiet
from fsframework.checkpoints import CheckpointWarning
from fsframework.config import ConfigError, load_config
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


@pytest.fixture
def restored():
    """Each test ends with the process quiet, as every `fsf` command starts."""
    with warnings.catch_warnings():
        yield
    quiet.set_log_level(quiet.QUIET)


def _torch_deprecated_collective() -> list[warnings.WarningMessage]:
    """The FutureWarning torch gives when DeepSpeed's ZeRO-3 gathers a parameter (the call itself
    fails: no process group; the warning comes first)."""
    import torch
    import torch.distributed as dist

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.set_log_level(quiet.VERBOSE if quiet.verbose() else quiet.QUIET)  # in front of "default"
        try:
            dist.all_gather_into_tensor(torch.zeros(2), torch.zeros(1))
        except Exception:  # noqa: BLE001 - no default process group
            pass
    return [w for w in caught if issubclass(w.category, FutureWarning)]


def test_torchs_deprecation_of_deepspeeds_collectives_is_filtered_unless_verbose(restored):
    quiet.start()
    assert _torch_deprecated_collective() == []
    quiet.set_log_level(quiet.VERBOSE)
    shown = _torch_deprecated_collective()
    assert shown and "all_gather_into_tensor" in str(shown[0].message)


def test_only_the_named_warning_is_filtered(restored):
    quiet.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.set_log_level(quiet.QUIET)
        warnings.warn_explicit("`torch.distributed.all_gather_into_tensor` is deprecated.", FutureWarning,
                               "c10d_logger.py", 1, module="torch.distributed.c10d_logger")
        warnings.warn_explicit("`torch.distributed.something_else` is deprecated.", FutureWarning,
                               "c10d_logger.py", 2, module="torch.distributed.c10d_logger")
        warnings.warn_explicit("`torch.distributed.all_gather_into_tensor` is deprecated.", FutureWarning,
                               "mine.py", 3, module="fsframework.mine")
    assert [w.lineno for w in caught] == [2, 3]


def _records(name: str) -> list[logging.LogRecord]:
    """What logger `name` lets through, caught by a handler of its own."""
    logger = logging.getLogger(name)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        logger.info("DeepSpeed info: version=0")
        logger.warning("**** You are using ZeRO with an untested optimizer, proceed with caution *****")
        logger.warning("The `replication` arg has been set to 2 and training is resuming from sample 20. Make sure "
                       "... Otherwise, you will resume training from the wrong sample.")
        logger.warning("a warning of its own")
    finally:
        logger.removeHandler(handler)
    return records


def test_deepspeed_says_info_only_when_verbose_and_never_the_untested_optimizer_unless_verbose(restored):
    from deepspeed.utils import logger  # its import sets its logger to WARNING

    quiet.start()
    assert [r.getMessage() for r in _records(logger.name)][-1:] == ["a warning of its own"]
    assert len(_records(logger.name)) == 2  # the replication message is streaming's, not filtered here
    quiet.set_log_level(quiet.VERBOSE)
    assert len(_records(logger.name)) == 4
    assert logger.handlers and all(h.level <= logging.INFO for h in logger.handlers)  # its own handler prints them
    quiet.set_log_level(quiet.QUIET)
    assert logger.getEffectiveLevel() == logging.WARNING and all(h.level == logging.WARNING for h in logger.handlers)


def test_streamings_replication_warning_is_filtered_unless_verbose(restored):
    quiet.start()
    messages = [r.getMessage() for r in _records(quiet.STREAMING_LOGGER)]
    assert "a warning of its own" in messages and not any("wrong sample" in m for m in messages), messages
    quiet.set_log_level(quiet.VERBOSE)
    assert any("wrong sample" in r.getMessage() for r in _records(quiet.STREAMING_LOGGER))


def test_the_streaming_logger_named_is_the_one_that_warns():
    import streaming.base.dataset as dataset

    assert dataset.logger.name == quiet.STREAMING_LOGGER


def test_merging_zero_shards_prints_nothing_unless_verbose(restored, capsys):
    from deepspeed.utils import zero_to_fp32

    quiet.start()
    with quiet.merging_zero_shards():
        print("Processing zero checkpoint")
        list(zero_to_fp32.tqdm(range(3), desc="Loading checkpoint shards", file=None))
    out = capsys.readouterr()
    assert out.out == "" and "Loading checkpoint shards" not in out.err
    quiet.set_log_level(quiet.VERBOSE)
    with quiet.merging_zero_shards():
        print("Processing zero checkpoint")
    assert "Processing zero checkpoint" in capsys.readouterr().out


def test_a_checkpoint_warning_is_one_line_without_the_source(restored):
    quiet.start()
    assert warnings.formatwarning(CheckpointWarning("skipping checkpoint x"), CheckpointWarning, "cli/eval.py",
                                  40, "resolve_checkpoint(path)") == "warning: skipping checkpoint x\n"
    other = warnings.formatwarning(UserWarning("u"), UserWarning, "lib.py", 7, "call()")
    assert other.startswith("lib.py:7: UserWarning: u")  # every other warning as Python prints it


def test_train_log_level_takes_quiet_or_verbose():
    assert load_config(None, []).train.log_level == "quiet"
    assert load_config(None, ["train.log_level=verbose"]).train.log_level == "verbose"
    with pytest.raises(ConfigError, match="train.log_level"):
        load_config(None, ["train.log_level=loud"])


def test_a_verbose_run_prints_deepspeeds_info(tmp_path, data_cache, restored):
    """DeepSpeed's handler writes to the stdout of the process that imported it (not the command's
    captured one): it is pointed at a buffer for the run."""
    from deepspeed.utils import logger

    handler = logger.handlers[0]
    buffer = io.StringIO()
    stream = handler.setStream(buffer)
    try:
        run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={tmp_path / 'run'}",
                f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "train.max_steps=1", "train.progress=false",
                "train.tensorboard=false", "parallel.zero_stage=1", "train.log_level=verbose")
    finally:
        handler.setStream(stream)
    assert "[INFO]" in buffer.getvalue() and "DeepSpeed info" in buffer.getvalue(), buffer.getvalue()[:2000]
