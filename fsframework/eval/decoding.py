"""Greedy decoding: a cached prefill plus one token per step for the registry's
language models (`fsframework.models.decode_cache`, docs/decoding.md), full forward
passes otherwise.

The models take no padding mask, so a padded batch would let real tokens attend to
pad tokens and shift their positions. Prompts are therefore batched only with
prompts of identical length; the task generators make every prompt of one task
and length the same length, so in practice batches are full.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from fsframework.models.decode_cache import decode_cache, prefill, supports_decode_cache
from fsframework.models.language_model import LanguageModel


def last_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits `[B, V]` of the last position.

    For the framework's language models (`LanguageModel`), only the last
    position goes through the output head, so memory stays linear in the length
    instead of holding `[B, T, V]` logits.
    """
    if isinstance(model, LanguageModel):
        return model.lm_head(model.hidden_states(tokens)[:, -1]).float()
    return model(tokens)[:, -1].float()


def cached_tokens(model: nn.Module, tokens: torch.Tensor, choose: Callable[[torch.Tensor], torch.Tensor],
                  on_step: Callable[[object], None] | None = None) -> Iterator[torch.Tensor]:
    """The decode loop of every caller (greedy evaluation, `fsf generate`): tokens `[B]` chosen
    by `choose(logits [B, V])`, one per `next()`. The prompt `tokens` `[B, T]` is prefilled once,
    in chunks (only its last hidden state is kept), then each chosen token goes through the
    decode cache. `on_step(cache)` sees the cache after each forward step. Close the generator
    to leave the cache context (the model gets its plain attention back)."""
    with decode_cache(model) as cache:
        hidden = prefill(cache, tokens)
        while True:
            nxt = choose(model.lm_head(hidden).float())
            if on_step is not None:
                on_step(cache)
            yield nxt
            hidden = prefill(cache, nxt[:, None])


def _next_token_steps(model: nn.Module, tokens: torch.Tensor, use_cache: bool) -> Iterator[torch.Tensor]:
    """Greedy next tokens `[B]`, one per `next()`; each is fed back as the next input."""
    if use_cache:
        yield from cached_tokens(model, tokens, lambda logits: logits.argmax(dim=-1))
    while True:
        nxt = last_logits(model, tokens).argmax(dim=-1)
        yield nxt
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)


def _greedy_batch(model: nn.Module, tokens: torch.Tensor, max_new_tokens: int, eos_id: int | None,
                  use_cache: bool) -> list[list[int]]:
    new = []
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    steps = _next_token_steps(model, tokens, use_cache)
    for _ in range(max_new_tokens):
        nxt = next(steps)
        new.append(nxt)
        if eos_id is not None:
            done |= nxt == eos_id
            if bool(done.all()):
                break
    steps.close()  # leaves the cache context: the model gets its plain attention back
    if not new:
        return [[] for _ in range(tokens.shape[0])]
    rows = torch.stack(new, dim=1).tolist()
    if eos_id is not None:
        rows = [row[:row.index(eos_id)] if eos_id in row else row for row in rows]
    return rows


def greedy_generate(model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                    eos_id: int | None = None, batch_size: int = 8, device: torch.device | str | None = None,
                    on_batch: Callable[[int], None] | None = None, use_cache: bool | None = None
                    ) -> list[list[int]]:
    """Greedy continuations of `prompts` (each without the prompt, cut before the first EOS).

    Prompts of equal length are decoded together, `batch_size` at a time, in the input
    order within each length. `on_batch(n)` is called after each batch of n prompts
    (progress bars). The model is used as is (device, dtype, eval mode are the caller's).
    use_cache: decode with the key/value cache (default: whenever the model supports it);
    False runs a full forward pass per token (the reference the cache is tested against).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if use_cache is None:
        use_cache = supports_decode_cache(model)
    if device is None:
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    groups: dict[int, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")
        groups[len(prompt)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        for length in sorted(groups):
            idxs = groups[length]
            for start in range(0, len(idxs), batch_size):
                chunk = idxs[start:start + batch_size]
                tokens = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long, device=device)
                for i, row in zip(chunk, _greedy_batch(model, tokens, max_new_tokens, eos_id, use_cache)):
                    out[i] = row
                if on_batch is not None:
                    on_batch(len(chunk))
    return out
