"""Streaming generation from one prompt with the decode cache (`fsf generate`, docs/decoding.md).

The prompt is prefilled once, in chunks (`fsframework.models.decode_cache`), then one token
per step: greedy (temperature 0) or sampled at a temperature from the nucleus of
probability `top_p`. `stream_tokens` yields each new token as soon as it is chosen and fills
a `GenerationStats` (prefill and decode time, the cache's allocated bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from fsframework.config.kinds import kind_facts
from fsframework.eval.decoding import cached_tokens
from fsframework.models.decode_cache import cache_bytes


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0  # the prompt's forward pass and the first token's choice
    steps: int = 0  # decoding steps after the prefill (one token's forward pass and choice each)
    decode_s: float = 0.0  # their time
    cache_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Decoding speed: steps per second (the prefill's first token not counted)."""
        return self.steps / self.decode_s if self.steps and self.decode_s > 0 else 0.0


def max_positions(cfg) -> Optional[int]:
    """The longest sequence `cfg`'s model can take, None when unbounded: a kind with absolute
    positions (sinusoidal) only knows the positions it was trained on, `data.seq_len`."""
    return cfg.data.seq_len if kind_facts(cfg.model.name).absolute_positions else None


def check_request(cfg, prompt_tokens: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """Raise ValueError naming what is wrong with a generation request for `cfg`'s model."""
    if prompt_tokens == 0:
        raise ValueError("the prompt is empty: give some text with --prompt or --prompt-file")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    limit = max_positions(cfg)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(f"model.name={cfg.model.name} has absolute positions trained up to data.seq_len={limit}: "
                         f"a prompt of {prompt_tokens} tokens plus {max_new_tokens} new tokens needs "
                         f"{prompt_tokens + max_new_tokens} positions; shorten the prompt or lower --max-new-tokens")


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """logits `[B, V]` -> tokens `[B]`: argmax at temperature 0, else a sample of
    `softmax(logits / temperature)` restricted to the smallest set of most likely tokens whose
    probability reaches `top_p` (the most likely token always stays)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    pick = torch.multinomial(sorted_probs.cpu(), 1, generator=generator).to(order.device)
    return order.gather(-1, pick)[:, 0]


@torch.inference_mode()
def stream_tokens(model: nn.Module, prompt: Sequence[int], *, max_new_tokens: int, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int = 0, eos_id: Optional[int] = None,
                  stats: Optional[GenerationStats] = None) -> Iterator[int]:
    """New tokens after `prompt`, one per `next()`, until `max_new_tokens` or `eos_id` (not yielded)."""
    stats = stats if stats is not None else GenerationStats()
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    stats.prompt_tokens = tokens.shape[1]
    steps = cached_tokens(model, tokens, lambda logits: next_token(logits, temperature, top_p, generator),
                          on_step=lambda cache: setattr(stats, "cache_bytes", cache_bytes(cache)))
    try:
        begin = time.perf_counter()
        token = next(steps)
        stats.prefill_s = time.perf_counter() - begin
        for step in range(max_new_tokens):
            if eos_id is not None and int(token) == eos_id:
                break
            stats.new_tokens += 1
            yield int(token)  # the consumer's time (printing) is not counted below
            if step + 1 == max_new_tokens:
                break
            begin = time.perf_counter()
            token = next(steps)
            stats.decode_s += time.perf_counter() - begin
            stats.steps += 1
    finally:
        steps.close()
