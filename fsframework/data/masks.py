"""Recall and switch masks for recall-weighted training (docs/freesolo.md §1.10), from token ids alone.

Positions are indexed by the *target* token `t` (the token whose prediction the loss
term `CE_t` scores), and both masks have the length of `tokens`. With `n = ngram`
and `D = min_distance`:

- An *occurrence* of an n-gram is a start position `j` with `x[j:j+n]` wholly inside
  one document and inside the given sequence. The *earlier occurrences* of the
  n-gram starting at `p` are all its occurrences `j < p` in the same document, at
  any distance; they may overlap `x[p:p+n]` (e.g. in a run of repeated tokens).
- *continuation* at `t`: with `p = t - n`, `x[p:t]` and `x[t]` lie in one document,
  `x[p:t]` has exactly one earlier occurrence `j` (`j < p`), `p - j > D`, and
  `x[j+n] == x[t]`. Source: `j + n`.
- *start* at `t`: `x[t:t+n]` lies inside the document and the sequence, has
  exactly one earlier occurrence `j` (`j < t`), `t - j > D`, and the tokens before
  them differ, `x[j-1] != x[t-1]`, where a token outside the document (or before
  the sequence) is missing and a missing token differs from everything. Source: `j`.
- `f = start | continuation`. A token that is both keeps its start source (only
  start sources enter the switch rule).
- `chi` at `t`: `t` is a start, the previous start `t'` of the same document has
  `t - t' <= switch_window`, and `|src(t) - src(t')| > switch_window`.

Our reading where the paper leaves room:
- Uniqueness counts all earlier occurrences; the unique one must also lie more
  than `D` back. An n-gram seen twice before is never a recall, however far.
- For a continuation, "earlier" means `j < t - n` (the occurrence starts before the
  context n-gram does), as the paper writes; for a start, `j < t`. Both are the same
  rule "occurrence before the n-gram's own start", so overlaps are allowed.
- Documents are maximal runs of equal consecutive `doc_ids` (a boundary wherever
  the id changes). In the pinned shard format ids are non-decreasing, where this is
  exactly "positions with equal ids"; `doc_ids=None` means one document.
- "Inside the sequence seen" is the array passed in: masks are loss weights, not
  model inputs, so a start may look at `x[t+1:t+n]`.

For a pinned MDS sample (`tokens` of `seq_len + 1`, targets `tokens[1:]`), compute the
masks over the whole sample and weight target `i` of the model by `w[1:][i]`.

`recall_masks` is vectorized (exact n-gram codes, a stable sort, no hashing, so no
collisions); `recall_masks_loop` follows the definition literally and is the
reference the tests compare against.
"""

from __future__ import annotations

import numpy as np


def _runs(doc_ids, length: int) -> np.ndarray:
    """Document index per position: a new document wherever `doc_ids` changes."""
    if doc_ids is None:
        return np.zeros(length, dtype=np.int64)
    d = np.asarray(doc_ids).reshape(-1)
    if d.shape[0] != length:
        raise ValueError(f"doc_ids has length {d.shape[0]}, tokens has length {length}")
    runs = np.zeros(length, dtype=np.int64)
    if length > 1:
        runs[1:] = np.cumsum(d[1:] != d[:-1])
    return runs


