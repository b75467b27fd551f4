"""Typed configuration: nested dataclasses are the schema.

A job is `YAML file -> dotted key=value overrides`, merged with omegaconf in
strict mode onto the dataclass defaults, so an unknown key or a value of the
wrong type fails with the key's name before any work starts. `validate()`
then checks the relations between values (block size a multiple of the cell
size, window wide enough, positive learning rate, ...).

Saved configs are versioned: `to_yaml` writes `schema_version` (SCHEMA_VERSION), and
`load_run_config` reads a run's config.yaml of any version, migrating it with
SCHEMA_MIGRATIONS (removed keys dropped, moved keys put in their new place). A job file
(`load_config`) is written in the current schema: a key of an older version fails with a
message naming its new place, or saying it was removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

COMBINE_MODES = ("sum", "gate", "separate_wo")
READOUT_GAIN_PARAMS = ("log", "linear")  # model.attention.readout_gain_param
READOUT_BACKWARDS = ("unit", "gain")  # model.attention.readout_backward
FSB_FORESTS = ("both", "f0", "ftau")  # FS-B: both forests, or F0 / Ftau alone


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or invalid."""


@dataclass
class AttentionConfig:
    """Attention hyperparameters; the FreeSolo ones follow docs/freesolo.md (paper defaults)."""

    window: int = 512  # local branch / SWA: keys with 0 <= i - j <= window
    rope_theta: float = 10000.0
    impl: str = "auto"  # auto | reference | triton
    cell_size: int = 32  # s
    block_size: int = 128  # B, a multiple of s
    top_k: int = 4  # K
    sigma: float = 4.0  # erf prior width, per head at init
    lam: float = 1.0  # prior weight, per head at init
    recent_cells: int = 8  # W (FS-L)
    retained_cells: int = 64  # P (FS-L)
    combine: str = "sum"  # sum | gate | separate_wo
    # initial value of the long-range readout's RMSNorm gain g (docs/freesolo.md §1.6): the read
    # starts quiet next to the local branch; at 1 it drowns it and FS trains worse than SWA
    readout_gain: float = 0.03
    # the gains' learning rate as a multiple of optim.lr (their own optimizer parameter group):
    # at 10 a quiet read becomes loud within tens of steps where retrieval needs it (1: every run
    # before schema 3, which learned associative recall a third as well as gain 1)
    readout_gain_lr: float = 10.0
    # how g is learned: "linear" (g itself) or "log" (log g, g > 0; measured worse, kept as an option)
    readout_gain_param: str = "linear"
    # the gradient the long-range branch learns from: "gain" (the true one) or "unit" (as if the
    # read had gain 1 while the forward keeps g; measured: it spoils text, kept as an option)
    readout_backward: str = "gain"
    # FS-B read path (model.name=fsb, inference only; docs/freesolo.md §1.8)
    fsb_top_k: int = 4  # K cells read per query, whatever top_k the checkpoint trained with
    fsb_beam_width: int = 16  # Wb, per forest; >= fsb_top_k
    fsb_bound_c: float = 8.0  # c of the node bound U_v
    fsb_forests: str = "both"  # both | f0 | ftau (single-forest ablations)
    fsb_calibration: str = ""  # per-head tau file; "" = calibration.json of the checkpoint read
    # runway-rewired attention (model.name=rewired, docs/rewired.md)
    rewired_runway: str = "last"  # last: u_{t-1} | mean: mean(u_0 .. u_{t-1})
    rewired_score: str = "dot"  # dot | bilinear (a learned d x d Bmat per layer, identity at init)
    rewired_head: int = 0  # the head whose value vectors u also give the runway signal


@dataclass
class ArgrcConfig:
    """AR-GRC, the log-depth recurrent LM (model.name=argrc, docs/argrc.md): `model.d_model` is
    the embedding width E, `d_state` the scan width D."""

    d_state: int = 0  # D; 0: model.d_model
    post_embed_mlp_hidden: int = 0  # residual position-wise MLP after Linear(E -> D); 0: none
    post_merge_mlp_hidden: int = 0  # residual MLP after each composition; 0: none
    cell: str = "grc"  # grc (gated recursive cell) | mlp (the MLP-operator ablation)
    identity: str = "learned"  # the root value of the down-sweep: learned | zeros


