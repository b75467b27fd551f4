"""Document masking under sequence parallelism (fsframework/parallel/documents.py), in one process.

Three ranks run in threads with the real per-rank code (`SequenceParallelDocuments`, every layer's
continuation path) and a transport that hands messages through shared memory where the real one sends
them point to point (the ranks meet at a barrier at every exchange, forward and backward). For every
kind and both layouts the ranks' logits and the gradients of their summed losses equal the one-process
masked forward's, on rows whose documents cross the runs' boundaries mid-block, one of them spanning
every run.
"""

from __future__ import annotations

import threading

import pytest
import torch

from fsframework.config import ParallelConfig
from fsframework.config.kinds import KIND_NAMES, kind_facts
from fsframework.models.documents import Documents
from fsframework.parallel.batch import shard_batch
from fsframework.parallel.documents import (SequenceParallelDocuments, continued_runs, plan_earlier,
                                            rank_documents)
from fsframework.parallel.groups import ParallelGroups
from fsframework.parallel.parallelize import parallelize, sp_context
from fsframework.models.documents import document_positions
from fsframework.parallel.sharding import document_runs, layout_runs, shard_runs
from tests.utils import tiny_model

VOCAB = 64
LENGTH = 60  # blocks of 8
# contiguous: three ranks hold [0, 24), [24, 48), [48, 60); zigzag: [0, 16) + [56, 60), [16, 32) + [48, 56),
# [32, 40) + [40, 48) (the last rank's runs meet: its late run continues its early run's documents)
RUNS = {layout: layout_runs(LENGTH, 3, 8, layout) for layout in ("contiguous", "zigzag")}
# row 0: a document over the first boundary at its position 19 and one over the second at 3; row 1: one
# document over both (positions 21 and 45 at the boundaries, more than the window of 16); row 2: documents
# that start at both contiguous boundaries (nothing continued there)
LAYOUT = [[5, 40, 15], [3, 57], [24, 24, 12]]


def packed_batch():
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (len(LAYOUT), LENGTH))
    doc_ids = torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in LAYOUT])
    return tokens, doc_ids


# what the zigzag layout deals these rows (`document_runs`): [0, 32), [40, 48) + [56, 60), [32, 40) + [48, 56),
# a late run of rank 1 continuing a document from its own early run and from rank 2
RUNS["documents"] = document_runs(document_positions(packed_batch()[1]), 3, 8)


class SimulatedRanks:
    """The model's sequence parallelism for ranks run in threads of this process: `sp` is the rank; every
    exchange is a barrier at which each rank leaves its messages and then takes those sent to it."""

    context = None

    def __init__(self, all_runs: list[list[tuple[int, int]]]):
        self.all_runs = all_runs
        self.barrier = threading.Barrier(len(all_runs), timeout=60)
        self.mail: dict[tuple[int, int, int], torch.Tensor] = {}
        self.calls = [0] * len(all_runs)  # exchanges each rank took part in, forward and backward
        self.received = [0] * len(all_runs)  # positions each rank received in forward
        self.widths: set[int] = set()

    def sequence(self, sp, model_name):
        return sp

    def document_rows(self, rank: int, doc_ids: torch.Tensor, device=None) -> SequenceParallelDocuments:
        rows = SequenceParallelDocuments(doc_ids, self.all_runs, rank, lambda out, into: self.move(rank, out, into),
                                         device, block_size=8)
        self.widths.add(rows.width)
        return rows

    def move(self, rank: int, outgoing: list, incoming: list) -> None:
        call = self.calls[rank]
        self.calls[rank] += 1
        for peer, message in outgoing:
            self.mail[call, rank, peer] = message.detach().clone()
        self.barrier.wait()
        for peer, buffer in incoming:
            buffer.copy_(self.mail[call, peer, rank])
            if torch.is_grad_enabled():
                self.received[rank] += buffer.shape[0]

    def run(self, work) -> list:
        """`work(rank)` on every rank at once, each in a thread; their results in rank order."""
        results: list = [None] * len(self.all_runs)
        errors: list[BaseException] = []

        def one(rank):
            try:
                results[rank] = work(rank)
            except BaseException as error:  # noqa: BLE001 - re-raised below
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(len(self.all_runs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def test_a_ranks_documents_and_its_continued_runs():
    _, doc_ids = packed_batch()
    documents = rank_documents(doc_ids, RUNS["contiguous"], 1)
    assert [(row, start, index.numel()) for row, index, start in documents.continuations] == [(0, 19, 21), (1, 21, 24)]
    assert documents.positions[0].tolist() == list(range(19, 40)) + [0, 1, 2]
    assert documents.positions[2].tolist() == list(range(24))
    with pytest.raises(ValueError, match="map needs continue_piece"):
        documents.map(lambda rows: rows, torch.zeros(3, 24))
    assert not Documents(doc_ids).continuations  # whole rows begin their documents
    # zigzag, the last rank: [32, 40) + [40, 48), the late run a piece of its own even where the ids run on
    documents = rank_documents(doc_ids, RUNS["zigzag"], 2)
    assert [(row, start, index.tolist()) for row, index, start in documents.continuations] == [
        (0, 27, list(range(8))), (0, 35, list(range(8, 13))), (1, 29, list(range(16, 24))),
        (1, 37, list(range(24, 32))), (2, 8, list(range(32, 40))), (2, 16, list(range(40, 48)))]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "documents"])
