"""The model registry: one entry per attention kind says everything about it.

An entry names the module that implements the kind (written once, in the offset form
of `fsframework.models.attention`) and which earlier keys that form reads: the whole
prefix, or only the last `window` keys. That fact decides what a sequence-parallel
rank fetches from the ranks before it (an all-gather of the prefix, or a halo of
`window` keys: `fsframework.parallel`); the entry's `cache` names what one layer keeps
while decoding (`fsframework.models.decode_cache`, docs/decoding.md). Adding a kind
means writing its op (`fsframework.ops`), its module, and one entry here.

Whatever else differs between kinds is a field of the entry, read where it matters: the
routing variant of a FreeSolo kind, whether it reads calibrated thresholds, which settings
describe how it reads long range, and the adapter that writes it as another library's own
architecture. No other module compares `model.name` with a kind's name (a test scans for it).

This file imports no torch: `fsframework.config` validates `model.name` against it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from fsframework.config import AttentionConfig, ConfigError, ModelConfig


@dataclass(frozen=True)
class AttentionKind:
    name: str
    module: str  # "package.module:Class", imported when a model is built
    # "prefix": keys of [0, start + n); "window": only the `window` keys before start; "retained":
    # the prefix of which FS-L reads only its window, recent and top-P cells (RetainedCells)
    keys: str
    summary: str
    absolute_positions: bool = False  # sinusoidal position table added to the embeddings
    freesolo: bool = False  # a FreeSolo model: query blocks, cells, routing (model.attention.*)
    trainable: bool = True  # False: a read path over another kind's weights (`fsf train` refuses it)
    trained_as: str = ""  # for a kind that is not trainable: the kind to train instead
    # a whole language model of its own ("package.module:Class", built from the ModelConfig) instead
    # of a TransformerLM around `module`; it brings its own cached decoding and sequence parallelism
    language_model: Optional[str] = None
    # module classes ("package.module.Class") that ZeRO-3 gathers as a whole at each call instead of
    # per submodule: a model whose ranks call a submodule different numbers of times needs it
    zero3_leaf_modules: tuple[str, ...] = ()
    # the class of one layer's decode cache ("package.module:Class", built from the layer's attention
    # module; fsframework.models.decode_cache): what a kind keeps of the past while decoding. None:
    # the keys its offset form reads (every key and value for "prefix", a ring of them for "window")
    cache: Optional[str] = None
    # FreeSolo: the routing variant of `fsframework.ops.freesolo.select_cells` ("fs", "fsl", "fsb")
    routing: str = ""
    # reads per-head thresholds calibrated once per checkpoint (`fsf calibrate`, calibration.json)
    calibrated: bool = False
    # how the kind reads long range, for a scores file: (label, dotted key under model.attention) pairs
    read_settings: tuple[tuple[str, str], ...] = ()
    # a module ("package.module") that writes the kind as another library's own architecture:
    # `to_native_name(name)`, `native_config(model, *, max_positions, torch_dtype)`; None: the
    # export carries its own modeling code (fsframework.export.remote)
    native_export: Optional[str] = None

    def key_span(self, attention: AttentionConfig):
        """Which keys before its queries the offset form reads (`fsframework.models.context`): None
        for the whole prefix, an int for a window, a RetainedCells for FS-L's cells."""
        if self.keys == "window":
            return attention.window
        if self.keys == "retained":
            from fsframework.models.context import RetainedCells

            return RetainedCells(attention.cell_size, attention.recent_cells, attention.retained_cells,
                                 attention.window)
        return None

    def read_path(self, attention: AttentionConfig) -> dict:
        """The settings that say how this kind reads long range (`read_settings`), by label."""
        return {"model": self.name, **{label: _setting(attention, key) for label, key in self.read_settings}}

    def native_adapter(self):
        """The `native_export` module, or None for an export with its own modeling code."""
        return importlib.import_module(self.native_export) if self.native_export else None

    @property
    def own_decode_cache(self) -> bool:
        """The kind's language model brings its own cached decoding form (`make_decode_cache`, AR-GRC)
        instead of a `DecodeCache` of layer caches (`fsframework.models.decode_cache`)."""
        return self.language_model is not None

    def module_class(self) -> type:
        return _import(self.module)

    def cache_class(self) -> type:
        if self.cache is not None:
            return _import(self.cache)
        if self.keys not in _KEY_CACHES:
            raise ValueError(f"model.name={self.name} has no layer cache: its language model brings its own")
        return _import(_KEY_CACHES[self.keys])


def _setting(attention: AttentionConfig, key: str):
    """The value of dotted `key` under `attention` (e.g. "fsb.top_k": FS-B's own group)."""
    value = attention
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _import(target: str) -> type:
    path, _, cls = target.partition(":")
    return getattr(importlib.import_module(path), cls)


