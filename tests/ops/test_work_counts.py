"""The ops cost what their stated complexity says, counted in multiply-adds and, for the FreeSolo
ops and the window, in elements written too (tests/work.py: the masks, sorts and gathers a
multiply-add count misses), not timed.

- Offset attention (`fsframework.ops.offset_attention`, docs/architecture.md, "One computation
  per attention kind"): a decoded query over `T` keys costs `O(T)`, a prefill chunk of `n`
  queries `O(n T)`, a windowed one `O(w)`; many queries under autograd keep the fused square
  call's linear memory.
- FreeSolo (docs/freesolo.md §1.7, §1.8): FS routing `O(N^2 d / s)`, FS-L routing
  `O(N (P + W) d)`, FS-B routing `O(N log^2 N)`, the readout `O(N K s d)`.

Each compares a size with 4x that size: linear work grows 4x, quadratic 16x. Small shapes, fp32.
"""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops.freesolo import cell_readout, select_cells
from fsframework.ops.offset_attention import alibi_attention_at, causal_attention_at, window_attention_at
from tests.work import WorkCounter, count

B, H, D = 1, 2, 8
LINEAR = 4.5  # 4x the size, plus slack for constant terms
FLAT = 1.2


def randn(*shape, seed=0, grad=False):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def _causal(n: int, start: int, grad: bool = False):
    q, k, v = randn(B, n, H, D, grad=grad), randn(B, start + n, H, D, seed=1), randn(B, start + n, H, D, seed=2)
    with torch.set_grad_enabled(grad):
        return count(causal_attention_at, q, k, v, start)


def test_a_decoded_query_reads_each_key_once():
    small, large = _causal(1, 255), _causal(1, 1023)
    assert large.macs <= LINEAR * small.macs, (small.macs, large.macs)  # was 16x: a padded T x T call
    assert large.macs <= B * H * 1024 * 2 * D  # q.k and p.v over the 1024 keys, nothing more


def test_a_prefill_chunk_costs_its_rows():
    n = 32
    small, large = _causal(n, 256), _causal(n, 1024)
    assert large.macs <= LINEAR * small.macs, (small.macs, large.macs)
    assert large.macs <= B * H * n * (1024 + n) * 2 * D


def test_an_alibi_decoded_query_reads_each_key_once():
    slopes = torch.tensor([0.5, 0.25])
    work = [count(alibi_attention_at, randn(B, 1, H, D), randn(B, t, H, D), randn(B, t, H, D), t - 1, slopes).macs
            for t in (256, 1024)]
    assert work[1] <= LINEAR * work[0], work


def test_many_queries_under_autograd_keep_linear_memory():
    """A late sequence-parallel rank (n queries after 2n keys): no [n, 3n] mask or score tensor."""
    n, start = 512, 1024
    work = _causal(n, start, grad=True)
    assert work.largest < n * (start + n) // 4, work.largest


def test_many_queries_without_autograd_cost_their_rows_in_bounded_memory():
    """Inference over a long slice (a big prefill chunk): the mask path in pieces whose mask is no
    larger than front-padding would make (`mask_queries`)."""
    n, start = 512, 1024
    work = _causal(n, start)
    assert work.macs <= B * H * n * (start + n) * 2 * D
    assert work.largest <= 2 * B * H * D * (start + n), work.largest


def _window(n: int, start: int, window: int):
    halo = min(window, start)
    q, k, v = randn(B, n, H, D), randn(B, halo + n, H, D, seed=1), randn(B, halo + n, H, D, seed=2)
    return count(window_attention_at, q, k, v, start, window=window, rope_theta=10000.0, impl="reference").macs


def test_a_decoded_windowed_query_costs_the_window():
    assert _window(1, 4096, 128) <= LINEAR * _window(1, 4096, 32)  # was 16x: (w + 1)^2 padded
    assert _window(1, 4 * 4096, 32) <= FLAT * _window(1, 4096, 32)  # the context does not matter
    assert _window(1, 4096, 128) <= B * H * 129 * 2 * D


def test_a_windowed_query_block_costs_its_rows():
    """A FreeSolo cache's query block (8 queries, window 32)."""
    assert _window(8, 4096, 32) <= B * H * 8 * 40 * 2 * D


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_a_whole_sequence_window_is_linear_in_its_length(impl):
    """Training's window (the reference, and on the CPU `impl="auto"`'s fused form): chunks of queries
    over two chunks of keys, so each query costs a bounded band, whatever N is."""
    from fsframework.ops.local_attention import sliding_window_attention

    def work(n):
        q, k, v = randn(B, n, H, D), randn(B, n, H, D, seed=1), randn(B, n, H, D, seed=2)
        return count(sliding_window_attention, q, k, v, window=128, impl=impl)

    small, large = work(1024), work(4096)
    assert 0 < large.macs <= LINEAR * small.macs, (small.macs, large.macs)
    assert 0 < large.written <= LINEAR * small.written, (small.written, large.written)
    assert large.macs <= B * H * 4096 * 2 * 256 * 2 * D  # at most two chunks of keys per query
    assert large.largest < 4096 * 4096 // 4, large.largest  # no N x N score or mask


S, BLOCK, K, P, W = 4, 16, 2, 4, 2


def _qk(n: int):
    return randn(B, n, H, D), randn(B, n, H, D, seed=1)


