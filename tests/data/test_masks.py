"""Recall / switch masks (docs/freesolo.md §1.10): each rule on crafted sequences, then the vectorized
version against the literal loop on random sequences."""

import time

import numpy as np
import pytest

from fsframework.data.masks import loss_weights, recall_masks, recall_masks_loop

N, D, SW = 4, 8, 8  # small distances so short sequences exercise every rule


def masks(x, doc_ids=None, **kw):
    kw = {"ngram": N, "min_distance": D, "switch_window": SW, **kw}
    f, chi = recall_masks(np.asarray(x), doc_ids, **kw)
    f_ref, chi_ref = recall_masks_loop(np.asarray(x), doc_ids, **kw)
    np.testing.assert_array_equal(f, f_ref)
    np.testing.assert_array_equal(chi, chi_ref)
    return f, chi


def marked(mask):
    return np.flatnonzero(mask).tolist()


class Filler:
    """Tokens never seen before, so they match nothing."""

    def __init__(self):
        self.next = 1000

    def __call__(self, k):
        self.next += k
        return list(range(self.next - k, self.next))


def test_copy_marks_start_and_continuations():
    fill = Filler()
    src = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    x = src + fill(20) + src + fill(3)
    t0 = 30
    f, chi = masks(x)
    # start at the copy's first token; t0+1..t0+3 unmarked by design; then continuations
    assert marked(f) == [t0] + list(range(t0 + 4, t0 + 10))
    assert not chi.any()


def test_continuation_needs_matching_next_token():
    fill = Filler()
    x = [10, 11, 12, 13, 14] + fill(20) + [10, 11, 12, 13, 99]
    f, _ = masks(x)
    assert marked(f) == [25]  # only the start; 99 != 14 is no continuation


def test_uniqueness_counts_all_earlier_occurrences():
    fill = Filler()
    src = [10, 11, 12, 13, 14, 15]
    x = src + fill(12) + src + fill(12) + src
    f, _ = masks(x)
    # the second copy has one earlier occurrence; the third has two, so nothing there
    assert marked(f) == [18, 22, 23]
    # a close duplicate also counts, even though it is within min_distance
    x = src + fill(12) + src + fill(2) + src
    f, _ = masks(x)
    assert marked(f) == [18, 22, 23]


def test_min_distance_is_strict():
    fill = Filler()
    src = [10, 11, 12, 13, 14]
    for gap, expect in ((D - 5, False), (D - 4, True)):
        # copy starts at t = 5 + gap, source j = 0: t - j = gap + 5 must exceed D
        x = src + fill(gap) + src
        f, _ = masks(x)
        t = 5 + gap
        assert f[t] == expect and f[t + 4] == expect, (gap, marked(f))


def test_previous_token_condition():
    fill = Filler()
    src = [20, 21, 22, 23, 24, 25]
    x = fill(3) + [7] + src + fill(12) + [7] + src
    t_copy = 3 + 1 + len(src) + 12  # position of the second 7
    f, _ = masks(x)
    # the copy really starts at the 7 (its predecessor differs); the tokens after it
    # are preceded by the same token as their sources, so they are not starts
    assert f[t_copy] and not f[t_copy + 1]
    assert marked(f) == [t_copy] + list(range(t_copy + 4, t_copy + 7))


def test_missing_previous_token_counts_as_different():
    fill = Filler()
    src = [10, 11, 12, 13]
    # source at the start of document 1, preceded in the array by the same token (5)
    # that precedes the copy; across the boundary it is missing, so the copy is a start
    x = [5] + src + fill(12) + [5] + src
    doc = [0] + [1] * (len(x) - 1)
    f, _ = masks(x, np.array(doc))
    assert marked(f) == [18]
    f, _ = masks(x)  # one document: the copy starts at the 5, not at 10
    assert marked(f) == [17, 21]


def test_documents_are_separate():
    fill = Filler()
    src = [10, 11, 12, 13, 14, 15]
    x = src + fill(14) + src
    f, _ = masks(x)
    assert f.any()
    doc = np.array([0] * 20 + [1] * 6)
    f, _ = masks(x, doc)
    assert not f.any()


def test_ngram_across_a_boundary_is_no_occurrence():
    fill = Filler()
    a, b, c, d, e = 10, 11, 12, 13, 14
    x = fill(3) + [a, b] + [c, d] + fill(12) + [a, b, c, d, e] + fill(12) + [a, b, c, d, e]
    doc = np.array([0] * 5 + [1] * (len(x) - 5))
    t1, t2 = 19, 36
    f, _ = masks(x, doc)
    assert marked(f) == [t2, t2 + 4]  # only the second copy: its one earlier occurrence is t1
    f, _ = masks(x)
    assert marked(f) == [t1]  # one document: t1 copies the boundary n-gram, t2 has two before it


def test_continuation_target_must_share_the_document():
    fill = Filler()
    x = [10, 11, 12, 13, 14] + fill(12) + [10, 11, 12, 13] + [14, 99]
    f, _ = masks(x)
    assert marked(f) == [17, 21]
    doc = np.array([0] * 21 + [1, 1])
    f, _ = masks(x, doc)
    assert marked(f) == [17]


def test_start_ngram_must_fit_in_sequence_and_document():
    fill = Filler()
    x = [10, 11, 12, 13] + fill(12) + [10, 11, 12]
    f, _ = masks(x)
    assert not f.any()
    x = [10, 11, 12, 13] + fill(12) + [10, 11, 12, 13]
    f, _ = masks(x, np.array([0] * 18 + [1, 1]))
    assert not f.any()