def _group_keys(x: np.ndarray, runs: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """An int64 key per n-gram start, equal iff the document and the n-gram are equal
    (an exact positional code, no hashing, so no collisions)."""
    # Dense token ranks: at most len(x) distinct values, so base**n fits in 63 bits
    # for any sequence up to 2**15 tokens at n = 4, whatever the vocabulary size.
    _, dense = np.unique(x, return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)
    base = int(dense.max()) + 1
    num_runs = int(runs[-1]) + 1
    if num_runs * base ** n < 2 ** 63:
        key = runs[starts].copy()
        for k in range(n):
            key = key * base + dense[starts + k]
        return key
    # Too many distinct tokens for a positional code: group equal rows exactly.
    rows = np.concatenate([runs[starts, None], dense[starts[:, None] + np.arange(n)[None, :]]], axis=1)
    _, inverse = np.unique(rows, axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def _switches(starts: np.ndarray, sources: np.ndarray, runs: np.ndarray, window: int) -> np.ndarray:
    """Mask over `starts` (sorted positions): previous start in the same document is
    at most `window` back and its source is more than `window` away."""
    out = np.zeros(starts.shape[0], dtype=bool)
    if starts.shape[0] > 1:
        same_doc = runs[starts[1:]] == runs[starts[:-1]]
        close = starts[1:] - starts[:-1] <= window
        jump = np.abs(sources[1:] - sources[:-1]) > window
        out[1:] = same_doc & close & jump
    return out


def recall_masks(tokens, doc_ids=None, *, ngram: int = 4, min_distance: int = 512,
                 switch_window: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """`(f, chi)` boolean masks over target positions; see the module docstring for the rules."""
    x = np.asarray(tokens).reshape(-1).astype(np.int64)
    length, n = x.shape[0], int(ngram)
    if n < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    runs = _runs(doc_ids, length)
    f = np.zeros(length, dtype=bool)
    chi = np.zeros(length, dtype=bool)
    if length < n + 1:
        return f, chi

    # n-grams that start at p and stay inside one document (run ids never decrease,
    # so equal ids at both ends mean one run throughout)
    p_all = np.arange(length - n + 1)
    valid = runs[p_all] == runs[p_all + n - 1]
    starts = p_all[valid]
    if starts.shape[0] == 0:
        return f, chi
    key = _group_keys(x, runs, starts, n)

    # Stable sort by (document, n-gram) key: positions stay ascending inside each
    # group, so a position's rank in its group is its number of earlier occurrences.
    order = np.argsort(key, kind="stable")
    s_pos, s_key = starts[order], key[order]
    new_group = np.ones(s_pos.shape[0], dtype=bool)
    new_group[1:] = s_key[1:] != s_key[:-1]
    group_first = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1
    rank = np.arange(s_pos.shape[0]) - group_first[group_of]
    first_pos = s_pos[group_first[group_of]]

    # exactly one earlier occurrence j (the group's first), lying more than D back
    unique_far = (rank == 1) & (s_pos - first_pos > min_distance)
    p, j = s_pos[unique_far], first_pos[unique_far]

    # continuation at t = p + n: t in the document, and the token after j matches x[t]
    t = p + n
    inside = t < length
    t_c, j_c, p_c = t[inside], j[inside], p[inside]
    cont = (runs[t_c] == runs[p_c]) & (x[j_c + n] == x[t_c])
    f[t_c[cont]] = True

    # start at t = p: tokens before t and before j differ (missing = different)
    t_has_prev = (p >= 1) & (runs[np.maximum(p - 1, 0)] == runs[p])
    j_has_prev = (j >= 1) & (runs[np.maximum(j - 1, 0)] == runs[p])
    differ = ~t_has_prev | ~j_has_prev | (x[np.maximum(p - 1, 0)] != x[np.maximum(j - 1, 0)])
    s_order = np.argsort(p[differ], kind="stable")
    start_t, start_src = p[differ][s_order], j[differ][s_order]
    f[start_t] = True
    chi[start_t[_switches(start_t, start_src, runs, switch_window)]] = True
    return f, chi


def recall_masks_loop(tokens, doc_ids=None, *, ngram: int = 4, min_distance: int = 512,
                      switch_window: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The same masks by a literal O(L^2 n) reading of the rules; a test reference."""
    x = [int(v) for v in np.asarray(tokens).reshape(-1)]
    length, n = len(x), int(ngram)
    ids = [0] * length if doc_ids is None else [int(v) for v in np.asarray(doc_ids).reshape(-1)]
    doc = [0] * length
    for i in range(1, length):
        doc[i] = doc[i - 1] + (ids[i] != ids[i - 1])

    def inside(p: int) -> bool:
        return 0 <= p and p + n <= length and all(doc[p + k] == doc[p] for k in range(n))

    def earlier(p: int) -> list[int]:
        return [j for j in range(p) if inside(j) and doc[j] == doc[p] and x[j:j + n] == x[p:p + n]]

    def token_before(i: int, d_: int):
        return x[i - 1] if i >= 1 and doc[i - 1] == d_ else None

    f = np.zeros(length, dtype=bool)
    chi = np.zeros(length, dtype=bool)
    last_start: dict[int, tuple[int, int]] = {}  # document -> (position, source)
    for t in range(length):
        p = t - n
        if inside(p) and doc[t] == doc[p]:
            occ = earlier(p)
            if len(occ) == 1 and p - occ[0] > min_distance and x[occ[0] + n] == x[t]:
                f[t] = True
        if inside(t):
            occ = earlier(t)
            if len(occ) == 1 and t - occ[0] > min_distance:
                j = occ[0]
                a, b = token_before(t, doc[t]), token_before(j, doc[t])
                if a is None or b is None or a != b:
                    f[t] = True
                    prev = last_start.get(doc[t])
                    if prev is not None and t - prev[0] <= switch_window and abs(j - prev[1]) > switch_window:
                        chi[t] = True
                    last_start[doc[t]] = (t, j)
    return f, chi


def loss_weights(f, chi, beta: float = 9.0, beta_switch: float = 9.0) -> np.ndarray:
    """Per-target loss weights `w = 1 + beta f + beta_switch chi` (float32)."""
    f = np.asarray(f, dtype=np.float32)
    chi = np.asarray(chi, dtype=np.float32)
    return (1.0 + beta * f + beta_switch * chi).astype(np.float32)