ARGRC_CELLS = ("grc", "mlp")
ARGRC_IDENTITIES = ("learned", "zeros")


@dataclass
class ModelConfig:
    name: str = "tfpp"  # a kind of fsframework.models.registry
    vocab_size: int = 260
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 0  # 0: SwiGLU width 8/3 d_model rounded up to a multiple of 64
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    init_std: float = 0.02
    dropout: float = 0.0  # on the embeddings and every residual branch (AR-GRC: embeddings, MLPs, scan output)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    argrc: ArgrcConfig = field(default_factory=ArgrcConfig)  # model.name=argrc only

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        if self.mlp_hidden > 0:
            return self.mlp_hidden
        return ((8 * self.d_model // 3) + 63) // 64 * 64


@dataclass
class StreamConfig:
    """One dataset of a mixture: an MDS directory (local path or s3://... prefix) with
    `train/` and `eval/` splits, drawn with `proportion` (None: by size)."""

    source: str = ""
    proportion: Optional[float] = None


@dataclass
class MqarConfig:
    """Multi-query associative recall, generated on the fly (`data.source=mqar`, docs/evaluation.md §4.6):
    `pairs` key-value pairs of token ids spread over the context, filler between them, then
    `queries` of the keys each followed by its value. Ids: keys `[0, keys)`, values
    `[keys, keys + values)`, filler `[keys + values, keys + values + filler)`."""

    pairs: int = 8
    queries: int = 8  # at most `pairs`: each query asks a different pair
    keys: int = 64
    values: int = 64
    filler: int = 16


@dataclass
class DataConfig:
    # "embedded" (built-in corpus), a local/remote MDS directory, or "mqar" (associative recall)
    source: str = "embedded"
    streams: List[StreamConfig] = field(default_factory=list)  # a mixture; when set, `source` is ignored
    cache_dir: str = "data_cache/embedded"  # where the embedded corpus shards are written
    tokenizer: str = "byte"  # byte | path to tokenizer.json | path to sentencepiece .model
    seq_len: int = 512
    micro_batch_size: int = 4
    num_workers: int = 0
    shuffle: bool = True
    shuffle_seed: int = 1234
    embedded_python_chars: int = 3_000_000  # natural text taken from the stdlib sources
    embedded_retrieval_docs: int = 2000  # generated long-range retrieval documents
    # longest retrieval document in characters, as a fraction of seq_len (shortest: half of it);
    # below 1 most documents fit whole in one training window, needle and question together
    embedded_retrieval_max_fraction: float = 1.5
    eval_fraction: float = 0.02  # held out for perplexity
    mqar: MqarConfig = field(default_factory=MqarConfig)


@dataclass
class LossConfig:
    """Recall-weighted next-token loss (docs/freesolo.md §1.10): `sum w CE / sum w`,
    `w = 1 + beta * recall + beta_switch * switch`; off by default."""

    recall_weighting: bool = False
    beta: float = 9.0
    beta_switch: float = 9.0
    ngram: int = 4
    min_distance: int = 512
    switch_window: int = 64


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 20
    decay: str = "cosine"  # cosine | linear | constant
    grad_clip: float = 1.0


@dataclass
class ParallelConfig:
    sp: int = 1  # sequence-parallel group size
    # zigzag | contiguous: which tokens each SP rank holds (fsframework.parallel.sharding); zigzag
    # balances the causal work of the prefix kinds for the same bytes, the others always run contiguous
    sp_layout: str = "zigzag"
    zero_stage: int = 0
    grad_accum: int = 1
    precision: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | fp32 | bf16
    backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    timeout_s: int = 600


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


@dataclass
class EvalConfig:
    """What `fsf run` evaluates after training (and the defaults of `fsf eval`)."""

    tasks: list = field(default_factory=lambda: ["perplexity"])
    lengths: list = field(default_factory=lambda: [256, 512, 1024])
    num_samples: int = 10  # per task and length (perplexity: windows per length)
    batch_size: int = 2


# Version of the config schema. A run's saved config.yaml records it (files written before it
# was recorded are version 1); `load_run_config` migrates older files with SCHEMA_MIGRATIONS.
SCHEMA_VERSION = 3

# SCHEMA_MIGRATIONS[v]: the keys changed from schema version v to v + 1, old dotted key ->
# new dotted key, or None for a removed key.
SCHEMA_MIGRATIONS: dict[int, dict[str, Optional[str]]] = {
    1: {
        "model.max_seq_len": None,  # bounded nothing
        "train.copy_warmup_steps": "research.copy_warmup_steps",
        "train.copy_warmup_seq_len": "research.copy_warmup_seq_len",
        "train.copy_warmup_max_passage": "research.copy_warmup_max_passage",
        "train.copy_warmup_draw": "research.copy_warmup_draw",
    },
    2: {},
}

# SCHEMA_ADDED[v]: the keys added from schema version v to v + 1, with the value every run of
# version v used (its behaviour then), so an old run keeps it when the new default differs.
SCHEMA_ADDED: dict[int, dict[str, Any]] = {
    1: {},
    # the readout gain g itself trained at optim.lr
    2: {"model.attention.readout_gain_param": "linear", "model.attention.readout_gain_lr": 1.0,
        "model.attention.readout_backward": "gain"},
}


@dataclass
class Config:
    schema_version: int = SCHEMA_VERSION  # see SCHEMA_MIGRATIONS; written into every saved config
    run_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    research: ResearchConfig = field(default_factory=ResearchConfig)


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def _positive(key: str, value: float, *, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{key}={value!r} is invalid; it must be {bound}")


def _check_short_sequences(cfg: Config) -> None:
    t = cfg.train
    _positive("train.short_seq_len", t.short_seq_len, zero_ok=True)
    _positive("train.short_seq_steps", t.short_seq_steps, zero_ok=True)
    if not (t.short_seq_len and t.short_seq_steps):
        return
    if cfg.data.seq_len % t.short_seq_len or t.short_seq_len >= cfg.data.seq_len:
        raise ConfigError(f"train.short_seq_len={t.short_seq_len} must divide data.seq_len={cfg.data.seq_len} "
                          "and be shorter than it")
    _check_shorter_sequences(cfg, "train.short_seq_len", t.short_seq_len)


def _freesolo(name: str) -> bool:
    """Whether model `name` is a FreeSolo kind (query blocks, cells, routing)."""
    from fsframework.models.registry import KINDS

    return name in KINDS and KINDS[name].freesolo


def _check_shorter_sequences(cfg: Config, key: str, length: int) -> None:
    """Steps that train on sequences of `length` instead of data samples: only without sequence
    parallelism (its slices are cut from whole samples), and whole blocks for FreeSolo models."""
    if cfg.parallel.sp > 1:
        raise ConfigError(f"{key} needs parallel.sp=1 (the sequence-parallel slices are cut from whole samples)")
    if _freesolo(cfg.model.name) and length % cfg.model.attention.block_size:
        raise ConfigError(f"{key}={length} must be a multiple of "
                          f"model.attention.block_size={cfg.model.attention.block_size}")


def _check_copy_warmup(cfg: Config) -> None:
    r = cfg.research
    _positive("research.copy_warmup_steps", r.copy_warmup_steps, zero_ok=True)
    if not r.copy_warmup_steps:
        return
    _positive("research.copy_warmup_seq_len", r.copy_warmup_seq_len)
    _positive("research.copy_warmup_draw", r.copy_warmup_draw)
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


def _check_fsb(a: AttentionConfig) -> None:
    """FS-B read-path keys (model.name=fsb), checked whatever the model so a typo fails early."""
    _choice("model.attention.fsb_forests", a.fsb_forests, FSB_FORESTS)
    _positive("model.attention.fsb_top_k", a.fsb_top_k)
    _positive("model.attention.fsb_bound_c", a.fsb_bound_c, zero_ok=True)
    if a.fsb_beam_width < a.fsb_top_k:
        raise ConfigError(f"model.attention.fsb_beam_width={a.fsb_beam_width} must be >= "
                          f"model.attention.fsb_top_k={a.fsb_top_k}")


def _check_validation(cfg: Config) -> None:
    t = cfg.train
    _positive("train.eval_every", t.eval_every, zero_ok=True)
    _positive("train.eval_batches", t.eval_batches)
    _positive("train.early_stop_patience", t.early_stop_patience, zero_ok=True)
    if t.early_stop_patience and not t.eval_every:
        raise ConfigError(f"train.early_stop_patience={t.early_stop_patience} needs train.eval_every > 0 "
                          "(early stopping counts validation evaluations)")


PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")  # SIGINT has its own meaning: stop


def _check_loop_policies(cfg: Config) -> None:
    t = cfg.train
    _choice("train.nonfinite", t.nonfinite, ("stop", "skip"))
    _positive("train.nonfinite_max_skips", t.nonfinite_max_skips)
    for name in t.preempt_signals:
        _choice("train.preempt_signals", name, PREEMPT_SIGNALS)


def _check_mqar(cfg: Config) -> None:
    """The associative-recall source (docs/evaluation.md §4.6): ids within the vocabulary, room for the pairs."""
    m = cfg.data.mqar
    for key in ("pairs", "queries", "keys", "values", "filler"):
        _positive(f"data.mqar.{key}", getattr(m, key))
    if m.queries > m.pairs:
        raise ConfigError(f"data.mqar.queries={m.queries} exceeds data.mqar.pairs={m.pairs}: each query asks a "
                          "different pair")
    if m.pairs > m.keys:
        raise ConfigError(f"data.mqar.pairs={m.pairs} exceeds data.mqar.keys={m.keys}: the keys of one sequence "
                          "are distinct")
    if cfg.data.source == "mqar":
        ids = m.keys + m.values + m.filler
        if ids > cfg.model.vocab_size:
            raise ConfigError(f"data.mqar uses {ids} token ids (keys + values + filler), more than "
                              f"model.vocab_size={cfg.model.vocab_size}")
        if 2 * (m.pairs + m.queries) > cfg.data.seq_len:
            raise ConfigError(f"data.seq_len={cfg.data.seq_len} cannot hold data.mqar's {m.pairs} pairs and "
                              f"{m.queries} queries (2 tokens each)")
        if cfg.data.streams:
            raise ConfigError("data.source=mqar generates its data: remove data.streams")
        if cfg.loss.recall_weighting:
            raise ConfigError("loss.recall_weighting does not apply to data.source=mqar (its loss is on the "
                              "queried values only): set loss.recall_weighting=false")
        if cfg.train.eval_every:
            raise ConfigError("train.eval_every reads the held-out text split, which data.source=mqar has not: "
                              "set train.eval_every=0 and score recall with `fsf eval RUN --tasks mqar`")


def _check_argrc(cfg: Config) -> None:
    """AR-GRC keys (docs/argrc.md), and the model-wide dropout."""
    g = cfg.model.argrc
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.model.dropout} must lie in [0, 1)")
    _choice("model.argrc.cell", g.cell, ARGRC_CELLS)
    _choice("model.argrc.identity", g.identity, ARGRC_IDENTITIES)
    for key in ("d_state", "post_embed_mlp_hidden", "post_merge_mlp_hidden"):
        _positive(f"model.argrc.{key}", getattr(g, key), zero_ok=True)


def check_world_size(world_size: int, sp: int, *, world: str = "world size") -> int:
    """The data-parallel size of `world_size` ranks in sequence-parallel groups of `sp`; raise
    ConfigError when `world_size` is not a multiple of `sp`. `world` names the world size in
    the message (e.g. the options a launcher spells it out with)."""
    if sp < 1:
        raise ConfigError(f"parallel.sp={sp} must be >= 1")
    if world_size % sp:
        raise ConfigError(f"{world} {world_size} is not a multiple of parallel.sp={sp}: "
                          f"launch a multiple of {sp} ranks or change parallel.sp")
    return world_size // sp


def validate(cfg: Config) -> Config:
    """Check relations between values; raise ConfigError naming the key and what is allowed."""
    m, a = cfg.model, cfg.model.attention
    if cfg.schema_version != SCHEMA_VERSION:
        raise ConfigError(f"schema_version={cfg.schema_version} is not this version's {SCHEMA_VERSION}: a run's "
                          "saved config.yaml of an older version is migrated when the run is read back "
                          "(fsf eval, resume, train.init_from); a job file needs no schema_version")
    # the names of the kinds and of the kernel implementations are owned by the registry and
    # the ops' dispatcher; both import nothing of the package above them
    from fsframework.models.registry import MODEL_NAMES
    from fsframework.ops.dispatch import IMPLS

    _choice("model.name", m.name, MODEL_NAMES)
    _choice("model.attention.combine", a.combine, COMBINE_MODES)
    _choice("model.attention.readout_gain_param", a.readout_gain_param, READOUT_GAIN_PARAMS)
    _choice("model.attention.readout_backward", a.readout_backward, READOUT_BACKWARDS)
    if a.readout_gain_param == "log" and not a.readout_gain > 0:
        raise ConfigError(f"model.attention.readout_gain={a.readout_gain} must be > 0 with "
                          "model.attention.readout_gain_param=log (it learns log g); set readout_gain_param=linear "
                          "for a gain that starts at 0")
    _choice("model.attention.impl", a.impl, IMPLS)
    # runway-rewired attention (docs/rewired.md)
    _choice("model.attention.rewired_runway", a.rewired_runway, ("last", "mean"))
    _choice("model.attention.rewired_score", a.rewired_score, ("dot", "bilinear"))
    if not 0 <= a.rewired_head < m.n_heads:
        raise ConfigError(f"model.attention.rewired_head={a.rewired_head} must lie in [0, model.n_heads={m.n_heads})")
    _choice("optim.decay", cfg.optim.decay, ("cosine", "linear", "constant"))
    _choice("parallel.precision", cfg.parallel.precision, ("auto", "fp32", "bf16"))
    _choice("parallel.backend", cfg.parallel.backend, ("auto", "gloo", "nccl"))
    _choice("parallel.sp_layout", cfg.parallel.sp_layout, ("contiguous", "zigzag"))
    _choice("parallel.zero_stage", cfg.parallel.zero_stage, (0, 1, 2, 3))
    for key in ("model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads", "data.seq_len",
                "data.micro_batch_size", "train.max_steps", "train.ckpt_every", "train.keep_checkpoints",
                "train.log_every", "parallel.sp", "parallel.grad_accum", "eval.num_samples", "model.attention.cell_size",
                "model.attention.block_size", "model.attention.top_k", "optim.lr", "eval.batch_size",
                "model.attention.readout_gain_lr"):
        section, *rest = key.split(".")
        obj = getattr(cfg, section)
        for part in rest[:-1]:
            obj = getattr(obj, part)
        _positive(key, getattr(obj, rest[-1]))
    for key, value in (("model.attention.window", a.window), ("model.attention.recent_cells", a.recent_cells),
                       ("model.attention.retained_cells", a.retained_cells), ("model.attention.lam", a.lam),
                       ("model.attention.readout_gain", a.readout_gain),
                       ("optim.weight_decay", cfg.optim.weight_decay), ("optim.warmup_steps", cfg.optim.warmup_steps),
                       ("optim.grad_clip", cfg.optim.grad_clip), ("data.num_workers", cfg.data.num_workers)):
        _positive(key, value, zero_ok=True)
    _positive("model.attention.sigma", a.sigma)
    for key, value in (("loss.beta", cfg.loss.beta), ("loss.beta_switch", cfg.loss.beta_switch),
                       ("loss.min_distance", cfg.loss.min_distance), ("loss.switch_window", cfg.loss.switch_window)):
        _positive(key, value, zero_ok=True)
    _positive("loss.ngram", cfg.loss.ngram)
    _positive("data.embedded_retrieval_max_fraction", cfg.data.embedded_retrieval_max_fraction)
    if not 0.0 <= cfg.optim.min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio={cfg.optim.min_lr_ratio} must lie in [0, 1]")
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} must be a multiple of model.n_heads={m.n_heads}")
    if m.head_dim % 2:
        raise ConfigError(f"head dim d_model/n_heads={m.head_dim} must be even for RoPE")
    if _freesolo(m.name):
        if a.block_size % a.cell_size:
            raise ConfigError(
                f"model.attention.block_size={a.block_size} must be a multiple of model.attention.cell_size={a.cell_size}")
        if a.window < a.block_size - 1:
            raise ConfigError(
                f"model.attention.window={a.window} must be >= model.attention.block_size - 1 = {a.block_size - 1} "
                "(the local branch must cover the current query block)")
    _check_fsb(a)
    for i, stream in enumerate(cfg.data.streams):
        if not stream.source:
            raise ConfigError(f"data.streams[{i}].source is empty: give a local directory or an s3:// prefix")
        if stream.proportion is not None and stream.proportion <= 0:
            raise ConfigError(f"data.streams[{i}].proportion={stream.proportion} must be > 0")
    if not 0.0 <= cfg.data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction={cfg.data.eval_fraction} must lie in [0, 1)")
    _check_short_sequences(cfg)
    _check_copy_warmup(cfg)
    _check_argrc(cfg)
    _check_mqar(cfg)
    _check_validation(cfg)
    _check_loop_policies(cfg)
    if len(cfg.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas={list(cfg.optim.betas)} must be two numbers in [0, 1)")
    return cfg


def _old_key_error(key: str) -> Optional[ConfigError]:
    """The error for a dotted key that an older schema version had, None for any other key."""
    for version in sorted(SCHEMA_MIGRATIONS):
        changes = SCHEMA_MIGRATIONS[version]
        if key in changes:
            new = changes[key]
            if new is None:
                return ConfigError(f"config key {key} was removed in schema_version {version + 1}; delete it")
            return ConfigError(f"config key {key} moved to {new} in schema_version {version + 1}; "
                               f"write {new} instead")
    return None


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return []
    keys = []
    for key, value in data.items():
        full = f"{prefix}{key}"
        keys.append(full)
        keys.extend(_flat_keys(value, full + "."))
    return keys


def _reject_old_keys(keys: list[str]) -> None:
    """Raise one ConfigError naming every key of an older schema version among `keys`."""
    errors = [str(error) for error in map(_old_key_error, (key.lstrip("+~") for key in keys)) if error is not None]
    if errors:
        raise ConfigError("; ".join(errors))


def _read_yaml(path: str | Path) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    import yaml

    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except yaml.MarkedYAMLError as exc:  # one line, where an editor jumps to: FILE:LINE:COLUMN
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{where}: invalid YAML: {what}") from None
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"invalid config file {path}: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def _build(data: Optional[dict], overrides: Optional[list[str]]) -> Config:
    """Defaults <- `data` (a nested dict) <- dotted `key=value` overrides, strict, then validated."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.max_steps=10)")
    _reject_old_keys([item.split("=", 1)[0].strip() for item in overrides or []])
    schema = OmegaConf.structured(Config)
    try:
        merged = schema
        if data:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        msg = str(exc).splitlines()[0]
        raise ConfigError(f"invalid config{f' key {key!r}' if key else ''}: {msg}") from None
    return validate(cfg)


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None) -> Config:
    """Defaults <- YAML file <- dotted `key=value` overrides, strict, then validated. A key of an
    older schema version (SCHEMA_MIGRATIONS) fails with its new name, or says it was removed."""
    data = None
    if path is not None:
        data = _read_yaml(path)
        _reject_old_keys(_flat_keys(data))
    return _build(data, overrides)


def migrate(data: dict) -> dict:
    """A saved config (nested dict, any schema version; none recorded: version 1) brought to
    SCHEMA_VERSION: removed keys dropped, moved keys put in their new place, added keys set to
    the value the old version used (SCHEMA_ADDED). A new dict."""
    import copy

    data = copy.deepcopy(data)
    version = data.pop("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(f"schema_version={version!r} is unknown: this fsframework reads versions "
                          f"1 .. {SCHEMA_VERSION}")
    for v in range(version, SCHEMA_VERSION):
        for old, new in SCHEMA_MIGRATIONS[v].items():
            *parents, leaf = old.split(".")
            node = data
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or leaf not in node:
                continue
            value = node.pop(leaf)
            if new is None:
                continue
            *parents, leaf = new.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        for added, value in SCHEMA_ADDED[v].items():
            *parents, leaf = added.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node.setdefault(leaf, value)
    data["schema_version"] = SCHEMA_VERSION
    return data


def load_run_config(path: str | Path, overrides: Optional[list[str]] = None) -> Config:
    """The config.yaml a run saved (in its run directory or a checkpoint), of any schema version:
    migrated to SCHEMA_VERSION, then `overrides` (current keys), validated. The one reader of
    saved configs (resume, `fsf eval`, `fsf convert`, `train.init_from`)."""
    return _build(migrate(_read_yaml(path)), overrides)


def to_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