def test_overlapping_occurrences():
    # a run: the 4-gram at t=1 overlaps its only earlier occurrence j=0
    x = [7] * 8
    f, _ = masks(x, min_distance=0)
    assert marked(f) == [1, 5]  # start at 1; continuation at 5 (context x[1:5], j=0)


def test_switches():
    fill = Filler()
    r = list(range(100, 120))
    x = fill(20) + r + fill(10) + r[0:6] + r[10:16] + fill(3)
    t_a, t_b = 50, 56  # starts of the two copied pieces; sources 20 and 30
    f, chi = masks(x)
    assert f[t_a] and f[t_b]
    assert marked(chi) == [t_b]  # t_b - t_a = 6 <= 8 and sources 10 apart > 8
    _, chi = masks(x, switch_window=10)  # sources 10 apart is not more than 10
    assert not chi.any()
    _, chi = masks(x, switch_window=5)  # previous start 6 back is too far
    assert not chi.any()
    # a jump back to a close source is no switch
    x = fill(20) + r + fill(10) + r[0:6] + r[3:9] + fill(3)
    f, chi = masks(x)
    assert f[t_b] and not chi.any()


def test_switch_needs_previous_start_in_same_document():
    fill = Filler()
    r, q = list(range(100, 110)), list(range(200, 210))
    # starts at 40 (source 20) and at 56 (source 46): 16 apart, sources 26 apart
    x = fill(20) + r + fill(10) + r[0:6] + q + q[0:5]
    kw = {"switch_window": 16}
    f, chi = masks(x, **kw)
    assert f[40] and f[56] and marked(chi) == [56]
    # the same starts with a document boundary at 46: the earlier start is in another document
    f, chi = masks(x, np.array([0] * 46 + [1] * (len(x) - 46)), **kw)
    assert f[40] and f[56] and not chi.any()


def test_loss_weights():
    f = np.array([0, 1, 1, 0], dtype=bool)
    chi = np.array([0, 0, 1, 0], dtype=bool)
    w = loss_weights(f, chi)
    assert w.dtype == np.float32 and w.tolist() == [1, 10, 19, 1]
    assert loss_weights(f, chi, beta_switch=49).tolist() == [1, 10, 59, 1]


def _random_case(rng):
    length = int(rng.integers(20, 220))
    kind = rng.integers(3)
    if kind == 0:  # tiny vocabulary: repeats everywhere
        x = rng.integers(0, int(rng.integers(2, 5)), length)
    else:  # larger vocabulary with planted long copies (sometimes with an edit)
        x = rng.integers(0, 60, length)
        for _ in range(int(rng.integers(1, 5))):
            k = int(rng.integers(4, 30))
            a, b = sorted(rng.integers(0, max(1, length - k), 2))
            x[b:b + k] = x[a:a + k]
            if rng.random() < 0.5:
                x[int(rng.integers(b, b + k)) % length] = rng.integers(0, 60)
    doc = None
    if rng.random() < 0.6:
        doc = np.sort(rng.integers(0, int(rng.integers(1, 5)), length))
    elif rng.random() < 0.3:  # arbitrary labels: documents are runs of equal ids
        doc = np.repeat(rng.integers(0, 3, length // 10 + 1), 10)[:length]
    return x, doc


def test_random_sequences_match_loop():
    rng = np.random.default_rng(1234)
    hits = 0
    for _ in range(150):
        x, doc = _random_case(rng)
        kw = {"ngram": int(rng.choice([1, 2, 3, 4, 4, 4])), "min_distance": int(rng.choice([0, 4, 8, 16])),
              "switch_window": int(rng.choice([2, 8, 16]))}
        f, chi = recall_masks(x, doc, **kw)
        f_ref, chi_ref = recall_masks_loop(x, doc, **kw)
        np.testing.assert_array_equal(f, f_ref, err_msg=str(kw))
        np.testing.assert_array_equal(chi, chi_ref, err_msg=str(kw))
        hits += int(chi.any())
    assert hits > 10  # the cases do exercise switches


def test_many_distinct_tokens_use_exact_grouping():
    # 300 distinct tokens and n = 8: 300**8 overflows 63 bits, so rows are grouped exactly
    rng = np.random.default_rng(5)
    x = rng.integers(0, 10**9, 300)
    x[200:240] = x[20:60]
    x[260:270] = x[100:110]
    for n in (8, 4):
        f, chi = recall_masks(x, ngram=n, min_distance=16)
        f_ref, chi_ref = recall_masks_loop(x, ngram=n, min_distance=16)
        np.testing.assert_array_equal(f, f_ref)
        np.testing.assert_array_equal(chi, chi_ref)
        assert f[200] and f[260]


def test_short_and_empty_inputs():
    for x in ([], [1], [1, 2, 3, 4]):
        f, chi = recall_masks(np.array(x, dtype=np.int64))
        assert f.shape == chi.shape == (len(x),) and not f.any()
    with pytest.raises(ValueError):
        recall_masks(np.arange(5), np.arange(4))


def test_speed_4096_tokens():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50_000, 4097)
    x[3000:3600] = x[200:800]
    recall_masks(x)
    start = time.perf_counter()
    for _ in range(10):
        f, _ = recall_masks(x)
    per_call = (time.perf_counter() - start) / 10
    assert f[3000] and f[3004:3600].all()
    assert per_call < 0.05, f"{per_call * 1e3:.1f} ms per 4096-token sequence"
