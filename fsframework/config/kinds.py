"""The facts about each model kind (`model.name`) that configuration and training decisions read.

One `KindFacts` per kind says what it reads of the past, whether it is FreeSolo and with which
routing variant, whether it can be trained (or is a read path over another kind's weights), whether
it reads calibrated thresholds and which `model.attention` settings describe how it reads long range.
These are plain values, so `fsframework.config` validates a job without importing any model (and no
torch). The classes that implement a kind (attention module, decode cache, a language model of its
own) are `fsframework.models.registry`'s, which takes every fact from this table (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.attention import AttentionConfig
from fsframework.config.checks import ConfigError

ROUTINGS = ("fs", "fsl", "fsb")  # the routing variants of `fsframework.ops.freesolo.select_cells`
KEY_SPANS = ("prefix", "window", "retained", "")


@dataclass(frozen=True)
class KindFacts:
    name: str
    # what the offset form reads before its queries: "prefix": keys of [0, start + n); "window": only the
    # `window` keys before start; "retained": the prefix of which FS-L reads only its window, recent and
    # top-P cells; "": nothing (a kind without attention, AR-GRC)
    keys: str
    summary: str
    absolute_positions: bool = False  # sinusoidal position table added to the embeddings
    # FreeSolo (query blocks, cells, `model.attention.*` routing): the routing variant, "" for other kinds
    routing: str = ""
    # a read path over another kind's weights (`fsf train` refuses it): the kind to train instead
    trained_as: str = ""
    # reads per-head thresholds calibrated once per checkpoint (`fsf calibrate`, calibration.json)
    calibrated: bool = False
    # how the kind reads long range, for a scores file: (label, dotted key under model.attention) pairs;
    # these are the settings a read of a saved run may change
    read_settings: tuple[tuple[str, str], ...] = ()
    # a TransformerLM of decoder blocks around an attention module; False: a language model of its own
    # (AR-GRC), which brings its own cached decoding and sequence parallelism
    decoder_blocks: bool = True
    # what its attention keeps in training beyond a block's activations (fsframework.train.memory_estimate):
    # "window" (the chunked window op's tiles), "bias" (ALiBi's explicit bias masks, `H T^2 / 2`),
    # "tile" (rewired's transient score tile), "" (a fused kernel: nothing)
    attention_memory: str = ""
    # the `model.*` settings (dotted below `model`) beyond the shape that a run of this kind is compared
    # by: the columns of tensorboard's HPARAMS tab (fsframework.train.hparams)
    compared_settings: tuple[str, ...] = ()

    def __post_init__(self):
        if self.routing not in ("", *ROUTINGS) or self.keys not in KEY_SPANS:
            raise ValueError(f"kind {self.name}: routing={self.routing!r} or keys={self.keys!r} is not one of "
                             f"{ROUTINGS} / {KEY_SPANS}")

    @property
    def freesolo(self) -> bool:
        return bool(self.routing)

    @property
    def trainable(self) -> bool:
        return not self.trained_as

    def read_path(self, attention: AttentionConfig) -> dict:
        """The settings that say how this kind reads long range (`read_settings`), by label."""
        return {"model": self.name, **{label: _setting(attention, key) for label, key in self.read_settings}}

    def compared(self, model) -> dict:
        """The `compared_settings` of `model` (a `ModelConfig`), by their dotted keys below it."""
        return {key: _setting(model, key) for key in self.compared_settings}


def _setting(section, key: str):
    """The value of dotted `key` under a config section (e.g. "fsb.top_k" under `model.attention`:
    FS-B's own group)."""
    value = section
    for part in key.split("."):
        value = getattr(value, part)
    return value


_FSB_SETTINGS = tuple((name, f"fsb.{name}") for name in ("top_k", "beam_width", "bound_c", "forests"))
# FreeSolo's window, cells, routing and readout (docs/freesolo.md); FS-L adds its retained set
_FREESOLO_COMPARED = tuple(f"attention.{name}" for name in (
    "window", "cell_size", "block_size", "top_k", "sigma", "lam", "combine", "readout_gain", "readout_gain_lr"))
_RETAINED_COMPARED = ("attention.recent_cells", "attention.retained_cells")

KIND_FACTS: dict[str, KindFacts] = {kind.name: kind for kind in (
    KindFacts("tfpp", "prefix", "Transformer++: full causal attention, RoPE"),
    KindFacts("swa", "window", "sliding-window attention, RoPE", attention_memory="window",
              compared_settings=("attention.window",)),
    KindFacts("alibi", "prefix", "full causal attention, ALiBi bias", attention_memory="bias"),
    KindFacts("sinusoidal", "prefix", "full causal attention, sinusoidal absolute positions",
              absolute_positions=True),
    KindFacts("fs", "prefix", "FreeSolo: RoPE window + routed NoPE cells", routing="fs",
              read_settings=(("top_k", "top_k"),), attention_memory="window", compared_settings=_FREESOLO_COMPARED),
    KindFacts("fsl", "retained", "FreeSolo-L: FS routing over a norm-pruned prefix", routing="fsl",
              read_settings=(("top_k", "top_k"),), attention_memory="window",
              compared_settings=_FREESOLO_COMPARED + _RETAINED_COMPARED),
    KindFacts("fsb", "prefix", "FreeSolo-B: forest search over FS/FS-L weights (inference only)", routing="fsb",
              trained_as="fs", calibrated=True, read_settings=_FSB_SETTINGS, attention_memory="window",
              compared_settings=_FREESOLO_COMPARED + tuple(f"attention.{key}" for _, key in _FSB_SETTINGS)),
    KindFacts("rewired", "prefix", "runway-rewired causal attention, RoPE (docs/rewired.md)",
              attention_memory="tile",
              compared_settings=("attention.rewired.runway", "attention.rewired.score", "attention.rewired.head")),
    # AR-GRC has no attention (no keys read, no layer cache): a learned cell composed by a tree scan
    KindFacts("argrc", "", "AR-GRC: log-depth recurrent LM, a gated cell over a Blelloch scan",
              decoder_blocks=False, compared_settings=tuple(f"argrc.{name}" for name in (
                  "d_state", "cell", "identity", "post_embed_mlp_hidden", "post_merge_mlp_hidden"))),
)}

KIND_NAMES = tuple(KIND_FACTS)


def kind_facts(name: str) -> KindFacts:
    """The facts of kind `name`; a one-line ConfigError naming the known kinds for any other name."""
    if name not in KIND_FACTS:
        raise ConfigError(f"model.name={name!r} is not registered; choose one of {', '.join(KIND_NAMES)}")
    return KIND_FACTS[name]


def is_freesolo(name: str) -> bool:
    """Whether model `name` is a FreeSolo kind (query blocks, cells, routing); False for an unknown name."""
    return name in KIND_FACTS and KIND_FACTS[name].freesolo


def has_decoder_blocks(name: str) -> bool:
    """Whether model `name` is a TransformerLM of decoder blocks (not a language model of its own)."""
    return name in KIND_FACTS and KIND_FACTS[name].decoder_blocks


def check_trainable(name: str) -> None:
    """Raise ConfigError when kind `name` is a read path only (FS-B), naming the kind to train."""
    kind = kind_facts(name)
    if not kind.trainable:
        raise ConfigError(f"model.name={name} is inference-only: train model.name={kind.trained_as} (or fine-tune "
                          f"it, e.g. the recall-weighted recipe), then read it with `fsf eval RUN model.name={name}` "
                          f"after `fsf calibrate RUN`")