_ATTENTION = "fsframework.models.attention"
_FREESOLO = "fsframework.models.freesolo_attention:FreeSoloAttention"
_FSB_SETTINGS = tuple((name, f"fsb.{name}") for name in ("top_k", "beam_width", "bound_c", "forests"))
_KEY_CACHES = {"prefix": "fsframework.models.kv_cache:PrefixKVCache",
               "window": "fsframework.models.kv_cache:WindowKVCache"}

KINDS: dict[str, AttentionKind] = {kind.name: kind for kind in (
    AttentionKind("tfpp", f"{_ATTENTION}:RopeAttention", "prefix", "Transformer++: full causal attention, RoPE",
                  native_export="fsframework.models.llama"),
    AttentionKind("swa", f"{_ATTENTION}:SlidingWindowAttention", "window", "sliding-window attention, RoPE"),
    AttentionKind("alibi", f"{_ATTENTION}:AlibiAttention", "prefix", "full causal attention, ALiBi bias"),
    AttentionKind("sinusoidal", f"{_ATTENTION}:NoPositionAttention", "prefix",
                  "full causal attention, sinusoidal absolute positions", absolute_positions=True),
    AttentionKind("fs", _FREESOLO, "prefix", "FreeSolo: RoPE window + routed NoPE cells", freesolo=True,
                  cache="fsframework.models.freesolo_cache:FSCache", routing="fs", read_settings=(("top_k", "top_k"),)),
    AttentionKind("fsl", _FREESOLO, "retained", "FreeSolo-L: FS routing over a norm-pruned prefix", freesolo=True,
                  cache="fsframework.models.freesolo_cache:FSLCache", routing="fsl",
                  read_settings=(("top_k", "top_k"),)),
    AttentionKind("fsb", _FREESOLO, "prefix", "FreeSolo-B: forest search over FS/FS-L weights (inference only)",
                  freesolo=True, trainable=False, trained_as="fs", cache="fsframework.models.fsb_cache:FSBCache",
                  routing="fsb", calibrated=True, read_settings=_FSB_SETTINGS),
    AttentionKind("rewired", "fsframework.models.rewired_attention:RewiredAttention", "prefix",
                  "runway-rewired causal attention, RoPE (docs/rewired.md)"),
    # AR-GRC has no attention (no module, no keys, no layer cache): a learned cell composed by a tree
    # scan, whose language model brings its own decode cache (`make_decode_cache`)
    AttentionKind("argrc", "", "", "AR-GRC: log-depth recurrent LM, a gated cell over a Blelloch scan",
                  language_model="fsframework.models.argrc:ARGRCLanguageModel",
                  zero3_leaf_modules=("fsframework.models.argrc.TreeScan",)),
)}

MODEL_NAMES = tuple(KINDS)
FREESOLO_MODELS = tuple(name for name, kind in KINDS.items() if kind.freesolo)


def attention_kind(name: str) -> AttentionKind:
    if name not in KINDS:
        raise ConfigError(f"model.name={name!r} is not registered; choose one of {', '.join(MODEL_NAMES)}")
    return KINDS[name]


def kind_of(model) -> Optional[AttentionKind]:
    """The entry of a registry language model (a `TransformerLM` or a kind's own `language_model`),
    None for any other module."""
    from fsframework.models.transformer import TransformerLM

    if isinstance(model, TransformerLM):
        return attention_kind(model.cfg.name)
    return next((kind for kind in KINDS.values()
                 if kind.language_model is not None and isinstance(model, _import(kind.language_model))), None)


def native_kind(adapter: str) -> str:
    """The kind whose `native_export` is module `adapter` (what an imported checkpoint becomes)."""
    names = [name for name, kind in KINDS.items() if kind.native_export == adapter]
    if len(names) != 1:
        raise ValueError(f"{adapter} is the native export of {len(names)} kinds, not one")
    return names[0]


def check_trainable(name: str) -> None:
    """Raise ConfigError when kind `name` is a read path only (FS-B), naming the kind to train."""
    kind = attention_kind(name)
    if not kind.trainable:
        raise ConfigError(f"model.name={name} is inference-only: train model.name={kind.trained_as} (or fine-tune "
                          f"it, e.g. the recall-weighted recipe), then read it with `fsf eval RUN model.name={name}` "
                          f"after `fsf calibrate RUN`")


def build_model(cfg: ModelConfig):
    """Instantiate the language model named by `cfg.name`."""
    from fsframework.models.transformer import TransformerLM

    kind = attention_kind(cfg.name)
    if kind.language_model is not None:
        return _import(kind.language_model)(cfg)
    cls, span = kind.module_class(), kind.key_span(cfg.attention)
    return TransformerLM(cfg, lambda c, i: cls(c, i, span), absolute_positions=kind.absolute_positions)


def count_parameters(model) -> int:
    """Number of parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())
