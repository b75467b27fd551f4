"""The training loop's settings (`train.*`; fsframework.train) and the research-only knobs
(`research.*`), each checked against the data windows and the model they cut."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from fsframework.config.checks import ConfigError, choice, positive, positive_fields
from fsframework.config.kinds import has_decoder_blocks, is_freesolo
from fsframework.quiet import LOG_LEVELS

if TYPE_CHECKING:
    from fsframework.config.job import Config

PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")  # SIGINT has its own meaning: stop


@dataclass
class ProfileConfig:
    """`train.profile`: trace steps `start` .. `start + steps - 1` with torch.profiler on `ranks`
    (and on a GPU record a CUDA memory snapshot when `memory`) into <run>/profile; steps 0: off
    (fsframework.train.profiling)."""

    steps: int = 0
    start: int = 3  # after the first steps' one-off work (allocations, compilation)
    ranks: list = field(default_factory=lambda: [0])
    memory: bool = True


@dataclass
class TrainConfig:
    max_steps: int = 100
    ckpt_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 1
    seed: int = 0
    # load weights only (fresh optimizer and schedule): a run dir, a checkpoint, or a .pt state dict
    init_from: Optional[str] = None
    stop_at_step: Optional[int] = None  # end this invocation early (after a checkpoint); the schedule still spans max_steps
    progress: bool = True
    tensorboard: bool = True
    # quiet: the libraries' messages that say nothing to a user of fsframework are filtered
    # (fsframework.quiet lists them and why); verbose: shown, with DeepSpeed's INFO lines
    log_level: str = "quiet"
    # sequence-length warmup: for the first `short_seq_steps` steps every sample is cut into
    # seq_len / short_seq_len shorter sequences (same tokens per step); 0 = off
    short_seq_len: int = 0
    short_seq_steps: int = 0
    # validation perplexity on the held-out split every `eval_every` steps (0: never), over
    # `eval_batches` micro-batches; early stopping after `early_stop_patience` evaluations
    # in a row without a new best (0: never stop early)
    eval_every: int = 0
    eval_batches: int = 4
    early_stop_patience: int = 0
    # signals that ask for a checkpoint at the next step boundary, then an exit with
    # EXIT_PREEMPTED (docs/training.md); SIGINT always stops at the next step boundary
    preempt_signals: list = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    # a non-finite loss: stop (the run fails, naming the step) | skip (no update; the run
    # fails after `nonfinite_max_skips` skipped steps in a row)
    nonfinite: str = "stop"
    nonfinite_max_skips: int = 10
    # recompute every block (AR-GRC: every cell call) in the backward pass instead of keeping
    # its activations: less memory, one more forward per step
    activation_checkpointing: bool = False
    # run the output head and the loss this many positions at a time (recomputed in the backward),
    # so the [B, T, V] logits never exist at once: less memory, one more forward matmul of the
    # head per step; 0 = the whole logits at once
    loss_chunk: int = 0
    # run each decoder block through torch.compile (fsframework.models.compile): fewer, fused ops
    # per step; not for AR-GRC, parallel.sp > 1 or ZeRO-3
    compile: bool = False
    # one device's dense peak TFLOP/s for the logged MFU (fsframework.train.throughput); 0: the
    # table's figure for a known GPU at the run's precision, none (TFLOP/s only) on a CPU
    peak_tflops: float = 0.0
    # before the first step, a step's peak memory is estimated from the config
    # (fsframework.train.memory_estimate) and a run whose estimate exceeds 90% of the device's memory
    # is refused, naming the longest data.seq_len that fits: a step that cannot fit would otherwise
    # swap or be killed after minutes; false: the estimate is only said
    memory_check: bool = True
    # the memory (GB) the estimate is compared with; 0: the device's (a GPU's total memory, the
    # host's available memory on a CPU)
    memory_limit_gb: float = 0.0
    # a rank busy (its step less its time in collectives) at least `straggler_factor` times the other
    # ranks' median for `straggler_intervals` logged steps in a row is named in a warning line
    # (fsframework.train.stragglers); 0: never warned (the per-rank figures are still logged)
    straggler_factor: float = 1.5
    straggler_intervals: int = 3
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class ResearchConfig:
    """Research-only training knobs, off by default; not part of the recipes.

    Copy warmup: the first `copy_warmup_steps` steps train on generated passages of random
    token ids (0 .. copy_warmup_draw-1, copy_warmup_max_passage/4 .. copy_warmup_max_passage
    long), each followed by itself, in copy_warmup_seq_len-token sequences with the same
    tokens per step, before the data stream starts (fsframework.data.synthetic): short
    sequences of short passages carry small models past the plateau before induction
    (copying) heads form, which a long-context corpus alone does not in a CPU budget.
    """

    copy_warmup_steps: int = 0
    copy_warmup_seq_len: int = 64
    copy_warmup_max_passage: int = 16
    copy_warmup_draw: int = 256


def check_train(cfg: Config) -> None:
    t = cfg.train
    positive_fields("train", t, ("max_steps", "ckpt_every", "keep_checkpoints", "log_every"))
    _check_short_sequences(cfg)
    positive("train.eval_every", t.eval_every, zero_ok=True)
    positive("train.eval_batches", t.eval_batches)
    positive("train.early_stop_patience", t.early_stop_patience, zero_ok=True)
    positive("train.loss_chunk", t.loss_chunk, zero_ok=True)
    positive("train.peak_tflops", t.peak_tflops, zero_ok=True)
    positive("train.memory_limit_gb", t.memory_limit_gb, zero_ok=True)
    positive("train.straggler_intervals", t.straggler_intervals)
    if t.straggler_factor and t.straggler_factor <= 1:
        raise ConfigError(f"train.straggler_factor={t.straggler_factor} must be above 1 (how many times the other "
                          "ranks' busy time a straggler's is), or 0 for no warnings")
    positive("train.profile.steps", t.profile.steps, zero_ok=True)
    positive("train.profile.start", t.profile.start)
    for rank in t.profile.ranks:
        positive("train.profile.ranks", rank, zero_ok=True)
    if t.early_stop_patience and not t.eval_every:
        raise ConfigError(f"train.early_stop_patience={t.early_stop_patience} needs train.eval_every > 0 "
                          "(early stopping counts validation evaluations)")
    _check_compile(cfg)
    choice("train.nonfinite", t.nonfinite, ("stop", "skip"))
    choice("train.log_level", t.log_level, LOG_LEVELS)
    positive("train.nonfinite_max_skips", t.nonfinite_max_skips)
    for name in t.preempt_signals:
        choice("train.preempt_signals", name, PREEMPT_SIGNALS)


def _check_compile(cfg: Config) -> None:
    """What `train.compile` does not cover (fsframework.models.compile) is refused by name."""
    if not cfg.train.compile:
        return
    if not has_decoder_blocks(cfg.model.name):
        raise ConfigError(f"train.compile=true needs a model of decoder blocks; model.name={cfg.model.name} has none")
    if cfg.parallel.sp > 1:
        raise ConfigError(f"train.compile=true is not supported with parallel.sp={cfg.parallel.sp}: the blocks' "
                          "attention exchanges keys between ranks; use parallel.sp=1 or train.compile=false")
    if cfg.parallel.zero_stage == 3:
        raise ConfigError("train.compile=true is not supported with parallel.zero_stage=3 (ZeRO-3 gathers each "
                          "module's parameters inside the block); use zero_stage 0-2 or train.compile=false")


def check_research(cfg: Config) -> None:
    """The copy warmup: passages and their copies fit its sequences, which fit the micro-batch."""
    r = cfg.research
    positive("research.copy_warmup_steps", r.copy_warmup_steps, zero_ok=True)
    if not r.copy_warmup_steps:
        return
    positive("research.copy_warmup_seq_len", r.copy_warmup_seq_len)
    positive("research.copy_warmup_draw", r.copy_warmup_draw)
    if (cfg.data.micro_batch_size * cfg.data.seq_len) % r.copy_warmup_seq_len:
        raise ConfigError(f"research.copy_warmup_seq_len={r.copy_warmup_seq_len} must divide the tokens of a "
                          f"micro-batch ({cfg.data.micro_batch_size} x {cfg.data.seq_len})")
    if not 2 <= r.copy_warmup_max_passage <= r.copy_warmup_seq_len // 2:
        raise ConfigError(f"research.copy_warmup_max_passage={r.copy_warmup_max_passage} must be 2 .. half of "
                          f"research.copy_warmup_seq_len={r.copy_warmup_seq_len}, so a passage and its copy fit")
    if r.copy_warmup_draw > cfg.model.vocab_size:
        raise ConfigError(f"research.copy_warmup_draw={r.copy_warmup_draw} exceeds model.vocab_size="
                          f"{cfg.model.vocab_size}")
    _check_shorter_sequences(cfg, "research.copy_warmup_seq_len", r.copy_warmup_seq_len)


def _check_short_sequences(cfg: Config) -> None:
    t = cfg.train
    positive("train.short_seq_len", t.short_seq_len, zero_ok=True)
    positive("train.short_seq_steps", t.short_seq_steps, zero_ok=True)
    if not (t.short_seq_len and t.short_seq_steps):
        return
    if cfg.data.seq_len % t.short_seq_len or t.short_seq_len >= cfg.data.seq_len:
        raise ConfigError(f"train.short_seq_len={t.short_seq_len} must divide data.seq_len={cfg.data.seq_len} "
                          "and be shorter than it")
    _check_shorter_sequences(cfg, "train.short_seq_len", t.short_seq_len)


def _check_shorter_sequences(cfg: Config, key: str, length: int) -> None:
    """Steps that train on sequences of `length` instead of data samples: only without sequence
    parallelism (its slices are cut from whole samples), and whole blocks for FreeSolo models."""
    if cfg.parallel.sp > 1:
        raise ConfigError(f"{key} needs parallel.sp=1 (the sequence-parallel slices are cut from whole samples)")
    if is_freesolo(cfg.model.name) and length % cfg.model.attention.block_size:
        raise ConfigError(f"{key}={length} must be a multiple of "
                          f"model.attention.block_size={cfg.model.attention.block_size}")