def test_each_rank_receives_exactly_what_its_pieces_read(layout):
    """The plan: a piece reads its document's earlier part (a window its last `w`), split among the
    positions' owners; what a rank sends a peer is what that peer expects from it, and a rank that
    continues nothing receives nothing."""
    _, doc_ids = packed_batch()
    positions = document_positions(doc_ids)
    runs = RUNS[layout]
    for reach in (lambda start: start, lambda start: min(16, start)):
        plans = [plan_earlier(positions, runs, rank, reach) for rank in range(3)]
        for rank, plan in enumerate(plans):
            want = sum(reach(start) for row in continued_runs(positions, runs[rank]) for start in row)
            remote = sum(end - out for _, _, ranges in plan.recvs for out, end, _ in ranges)
            assert plan.size == sum(hi - lo for _, lo, hi, _ in plan.local) + remote == want
            moved = sum(rows for _, rows, _ in plan.recvs)
            # a rank's pieces of one document read its earlier rows once (the dealt runs: rank 2 holds two
            # pieces of row 1's long document, both reading rank 0's [3, 32))
            assert moved < remote if (layout, rank, reach(99)) == ("documents", 2, 99) else moved <= remote
            for peer, segments in plan.sends:
                expected = {p: rows for p, rows, _ in plans[peer].recvs}[rank]
                assert sum(hi - lo for _, lo, hi in segments) == expected
    # each row its own document's earlier part (25, 27 and 6 positions), not the widest part for every row
    assert plan_earlier(positions, [[(0, 30)], [(30, 60)]], 1, lambda s: s).size == 25 + 27 + 6
    first = torch.zeros_like(doc_ids)
    first[:, 30:] = 1  # every document starts at the boundary: nothing to read
    assert plan_earlier(document_positions(first), [[(0, 30)], [(30, 60)]], 1, lambda s: s).size == 0


# every kind in the contiguous layout; the kinds that take zigzag (work growing with position) also in the
# runs zigzag deals packed rows (SWA, FS-L and AR-GRC keep contiguous slices)
LAYOUTS_OF_KINDS = [(name, "contiguous") for name in KIND_NAMES] + [
    (name, "documents") for name in KIND_NAMES if kind_facts(name).keys == "prefix"]


