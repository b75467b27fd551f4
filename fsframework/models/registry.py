"""The model registry: the classes that implement each kind, one entry per kind.

An entry holds the attention module that implements the kind (written once, in the offset form
of `fsframework.models.attention`) and its facts from `fsframework.config.kinds` (one table, read
by config validation too): among them which earlier keys that form reads, the whole prefix or only
the last `window` keys. That fact decides what a sequence-parallel rank fetches from the ranks before
it (an all-gather of the prefix, or a halo of `window` keys: `fsframework.parallel`); the entry's
`cache` is the class of what one layer keeps while decoding (`fsframework.models.decode_cache`,
docs/decoding.md). Adding a kind means writing its op (`fsframework.ops`), its module, its facts in
`fsframework.config.kinds` and one entry here.

Whatever else differs between kinds is a fact or a field of the entry, read where it matters: the
routing variant of a FreeSolo kind, whether it reads calibrated thresholds, which settings describe
how it reads long range, and the adapter that writes it as another library's own architecture. No
other module compares `model.name` with a kind's name (a test scans for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Optional

from fsframework.config import ModelConfig
from fsframework.config.attention import AttentionConfig
from fsframework.config.kinds import KIND_FACTS, KindFacts, check_trainable, kind_facts
from fsframework.models import llama
from fsframework.models.argrc import ARGRCLanguageModel
from fsframework.models.attention import AlibiAttention, NoPositionAttention, RopeAttention, SlidingWindowAttention
from fsframework.models.context import RetainedCells
from fsframework.models.freesolo_attention import FreeSoloAttention, freesolo_decode_state
from fsframework.models.kv_cache import PrefixKVCache, WindowKVCache
from fsframework.models.rewired_attention import RewiredAttention
from fsframework.models.transformer import TransformerLM

__all__ = ["KINDS", "MODEL_NAMES", "FREESOLO_MODELS", "AttentionKind", "attention_kind", "build_model",
           "check_trainable", "count_parameters", "native_kind"]


@dataclass(frozen=True)
class AttentionKind:
    """A kind's facts (`fsframework.config.kinds`; each reads through: `kind.routing`, `kind.keys`, ...)
    and the classes that implement it."""

    facts: KindFacts
    module: Optional[type] = None  # the attention module of each decoder block; None: no attention (AR-GRC)
    # what builds one layer's decode cache from the layer's attention module (a class, or FreeSolo's
    # `freesolo_decode_state`; fsframework.models.decode_cache): what a kind keeps of the past while
    # decoding. None: the keys its offset form reads (every key and value for "prefix", a ring of them
    # for "window")
    cache: Optional[Callable] = None
    # a whole language model of its own (built from the ModelConfig) instead of a TransformerLM around
    # `module`; what it needs of ZeRO-3 and decoding it declares itself (`LanguageModel`)
    language_model: Optional[type] = None
    # a module that writes the kind as another library's own architecture: `to_native_name(name)`,
    # `native_config(model, *, max_positions, torch_dtype)`; None: the export carries its own
    # modeling code (fsframework.export.remote)
    native_export: Optional[ModuleType] = None

    def __getattr__(self, name: str):
        # only reached for names the entry lacks: the facts (name, keys, routing, trainable, read_path, ...)
        if name == "facts":  # not set yet (copy, unpickling): no recursion into self.facts
            raise AttributeError(name)
        return getattr(self.facts, name)

    def key_span(self, attention: AttentionConfig):
        """Which keys before its queries the offset form reads (`fsframework.models.context`): None
        for the whole prefix, an int for a window, a RetainedCells for FS-L's cells."""
        if self.keys == "window":
            return attention.window
        if self.keys == "retained":
            return RetainedCells(attention.cell_size, attention.recent_cells, attention.retained_cells,
                                 attention.window)
        return None

    def native_adapter(self) -> Optional[ModuleType]:
        """The `native_export` module, or None for an export with its own modeling code."""
        return self.native_export

    def cache_class(self) -> Callable:
        if self.cache is not None:
            return self.cache
        if self.keys not in _KEY_CACHES:
            raise ValueError(f"model.name={self.name} has no layer cache: its language model brings its own")
        return _KEY_CACHES[self.keys]


_KEY_CACHES = {"prefix": PrefixKVCache, "window": WindowKVCache}

# the classes of each kind of `fsframework.config.kinds.KIND_FACTS` (its facts are taken from there)
_CLASSES: dict[str, dict] = {
    "tfpp": dict(module=RopeAttention, native_export=llama),
    "swa": dict(module=SlidingWindowAttention),
    "alibi": dict(module=AlibiAttention),
    "sinusoidal": dict(module=NoPositionAttention),
    "fs": dict(module=FreeSoloAttention, cache=freesolo_decode_state),
    "fsl": dict(module=FreeSoloAttention, cache=freesolo_decode_state),
    "fsb": dict(module=FreeSoloAttention, cache=freesolo_decode_state),
    "rewired": dict(module=RewiredAttention),
    "argrc": dict(language_model=ARGRCLanguageModel),
}
if set(_CLASSES) != set(KIND_FACTS):  # a kind with facts but no classes, or classes but no facts
    raise ImportError(f"the registry's kinds {sorted(_CLASSES)} differ from fsframework.config.kinds' "
                      f"{sorted(KIND_FACTS)}")

KINDS: dict[str, AttentionKind] = {name: AttentionKind(facts, **_CLASSES[name]) for name, facts in KIND_FACTS.items()}

MODEL_NAMES = tuple(KINDS)
FREESOLO_MODELS = tuple(name for name, kind in KINDS.items() if kind.freesolo)


def attention_kind(name: str) -> AttentionKind:
    """The entry of kind `name`."""
    if name not in KINDS:
        kind_facts(name)  # raises the one-line ConfigError that names the known kinds
    return KINDS[name]


def native_kind(adapter: str) -> str:
    """The kind whose `native_export` is module `adapter` (what an imported checkpoint becomes)."""
    names = [name for name, kind in KINDS.items()
             if kind.native_export is not None and kind.native_export.__name__ == adapter]
    if len(names) != 1:
        raise ValueError(f"{adapter} is the native export of {len(names)} kinds, not one")
    return names[0]


def build_model(cfg: ModelConfig):
    """Instantiate the language model named by `cfg.name`."""
    kind = attention_kind(cfg.name)
    if kind.language_model is not None:
        return kind.language_model(cfg)
    cls, span = kind.module, kind.key_span(cfg.attention)
    return TransformerLM(cfg, lambda c, i: cls(c, i, span), absolute_positions=kind.absolute_positions,
                         layer_cache=kind.cache_class())


def count_parameters(model) -> int:
    """Number of parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters())
