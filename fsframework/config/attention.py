"""Attention settings (`model.attention.*`): those every kind reads, FreeSolo's (docs/freesolo.md,
paper defaults), and one nested group per kind that reads settings of its own (`fsb`, `rewired`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.config.checks import ConfigError, choice, positive_fields
from fsframework.config.fsb import FsbConfig, check_fsb
from fsframework.config.rewired import RewiredConfig, check_rewired
from fsframework.ops.impls import IMPLS

COMBINE_MODES = ("sum", "gate", "separate_wo")
READOUT_GAIN_PARAMS = ("log", "linear")  # model.attention.readout_gain_param
READOUT_BACKWARDS = ("unit", "gain")  # model.attention.readout_backward
ROUTE_SCORES = ("mean", "tokens")  # model.attention.route_score


@dataclass
class AttentionConfig:
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
    # routing's content term (FS, FS-L): "mean", the paper's q . kbar_c / sqrt(d) (Eq. 7), or "tokens",
    # log sum_{j in c} exp(q . k_j / sqrt(d)) over the cell's token keys (Eq. 12's content term, FS-B's
    # rescoring): a departure (docs/freesolo.md "Departures"), s times the routing's work, no Triton kernel
    route_score: str = "mean"
    fsb: FsbConfig = field(default_factory=FsbConfig)  # FS-B's read path (model.name=fsb)
    rewired: RewiredConfig = field(default_factory=RewiredConfig)  # model.name=rewired


def check_attention(a: AttentionConfig, *, freesolo: bool, n_heads: int) -> None:
    """`freesolo`: the model is a FreeSolo kind (query blocks and cells must fit); `n_heads`: model.n_heads."""
    choice("model.attention.combine", a.combine, COMBINE_MODES)
    choice("model.attention.readout_gain_param", a.readout_gain_param, READOUT_GAIN_PARAMS)
    choice("model.attention.readout_backward", a.readout_backward, READOUT_BACKWARDS)
    choice("model.attention.route_score", a.route_score, ROUTE_SCORES)
    if a.readout_gain_param == "log" and not a.readout_gain > 0:
        raise ConfigError(f"model.attention.readout_gain={a.readout_gain} must be > 0 with "
                          "model.attention.readout_gain_param=log (it learns log g); set readout_gain_param=linear "
                          "for a gain that starts at 0")
    choice("model.attention.impl", a.impl, IMPLS)
    positive_fields("model.attention", a, ("cell_size", "block_size", "top_k", "readout_gain_lr", "sigma"))
    positive_fields("model.attention", a, ("window", "recent_cells", "retained_cells", "lam", "readout_gain"),
                    zero_ok=True)
    if freesolo:
        if a.block_size % a.cell_size:
            raise ConfigError(
                f"model.attention.block_size={a.block_size} must be a multiple of model.attention.cell_size={a.cell_size}")
        if a.window < a.block_size - 1:
            raise ConfigError(
                f"model.attention.window={a.window} must be >= model.attention.block_size - 1 = {a.block_size - 1} "
                "(the local branch must cover the current query block)")
    check_fsb(a.fsb)
    check_rewired(a.rewired, n_heads)