@pytest.mark.parametrize("name, layout", LAYOUTS_OF_KINDS)
def test_ranks_reading_continued_documents_equal_one_process(name, layout):
    model = tiny_model(name, VOCAB).float()
    tokens, doc_ids = packed_batch()
    probe = torch.randn(*tokens.shape, VOCAB) / tokens.numel()**0.5
    trains = name != "fsb"  # FS-B is inference only: no gradients to compare

    def grads():
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return got

    with torch.set_grad_enabled(trains):
        whole = model(tokens, doc_ids=doc_ids)
    if trains:
        (whole * probe).sum().backward()
    want = grads()
    ranks = SimulatedRanks(RUNS[layout])
    model.parallelism = ranks

    def rank_step(rank):
        own = RUNS[layout][rank]
        with torch.set_grad_enabled(trains):
            logits = model(shard_runs(tokens, own), sp=rank, doc_ids=doc_ids)
        if trains:
            (logits * shard_runs(probe, own)).sum().backward()  # each rank's backward meets the others'
        return logits.detach()

    parts = ranks.run(rank_step)
    for rank, logits in enumerate(parts):
        torch.testing.assert_close(logits, shard_runs(whole, RUNS[layout][rank]), rtol=0, atol=1e-5)
    # every layer call of every rank exchanged (the same calls on every rank)
    assert len(set(ranks.calls)) == 1 and ranks.calls[0]
    assert ranks.widths == {45 if layout == "contiguous" else 53}
    assert ranks.all_runs == [[(0, 24)], [(24, 48)], [(48, 60)]] if layout == "contiguous" else [
        [(0, 32)], [(40, 48), (56, 60)], [(32, 40), (48, 56)]]
    if trains:
        got = grads()
        assert got.keys() == want.keys() and got
        for key in got:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["argrc", "fs", "tfpp"])
def test_a_rank_whose_rows_all_continue_documents(name):
    """Every row one document over every boundary: the later ranks hold continuation pieces only (no
    document of their own for a one-call form to read), and still equal one process."""
    model = tiny_model(name, VOCAB).float()
    tokens, _ = packed_batch()
    doc_ids = torch.zeros_like(tokens)
    doc_ids[0, 50:] = 1  # a short document at the end of one row: not every rank is continuations only
    runs = RUNS["contiguous"]
    with torch.no_grad():
        whole = model(tokens, doc_ids=doc_ids)
        model.parallelism = ranks = SimulatedRanks(runs)
        parts = ranks.run(lambda r: model(shard_runs(tokens, runs[r]), sp=r, doc_ids=doc_ids))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-5)


def test_masked_ranks_keep_their_layout_and_the_whole_rows_documents():
    """Masking no longer forces the contiguous layout: a kind whose work grows with position keeps zigzag."""
    groups = ParallelGroups(rank=1, world_size=3, sp=3, sp_group=None, dp_group=None)
    tokens, doc_ids = packed_batch()
    masked = parallelize(tiny_model("tfpp", VOCAB), ParallelConfig(sp=3, sp_layout="zigzag"), groups)
    assert sp_context(masked).layout == "zigzag"
    mine = shard_batch(sp_context(masked), tokens, tokens, doc_ids=doc_ids)
    assert mine.sp.all_runs == RUNS["documents"]  # dealt by the documents' work
    assert torch.equal(mine.inputs, shard_runs(tokens, RUNS["documents"][1])) and mine.doc_ids is doc_ids
    window = parallelize(tiny_model("swa", VOCAB), ParallelConfig(sp=3, sp_layout="zigzag"), groups)
    assert sp_context(window).layout == "contiguous"  # bounded work per query: balanced already


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "documents"])
def test_argrc_pieces_receive_roots_that_tile_their_documents_earlier_part(layout):
    """AR-GRC's continued pieces read roots, not leaves (`plan_roots`): each piece's blocks tile its
    document's `[0, o)` left to right (aligned blocks, halved where they cross a rank's boundary), what a
    rank sends a peer is what the peer expects from it, and a document over whole power-of-two slices moves
    one root per row, as the unmasked scan does."""
    from fsframework.parallel.document_roots import plan_roots

    _, doc_ids = packed_batch()
    positions = document_positions(doc_ids)
    runs = RUNS[layout]
    plans = [plan_roots(positions, runs, rank) for rank in range(3)]
    for rank, plan in enumerate(plans):
        starts = [start for row in continued_runs(positions, runs[rank]) for start in row if start]
        assert len(plan.pieces) == len(starts)
        for blocks, start in zip(plan.pieces, starts):
            spans = [block for block, _ in blocks]
            assert spans[0][0] == 0 and sum(size for _, size in spans) == start
            assert all(a[0] + a[1] == b[0] and a[0] % a[1] == 0 for a, b in zip(spans, spans[1:]))
        for peer, indices in plan.sends:
            assert dict(plans[peer].recvs)[rank] == len(indices)
    whole = plan_roots(document_positions(torch.zeros(3, 64, dtype=torch.long)), [[(0, 32)], [(32, 64)]], 1)
    assert whole.recvs == ((0, 3),) and [len(blocks) for blocks in whole.pieces] == [1, 1, 1]