def _route(variant: str, n: int) -> WorkCounter:
    q, k = _qk(n)
    return count(select_cells, q, k, *fs_pair(variant=variant, cell_size=S, block_size=BLOCK, top_k=K, recent_cells=W,
                                              retained_cells=P, impl="reference"))


@pytest.mark.parametrize("n", [512])
def test_fs_routing_is_quadratic_over_the_cell_size(n):
    small, large = _route("fs", n).macs, _route("fs", 4 * n).macs
    assert large <= 17 * small, (small, large)
    assert large <= (4 * n) ** 2 // (2 * S) * H * D  # every query scores every eligible cell once


@pytest.mark.parametrize("n", [512])
def test_fsl_routing_is_linear(n):
    small, large = _route("fsl", n), _route("fsl", 4 * n)
    assert large.macs <= LINEAR * small.macs, (small.macs, large.macs)
    assert large.written <= LINEAR * small.written, (small.written, large.written)
    assert large.macs <= 4 * n * (P + W) * H * D  # every query scores at most P + W cells


@pytest.mark.parametrize("n", [512])
def test_the_readout_is_linear(n):
    def readout(size):
        q, k = _qk(size)
        config = fs_config("fs", cell_size=S, block_size=BLOCK, top_k=K, impl="reference")
        cells = select_cells(q, k, config, fs_prior())
        return count(cell_readout, q, k, randn(B, size, H, D, seed=2), cells, config)

    small, large = readout(n), readout(4 * n)
    assert large.macs <= LINEAR * small.macs, (small.macs, large.macs)
    assert large.written <= LINEAR * small.written, (small.written, large.written)
    assert large.macs <= 4 * n * K * S * H * 2 * D  # q.k and p.v over the K s selected tokens


def _fsb(n: int) -> WorkCounter:
    q, k = _qk(n)
    return count(select_cells, q, k, *fs_pair(variant="fsb", tau=torch.zeros(H), cell_size=S, block_size=BLOCK,
                                              top_k=K, beam_width=K))


def test_fsb_routing_is_n_log_n():
    """docs/freesolo.md §1.8: a query's search reads `O(Wb log M)` nodes, its rescoring a bounded
    union of cells, and the forests cost `O(M log^2 M)` to grow: at most `4 (log 4M / log M)^2`
    for 4x the length, where FS's exact routing grows 16x."""
    n = 256
    cells = n // S
    small, large = _fsb(n), _fsb(4 * n)
    bound = 4 * (math.log2(4 * cells) / math.log2(cells)) ** 2
    assert large.macs <= bound * small.macs, (small.macs, large.macs)
    assert large.written <= bound * small.written, (small.written, large.written)


def test_an_fsb_search_step_and_rescoring_do_no_pass_over_the_nodes_or_cells():
    """A search step scores the nodes it is given and the rescoring the candidates it is given: the
    same elements written (tests/work.py) against a node store, or over cells, 4x as many. A mask over
    the whole store at every step once made whole-sequence FS-B routing grow with N^2 / Bq."""
    from fsframework.ops.fsb_search import _node_dots, rescore

    groups, num_q, width, dim, s = 2, 8, 6, 4, 4
    nodes = torch.randint(-1, 40, (groups, num_q, width), generator=torch.Generator().manual_seed(0))
    nodes[:, :, :2] = nodes[:, :1, :2]  # shared nodes: the distinct-nodes matmul path
    q = randn(groups, num_q, dim)

    def step(capacity: int) -> tuple[int, torch.Tensor]:
        mu = randn(groups, 4096, dim, seed=1)[:, :capacity].contiguous()  # the same nodes 0..39
        with torch.no_grad(), WorkCounter() as work:
            dots = _node_dots(mu, q, nodes)
        return work.written, dots

    def rescoring(cells: int) -> tuple[int, torch.Tensor]:
        keys, a = randn(groups, cells, s, dim, seed=2), randn(groups, cells, seed=3).abs()
        with torch.no_grad(), WorkCounter() as work:
            top = rescore(q, keys, a, torch.arange(num_q, dtype=torch.float32) + 200, nodes,
                          fs_config(cell_size=s, top_k=2), fs_prior(lam=torch.ones(groups), sigma=torch.ones(groups)))
        return work.written, top

    (short, dots0), (small, dots), (large, dots4) = step(64), step(1024), step(4096)
    assert 0 < short <= large == small, (short, small, large)  # a short store may be masked: no more work
    assert torch.equal(dots, dots4) and torch.equal(dots0, dots4)
    (short, _), (small, top), (large, top4) = rescoring(64), rescoring(1024), rescoring(4096)
    assert 0 < short <= large == small, (short, small, large)


@pytest.mark.parametrize("pad", [9, 1000])  # a mask over the values' range, a sort of the entries
def test_union_lists_each_rows_distinct_values_and_where_each_entry_is(pad):
    from fsframework.ops.fsb_search import _union

    cand = torch.tensor([[5, 3, 8, 3, 8, 8], [2, 8, 2, 8, 8, 8]])
    cand[1, 3:] = pad  # pads
    union, slot = _union(cand, pad)
    assert union.tolist() == [[3, 5, 8], [2, 8, pad]]  # `pad` pads the narrower row
    valid = cand < pad
    assert torch.equal(union.gather(1, slot)[valid], cand[valid])
    assert bool(((slot >= 0) & (slot < 3)).all())