def test_fsl_pieces_receive_the_region_and_each_ranks_top_cells_only():
    """FS-L's continued pieces (`plan_retained`): the inputs of the region before the piece (recent cells,
    window, the first block's part before it) and of cells a boundary cuts; every other earlier cell is held
    whole by one rank, whose best `P` per head the piece's holders and reader merge to the document's top
    `P`, so what a piece receives does not grow with its document."""
    from fsframework.models.context import RetainedCells
    from fsframework.parallel.document_retained import plan_retained

    span = RetainedCells(cell_size=4, recent_cells=2, retained_cells=3, window=16)
    n = 512
    doc_ids = torch.zeros(1, n, dtype=torch.long)
    doc_ids[0, :5] = 1  # the long document starts at 5: its cells straddle the ranks' boundaries
    positions = document_positions(doc_ids)
    runs = layout_runs(n, 4, 8, "contiguous")
    plan = plan_retained(positions, runs, 3, span, 8)
    (piece,) = plan.own
    start = 384 - 5
    region = min(start // 8 * 8 - 2 * 4, start - 16) // 4 * 4  # the recent cells before its block, its window
    assert piece.reads[-1] == (region, start)
    assert piece.reads[:-1] == ((120, 124), (248, 252))  # the cells rows 128 and 256 cut (document start 5)
    assert [rank for rank, _ in piece.candidates] == [0, 1, 2]
    held = sum(len(cells) for _, cells in piece.candidates)
    assert held + len(piece.reads) - 1 == region // 4  # every earlier cell is a candidate or read whole
    # rank 1 reads its own piece (rank 0 holds its cells) and holds cells of rank 2's and rank 3's: it takes
    # part in the three merges
    holder = plan_retained(positions, runs, 1, span, 8)
    assert [(piece.dst, piece.holders()) for piece in holder.pieces] == [(1, [0]), (2, [0, 1]), (3, [0, 1, 2])]


def test_fs_pieces_read_their_region_and_route_from_the_holders_summaries():
    """FS's continued pieces (`plan_selected`): the inputs of the window and the first block's part before
    the piece, and of the cells a boundary cuts; every other earlier cell lies whole on a holder, which
    sends its summaries (and, on request, the cells routing selected)."""
    from types import SimpleNamespace

    from fsframework.parallel.document_selected import plan_selected

    cfg = SimpleNamespace(cell_size=4, block_size=8, window=16)  # the settings the plan reads
    doc_ids = torch.zeros(1, 512, dtype=torch.long)
    doc_ids[0, :5] = 1  # the long document starts at 5: its cells straddle the ranks' boundaries
    plan = plan_selected(document_positions(doc_ids), layout_runs(512, 4, 8, "contiguous"), 3, cfg)
    (piece,) = plan.own
    start = 384 - 5
    assert piece.reads == ((120, 124), (248, 252), (min(start // 8 * 8, start - 16) // 4 * 4, start))
    assert [rank for rank, _ in piece.candidates] == [0, 1, 2]
    assert sum(len(cells) for _, cells in piece.candidates) + 2 == piece.reads[-1][0] // 4


@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_freesolo_pieces_hold_the_cells_they_read_not_their_documents_prefix(name, monkeypatch):
    """A continued FS or FS-L piece's keys are compact (`compact_piece`): per head the earlier cells its
    queries selected, then its region (window, first block, FS-L's recent cells), at most `K` cells a query
    block plus the region however long its document's earlier part; and the logits are still one process's."""
    from fsframework.models import context

    n, sp, window, block, cell, top_k = 256, 4, 16, 8, 4, 2  # tiny_model's sizes
    recent = 2 if name == "fsl" else 0
    model = tiny_model(name, VOCAB).float()
    tokens = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(3))
    doc_ids = torch.zeros_like(tokens)
    doc_ids[0, :5] = 1  # the long document starts at 5: its cells straddle the ranks' boundaries
    held = []
    original = context.ContinuedDocument.__init__

    def recording(self, start, k, v, cells=None):
        held.append((start, k.shape[1], k.shape[0], cells is not None))
        original(self, start, k, v, cells)

    monkeypatch.setattr(context.ContinuedDocument, "__init__", recording)
    runs = layout_runs(n, sp, block, "contiguous")
    with torch.no_grad():
        whole = model(tokens, doc_ids=doc_ids)
        model.parallelism = ranks = SimulatedRanks(runs)
        parts = ranks.run(lambda r: model(shard_runs(tokens, runs[r]), sp=r, doc_ids=doc_ids))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-5)
    assert len(held) == 2 * (sp - 1)  # a piece per later rank and layer
    for start, length, rows, routed in held:
        region = max(0, min(start // block * block - recent * cell, start - window)) // cell * cell
        blocks = -(-(start % block + n // sp) // block)  # the piece's query blocks, the first front-padded
        assert routed and rows == 1
        assert length <= top_k * blocks * cell + start - region, (start, length)
    assert max(start - length for start, length, _, _ in held) > n // 4  # the last pieces hold far less than o


@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_token_scored_routing_stays_exact_on_continued_pieces(name):
    """`model.attention.route_score=tokens` reads the cells' token keys, which no summary holds: FS's pieces
    then read their earlier inputs and FS-L's a zero prefix holding its whole cells, both routed by the op,
    and the ranks still equal one process."""
    model = tiny_model(name, VOCAB, route_score="tokens").float()
    tokens, doc_ids = packed_batch()
    runs = RUNS["documents"]
    with torch.no_grad():
        whole = model(tokens, doc_ids=doc_ids)
        model.parallelism = ranks = SimulatedRanks(runs)
        parts = ranks.run(lambda r: model(shard_runs(tokens, runs[r]), sp=r, doc_ids=doc_ids))
    for rank, logits in enumerate(parts):
        torch.testing.assert_close(logits, shard_runs(whole, runs[rank]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["tfpp", "fs"])
def test_a_rank_with_continued_pieces_reads_its_other_documents_in_one_call(name, monkeypatch):
    """A rank whose part continues documents still reads every document that starts on it in one call of
    its kind's one-call form (laid end to end: `Documents.plain_documents`), the continued pieces each in
    the offset form, not one call per distinct document length."""
    from fsframework.models.attention import QKVAttention

    calls = {"packed": 0, "run": 0}
    for method, key in (("forward_packed_rows", "packed"), ("forward_run", "run")):
        for cls in {QKVAttention, *QKVAttention.__subclasses__(), type(tiny_model(name, VOCAB).layers[0].attn)}:
            if method in vars(cls):
                original = vars(cls)[method]

                def counted(self, *args, _original=original, _key=key, **kwargs):
                    calls[_key] += 1
                    return _original(self, *args, **kwargs)

                monkeypatch.setattr(cls, method, counted)
    model = tiny_model(name, VOCAB).float()
    tokens, _ = packed_batch()
    sizes = [[5, 40, 3, 4, 2, 6], [3, 7, 1, 2, 30, 17], [20, 5, 6, 7, 6, 16]]  # distinct lengths in every part
    doc_ids = torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in sizes])
    runs = RUNS["contiguous"]
    with torch.no_grad():
        whole = model(tokens, doc_ids=doc_ids)
        calls.update(packed=0, run=0)
        model.parallelism = ranks = SimulatedRanks(runs)
        parts = ranks.run(lambda r: model(shard_runs(tokens, runs[r]), sp=r, doc_ids=doc_ids))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-5)
    continued = sum(len(rank_documents(doc_ids, runs, r).continuations) for r in range(3))
    assert continued == 5  # every row over the first boundary, rows 1 and 2 over the second
    layers = len(model.layers)
    assert calls == {"packed": 3 * layers, "run": continued * layers}
