"""Sequence-parallel measurements on CPU ranks (gloo): activation memory, bytes per layer, wall time.

    python tools/bench_sp.py                      # the memory, bytes, work and time tables
    python tools/bench_sp.py --only bytes --kinds fsl fs tfpp --n 8192 32768 131072 --sp 2 4 8 \
        [--layout zigzag] [--json OUT]            # bytes per layer, before (all-gather) and after
    python tools/bench_sp.py --only work --n 32768 --sp 2 4 8   # per-rank causal work, contiguous vs zigzag
    python tools/bench_sp.py --only bytes work --documents none one mix   # and with document masking
    python tools/bench_sp.py --only bytes --kinds fsl fs tfpp swa argrc --n 512 --sp 2 --documents none one \
        --batch 2 --heads 2 --head-dim 16 --attention window=16 cell_size=4 block_size=8 top_k=2 \
        recent_cells=2 retained_cells=3          # docs/training.md's masking table: B=2, D=32, the tests'
                                                 # tiny attention shapes
    python tools/bench_sp.py --only recompute --kind fs   # activation checkpointing on/off, N=4k and 16k
                                                          # (or the --n given)
    python tools/bench_sp.py --only memory time recompute --kind fs --n 4096 --sp 2   # several tables: the
                                                          # ones that run the model share its runs

Prints, per rank:
1. activation memory: bytes of the tensors autograd saves for the backward pass
   (unique storages, counted by a saved-tensors hook), and the process peak RSS,
   for sp = 1, 2, 4 (1 and `--sp`) at a fixed N: activations should fall roughly as 1/sp;
2. bytes received per layer per training step (forward + backward) and the bytes of
   other ranks' keys and values a rank holds for its attention (the gathered-key
   memory: every storage the fetch leaves alive for the backward, less the own keys and
   values; under zigzag both runs'), per rank maxima, for each kind, N and sp (and the forward
   pass's bytes alone, and how evenly the ranks receive: the maximum over the mean): counted
   by `CommCounter` on the
   real collectives of the kind's `KeySource` (one layer, random keys, B = 1, H = 4, d = 32,
   fp32, the default attention config; `--batch`, `--heads`, `--head-dim`, `--attention KEY=VALUE`
   change them), "before" = today's all-gather of the whole prefix for every prefix kind,
   "after" = the kind's own fetch under `--layout` (AR-GRC, which has no keys, is left out);
   `--json OUT` writes them as a list of records, each with its `documents` (here `none`);
2b. (--documents one / mix) bytes received per layer in forward with document masking
   (docs/training.md, "Documents"; `fsframework.parallel.documents`), per rank maxima, beside the
   unmasked figure (the kind's own fetch in the same layout: `--layout` for the kinds that read the
   whole prefix) and their ratio: masked, a rank receives the layer's input (D = H d numbers a position)
   at the positions each of its runs' continued pieces reads before it (its document's earlier part; a
   window kind at most its window), `earlier_tokens` by `gather_earlier` on the real collectives; W is
   the longest earlier part a piece reads. `one`: every row one document
   (doc_ids all zero, the long-document case); `mix`: each row packs documents of exponential
   lengths with mean N/8 (seeded, the same on every rank), the last cut to fill the row. AR-GRC is
   counted per forward (no layers): its model's block roots unmasked, the roots of its continued
   documents' earlier blocks masked;
5. (--only work) per-rank work of the layouts: causal score elements (TF++, ALiBi,
   sinusoidal, rewired) and FS routing scores (query x eligible cell) counted over the
   runs each rank holds, max / mean across ranks; with --documents one / mix also masked, in
   both layouts (masked zigzag: the chunks `document_runs` deals by the documents' work, as training
   does): a query at position p of its document reads p + 1 keys, and its query block,
   laid out from the document's start, scores the document's cells complete before it (`one` is the
   unmasked contiguous row; `mix` is drawn for `--batch` rows as table 2b draws it);
3. the wall time of one forward + backward at sp = 2 against sp = 1;
4. (--only recompute) activation memory per rank with `train.activation_checkpointing` off and
   on, at N = 4096 and 16384 (or `--n`), sp = 1 and 2. With it on, the count adds the inputs that the
   checkpointed blocks keep for their recomputation (a forward pre-hook on each block).
A benchmark measures and prints; the assertions live in tests/parallel.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from launch_ranks import launch as launch_script


def launch(world: int, spec: dict) -> list[dict]:
    """`world` worker ranks of this script (`worker` or `keys_worker` by the spec's mode)."""
    return launch_script(world, spec, __file__)


def worker(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    from fsframework.config import AttentionConfig, ModelConfig, ParallelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.batch import shard_batch
    from fsframework.parallel.parallelize import parallelize, sp_context

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sp = dist.get_world_size()
    att = AttentionConfig(window=spec.get("window", 512), block_size=128, cell_size=32, impl="reference")
    cfg = ModelConfig(name=spec["kind"], vocab_size=256, d_model=spec["d_model"], n_layers=spec["layers"],
                      n_heads=spec["heads"], attention=att)
    torch.manual_seed(0)
    model = build_model(cfg)
    blocks = []
    if spec.get("recompute"):
        from fsframework.models.recompute import enable_activation_checkpointing

        enable_activation_checkpointing(model)
        blocks = model.recomputed_blocks()  # what is recomputed
    model = parallelize(model, ParallelConfig(sp=sp))
    tokens = torch.randint(0, 256, (1, spec["n"] + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        mine = shard_batch(sp_context(model), inputs, targets)
        mine.losses(mine.logits(model))[0].backward()

    saved: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):  # activations only: parameters saved for backward are not per-token memory
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    def keep_inputs(module, args):  # a checkpointed block keeps its tensor inputs until backward
        for t in args:
            if isinstance(t, torch.Tensor):
                pack(t)

    hooks = [block.register_forward_pre_hook(keep_inputs) for block in blocks]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with CommCounter.counting() as counted:
            step()
    for hook in hooks:
        hook.remove()
    times, cpu = [], []
    for _ in range(spec.get("repeats", 2)):
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(json.dumps({"rank": dist.get_rank(), "saved_mb": sum(saved.values()) / 2**20,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "bytes": dict(counted), "time_s": min(times, default=0.0),
                      "cpu_s": min(cpu, default=0.0),
                      "runs": sp_context(model).at_length(spec["n"]).runs if sp > 1 else [(0, spec["n"])]}))
    dist.destroy_process_group()


class ModelRuns:
    """The model workers' ranks (d_model 256, 4 layers, 4 heads), launched once per (sp, kind, N, recompute)
    and shared by the tables that read them: the memory and time tables read the same runs (the saved
    tensors are counted in the first step, the times are those of the `repeats` steps after it), the
    recompute table's "off" column too."""

    def __init__(self, repeats: int):
        self.repeats, self.done = repeats, {}

    def ranks(self, sp: int, kind: str, n: int, recompute: bool = False) -> list[dict]:
        key = (sp, kind, n, recompute)
        if key not in self.done:
            self.done[key] = launch(sp, {"kind": kind, "n": n, "d_model": 256, "layers": 4, "heads": 4,
                                         "repeats": self.repeats, "recompute": recompute})
        return self.done[key]


def memory_table(runs: ModelRuns, kind: str, n: int, sps: list[int]) -> None:
    print(f"\n1. activation memory per rank, {kind}, N={n}, d_model 256, 4 layers, 4 heads, fp32")
    print(f"{'sp':>3} {'rank':>4} {'slice':>13} {'saved MB':>9} {'peak RSS MB':>11}")
    for sp in sps:
        for r in runs.ranks(sp, kind, n):
            slices = "+".join(f"[{s},{e})" for s, e in r["runs"])  # zigzag: two runs per rank
            print(f"{sp:>3} {r['rank']:>4} {slices:>13} {r['saved_mb']:>9.1f} {r['rss_mb']:>11.0f}")


def keys_worker(spec: dict) -> None:
    """One rank of the bytes tables: every (kind, N) of `spec`, one layer's fetch forward + backward.

    Schemes: `before` (the all-gather of the prefix) and `after` (the kind's own fetch under `--layout`) for
    the unmasked table (documents `none`); `unmasked` (the kind's own fetch in the layout masking takes too)
    and `masked` (the layer's input at the positions the continued pieces read, `earlier_tokens` of
    `fsframework.parallel.documents`) for each masked documents value, in the kind's layout. A kind that is a language model of its
    own (AR-GRC: no attention, no keys) is counted on its model's forward + backward instead (`model_counts`)."""
    import torch
    import torch.distributed as dist

    from fsframework.config import AttentionConfig
    from fsframework.models.registry import attention_kind
    from fsframework.parallel.attention import SequenceParallelKeys, ZigzagKeys, gather_kv
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.context import SPContext
    from fsframework.parallel.documents import document_rows
    from fsframework.parallel.groups import init_groups
    from fsframework.parallel.sharding import shard_runs

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    groups = init_groups(dist.get_world_size())
    att = AttentionConfig(**spec.get("attention", {}))
    batch, heads, head_dim = spec.get("batch", 1), spec.get("heads", 4), spec.get("head_dim", 32)
    documents = spec.get("documents", ["none"])
    masked_documents = [d for d in documents if d != "none"]
    records = []
    for kind in spec["kinds"]:
        entry = attention_kind(kind)
        for n in spec["n"]:
            if entry.language_model is not None:  # no keys: its own sequence-parallel form, per forward
                records += model_counts(kind, n, masked_documents, groups, att, batch, heads, head_dim)
                continue
            schemes = (["before", "after"] if "none" in documents else []) + (["unmasked"] if masked_documents else [])
            kind_layout = spec["layout"] if entry.keys == "prefix" else "contiguous"  # zigzag: prefix kinds only
            for scheme in schemes:
                layout = kind_layout if scheme in ("after", "unmasked") else "contiguous"
                sp = SPContext(groups=groups, block_size=att.block_size, layout=layout).at_length(n)
                gen = torch.Generator().manual_seed(n)
                q, k, v = (shard_runs(torch.randn(batch, n, heads, head_dim, generator=gen), sp.runs)
                           .requires_grad_(True) for _ in range(3))
                # a FreeSolo layer routes through its source (FS: from the gathered summaries)
                router = routing_layer(kind, att, heads, head_dim) if entry.freesolo else None
                with CommCounter.counting() as counted:
                    if scheme == "before":
                        fetched = [gather_kv(k, v, sp)]
                    else:
                        lengths = [e - s for s, e in sp.runs]
                        views = ZigzagKeys(sp).views() if layout == "zigzag" else [SequenceParallelKeys(sp)]
                        span = entry.key_span(att)
                        # a FreeSolo layer's fetch: the keys and values its op reads (FS: the selected
                        # cells and the halo; FS-L: its retained cells), the op's state (PrefixKeys) left out
                        fetched = [view.freesolo_state(0, qp, kp, vp, span, router)[:2] if router else
                                   view.keys(0, kp, vp, span)
                                   for view, qp, kp, vp in zip(views, *(x.split(lengths, 1) for x in (q, k, v)))]
                    forward = sum(counted.values())
                    sum(kk.sum() + vv.sum() for kk, vv in fetched).backward()
                own = 2 * k.numel() * k.element_size()
                # every distinct storage the fetches leave alive (k and v share one where the fetch splits
                # one tensor, SWA's halo concatenates them apart; zigzag: one per run, both kept for the
                # backward), less the own keys and values among them
                held = sum({x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()
                            for pair in fetched for x in pair}.values())
                records.append({"kind": kind, "n": n, "scheme": scheme, "layout": layout, "documents": "none",
                                "bytes": sum(counted.values()), "forward": forward, "held": held - own})
                del fetched, k, v
            for docs in masked_documents:
                # masking: the layer's input [B, n, D] at the positions the continued pieces read (a window
                # kind: at most its window; FS-L: the region before the piece, its retained cells' keys and
                # values), by the exchanges every rank takes part in
                ids = document_ids(docs, batch, n)  # zigzag: the runs dealt by the documents' work, as shard_batch
                sp = SPContext(groups=groups, block_size=att.block_size, layout=kind_layout).at_documents(ids)
                rows = document_rows(sp, ids)
                gen = torch.Generator().manual_seed(n)
                x = shard_runs(torch.randn(batch, n, heads * head_dim, generator=gen), sp.runs).requires_grad_(True)
                layer = routing_layer(kind, att, heads, head_dim) if entry.freesolo else None
                project = layer.project if layer else lambda t, start: (t, t, t)  # what the exchange moves is the count
                with CommCounter.counting() as counted:
                    exchanged, keys = rows.continued_keys(x, entry.key_span(att), project, layer)
                    forward = sum(counted.values())
                    sum(t.sum() for t in exchanged + [kv for pair in keys for kv in pair]).backward()
                records.append({"kind": kind, "n": n, "scheme": "masked", "layout": kind_layout, "documents": docs,
                                "bytes": sum(counted.values()), "forward": forward, "width": rows.width})
    print(json.dumps({"rank": dist.get_rank(), "records": records}))
    dist.destroy_process_group()


def model_counts(kind: str, n: int, masked_documents: list[str], groups, att, batch: int, heads: int,
                 head_dim: int) -> list[dict]:
    """The bytes this rank receives per forward (and its backward) of a kind that is a language model of its
    own, with no layers (AR-GRC, d_model = heads x head_dim): unmasked, the model's forward (its block roots,
    docs/argrc.md §6); masked, the model's masked forward (the roots of continued documents' earlier
    blocks, `fsframework.parallel.document_roots`)."""
    import dataclasses

    import torch

    from fsframework.config import ModelConfig, ParallelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.parallelize import parallelize, sp_context
    from fsframework.parallel.sharding import shard_runs

    cfg = ModelConfig(name=kind, vocab_size=256, d_model=heads * head_dim, n_layers=1, n_heads=heads,
                      attention=dataclasses.replace(att, impl="reference"))
    torch.manual_seed(0)
    model = parallelize(build_model(cfg), ParallelConfig(sp=groups.sp), groups)
    sp = sp_context(model).at_length(n)
    tokens = shard_runs(torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(n)), sp.runs)
    with CommCounter.counting() as counted:
        logits = model(tokens, sp=sp)
        forward = sum(counted.values())
        logits.sum().backward()
    records = [{"kind": kind, "n": n, "scheme": "unmasked", "layout": "contiguous", "documents": "none",
                "bytes": sum(counted.values()), "forward": forward, "per": "forward"}]
    for docs in masked_documents:
        ids = document_ids(docs, batch, n)
        rows = model.parallelism.document_rows(sp, ids)
        with CommCounter.counting() as counted:
            logits = model(tokens, sp=sp, doc_ids=ids)  # the continued documents' roots, on every rank
            forward = sum(counted.values())
            logits.sum().backward()
        records.append({"kind": kind, "n": n, "scheme": "masked", "layout": "contiguous", "documents": docs,
                        "bytes": sum(counted.values()), "forward": forward, "width": rows.width, "per": "forward"})
    return records


def routing_layer(kind: str, att, heads: int = 4, head_dim: int = 32):
    """A FreeSolo attention layer of `kind` for `heads` heads of width `head_dim`: what routes for the keys."""
    from fsframework.config import ModelConfig
    from fsframework.models.freesolo_attention import FreeSoloAttention

    return FreeSoloAttention(ModelConfig(name=kind, vocab_size=256, d_model=heads * head_dim, n_heads=heads,
                                         attention=att), 0)


DOCUMENTS = ("none", "one", "mix")


def document_ids(documents: str, rows: int, n: int, seed: int = 0):
    """The rows' doc_ids `[rows, n]` of `--documents`: None for `none` (unmasked rows), zeros for `one` (every
    row one document), and for `mix` documents of exponential lengths with mean n / 8 (at least one token),
    drawn by `random.Random(seed)` row after row, the last of a row cut to fill it. Every rank draws the same."""
    import random

    import torch

    if documents == "none":
        return None
    if documents == "one":
        return torch.zeros(rows, n, dtype=torch.long)
    if documents != "mix":
        raise ValueError(f"--documents {documents!r} is not one of {DOCUMENTS}")
    rng, ids = random.Random(seed), []
    for _ in range(rows):
        row: list[int] = []
        while len(row) < n:  # document d of the row: a run of d's (a document is a run of equal ids)
            length = max(1, round(rng.expovariate(8 / n)))
            row += [row[-1] + 1 if row else 0] * min(length, n - len(row))
        ids.append(row)
    return torch.tensor(ids)


def bytes_table(kinds: list[str], lengths: list[int], sps: list[int], layout: str, documents: list[str] = ("none",),
                shapes: dict | None = None) -> list[dict]:
    """The bytes tables: the unmasked one (documents `none`: before / after) and, for the masked documents
    values, unmasked against masked forward bytes. `shapes`: batch, heads, head_dim and attention overrides."""
    shapes = shapes or {}
    batch, heads, head_dim = shapes.get("batch", 1), shapes.get("heads", 4), shapes.get("head_dim", 32)
    masked = [d for d in documents if d != "none"]
    by_key: dict[tuple, list] = {}
    for sp in sps:
        ranks = launch(sp, {"mode": "keys", "kinds": kinds, "n": lengths, "layout": layout,
                            "documents": list(documents), **shapes})
        for r in ranks:
            for rec in r["records"]:
                by_key.setdefault((rec["kind"], rec["n"], sp, rec["scheme"], rec["documents"]), []).append(
                    {**rec, "rank": r["rank"]})
    out = []
    shape = f"B={batch}, H={heads}, d={head_dim}, fp32"
    if "none" in documents:
        keyless = [kind for kind in kinds if not any(key[0] == kind and key[3] == "before" for key in by_key)]
        print(f"\n2. bytes received per layer per step (fwd + bwd) and gathered-key memory, per rank maxima; "
              f"{shape}, one layer; after = --layout {layout}"
              + (f"; {', '.join(keyless)}: no keys (its own form in table 2b)" if keyless else ""))
        print(f"{'kind':>5} {'N':>7} {'sp':>3} {'layout':>10} {'before MB':>10} {'after MB':>9} {'ratio':>6} "
              f"{'held before MB':>15} {'held after MB':>14} {'after, forward MB':>18} {'after, max/mean':>16}")
        for sp in sps:
            for kind in kinds:
                if kind in keyless:
                    continue
                for n in lengths:
                    before, after = by_key[kind, n, sp, "before", "none"], by_key[kind, n, sp, "after", "none"]
                    b0, b1 = max(r["bytes"] for r in before), max(r["bytes"] for r in after)
                    f0, f1 = max(r["forward"] for r in before), max(r["forward"] for r in after)
                    h0, h1 = max(r["held"] for r in before), max(r["held"] for r in after)
                    mean1 = sum(r["bytes"] for r in after) / len(after)  # how evenly the ranks receive
                    lay = after[0]["layout"]
                    print(f"{kind:>5} {n:>7} {sp:>3} {lay:>10} {b0 / 1e6:>10.2f} {b1 / 1e6:>9.2f} {b0 / b1:>6.1f} "
                          f"{h0 / 1e6:>15.2f} {h1 / 1e6:>14.2f} {f1 / 1e6:>18.2f} {b1 / mean1:>16.3f}")
                    out += [{"kind": kind, "n": n, "sp": sp, "layout": "contiguous", "fetch": "all_gather",
                             "documents": "none", "bytes_received_per_layer": b0,
                             "forward_bytes_received_per_layer": f0, "gathered_key_bytes": h0},
                            {"kind": kind, "n": n, "sp": sp, "layout": lay, "fetch": "kind", "documents": "none",
                             "bytes_received_per_layer": b1, "forward_bytes_received_per_layer": f1,
                             "gathered_key_bytes": h1, "mean_bytes_received_per_layer": mean1}]
    if masked:
        print(f"\n2b. bytes received per layer in forward, unmasked (the kind's own fetch) and with document "
              f"masking (the layer's input at the positions the continued pieces read), per rank maxima "
              f"(rank: the one receiving the most masked); {shape}, one layer (argrc: per forward); "
              "backward sends as much back")
        print(f"{'kind':>5} {'N':>7} {'sp':>3} {'layout':>10} {'docs':>4} {'W':>7} {'unmasked':>11} {'masked':>11} "
              f"{'masked/unmasked':>15} {'rank':>4} {'fwd+bwd unmasked':>16} {'fwd+bwd masked':>14}")
        for sp in sps:
            for kind in kinds:
                for n in lengths:
                    plain = by_key[kind, n, sp, "unmasked", "none"]
                    u, ub = max(r["forward"] for r in plain), max(r["bytes"] for r in plain)
                    for docs in masked:
                        ranks = by_key[kind, n, sp, "masked", docs]
                        top = max(ranks, key=lambda r: (r["forward"], r["rank"]))
                        m, mb = top["forward"], max(r["bytes"] for r in ranks)
                        width = max(r["width"] for r in ranks)
                        ratio = m / u if u else float("inf") if m else 1.0
                        print(f"{kind:>5} {n:>7} {sp:>3} {top['layout']:>10} {docs:>4} {width:>7} {human(u):>11} "
                              f"{human(m):>11} "
                              f"{ratio:>15.3f} {top['rank']:>4} {human(ub):>16} {human(mb):>14}")
                        out.append({"kind": kind, "n": n, "sp": sp, "layout": top["layout"], "fetch": "halo",
                                    "documents": docs, "per": plain[0].get("per", "layer"), "batch": batch,
                                    "halo_width": width, "rank": top["rank"],
                                    "forward_bytes_received_per_layer": m, "bytes_received_per_layer": mb,
                                    "unmasked_forward_bytes_received_per_layer": u,
                                    "unmasked_bytes_received_per_layer": ub,
                                    "masked_over_unmasked": ratio if u else None})
    return out


def human(num_bytes: float) -> str:
    """Bytes in B, KiB or MiB (one decimal)."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def routing_work(runs: list[tuple[int, int]], block: int = 128, cell: int = 32) -> int:
    """FS routing scores of `runs`: every query of a block scores each cell complete before the block."""
    return sum((min(b + block, e) - b) * (b // cell) for s, e in runs for b in range(s, e, block))


def document_work(positions, span: tuple[int, int], block: int = 128, cell: int = 32) -> tuple[int, int]:
    """(causal score elements, FS routing scores) of the queries `[a, b)` of every row read as its documents,
    `positions` `[B, N]` each token's position in its document: a query at position `p` reads `p + 1` keys,
    and its query block, laid out from its document's start, scores the document's `(p // block) * block /
    cell` cells complete before the block (`causal_work` and `routing_work` of one document per row)."""
    p = positions[:, span[0]:span[1]]
    return int((p + 1).sum()), int(((p // block) * (block // cell)).sum())


def max_over_mean(work: list[int]) -> float | None:
    """max / mean of per-rank work (None when no rank has any)."""
    total = sum(work)
    return max(work) / (total / len(work)) if total else None


def work_table(lengths: list[int], sps: list[int], documents: list[str] = ("none",), rows: int = 1,
               block: int = 128, cell: int = 32) -> list[dict]:
    """Per-rank work, unmasked and for each masked documents value, in both layouts, `rows` rows of `mix`
    drawn as the bytes table draws them."""
    from fsframework.models.documents import document_positions
    from fsframework.parallel.sharding import causal_work, document_runs, layout_runs

    masked = [d for d in documents if d != "none"]
    print("\n5. per-rank work, max / mean across ranks: causal score elements and FS routing scores"
          + (f"; masked: documents read apart, {rows} row(s) (mix: exponential lengths, mean N/8)"
             if masked else ""))
    names = {"causal": "causal", "fs_routing": "FS"}
    layouts = ("contiguous", "zigzag")
    columns = [(name, layout, d) for name in names for d in [None, *masked] for layout in layouts]
    titles = {(name, layout, d): f"{names[name]} {'masked ' + d + ' ' if d else ''}{layout}"
              for name, layout, d in columns}
    print(f"{'N':>7} {'sp':>3} " + " ".join(f"{titles[c]:>{len(titles[c]) + 1}}" for c in columns))
    out = []
    for n in lengths:
        positions = {d: document_positions(document_ids(d, rows, n)) for d in masked}
        for sp in sps:
            row: dict[tuple, float | None] = {}
            for layout in layouts:
                runs = layout_runs(n, sp, block, layout)
                unmasked = {}
                for name, count in (("causal", causal_work), ("fs_routing", lambda r: routing_work(r, block, cell))):
                    work = [count(r) for r in runs]
                    row[name, layout, None] = max_over_mean(work)
                    unmasked[name] = sum(work) * rows
                    if "none" in documents:
                        out.append({"n": n, "sp": sp, "layout": layout, "work": name, "documents": "none",
                                    "max_over_mean": row[name, layout, None]})
                for d in masked:
                    # a rank's work: its runs' queries, each read within its document; zigzag deals the runs by
                    # the documents' work (`document_runs`, what shard_batch does with doc_ids)
                    dealt = runs if layout == "contiguous" else document_runs(positions[d], sp, block)
                    works = [[sum(w) for w in zip(*(document_work(positions[d], run, block, cell) for run in own))]
                             for own in dealt]
                    for i, name in enumerate(("causal", "fs_routing")):
                        work = [w[i] for w in works]
                        row[name, layout, d] = max_over_mean(work)
                        out.append({"n": n, "sp": sp, "layout": layout, "work": name, "documents": d,
                                    "max_over_mean": row[name, layout, d],
                                    "unmasked_max_over_mean": row[name, layout, None],
                                    "work_over_unmasked": sum(work) / unmasked[name] if unmasked[name] else None})
            print(f"{n:>7} {sp:>3} " + " ".join(
                f"{'-' if row[c] is None else format(row[c], '.3f'):>{len(titles[c]) + 1}}" for c in columns))
    return out


def time_table(runs: ModelRuns, kind: str, n: int) -> None:
    print(f"\n3. wall time of forward + backward, {kind}, N={n} (1 thread per rank)")
    single = runs.ranks(1, kind, n)
    t1, c1 = single[0]["time_s"], single[0]["cpu_s"]
    ranks = runs.ranks(2, kind, n)
    t2, c2 = max(r["time_s"] for r in ranks), max(r["cpu_s"] for r in ranks)
    # CPU time per rank is the work a rank does; wall time also shows how the ranks share this host's cores
    print(f"wall: sp=1 {t1:.2f} s, sp=2 {t2:.2f} s (slowest rank), ratio sp2/sp1 = {t2 / t1:.2f}")
    print(f"CPU time of the busiest rank: sp=1 {c1:.2f} s, sp=2 {c2:.2f} s, ratio {c2 / c1:.2f}")


def recompute_table(runs: ModelRuns, kind: str, lengths: list[int]) -> None:
    print(f"\n4. activation memory per rank, {kind}, d_model 256, 4 layers, 4 heads, fp32: "
          "train.activation_checkpointing off / on")
    print(f"{'N':>6} {'sp':>3} {'rank':>4} {'off MB':>8} {'on MB':>8} {'on/off':>7}")
    for n in lengths:
        for sp in (1, 2):
            off, on = runs.ranks(sp, kind, n), runs.ranks(sp, kind, n, recompute=True)
            for a, b in zip(off, on):
                print(f"{n:>6} {sp:>3} {a['rank']:>4} {a['saved_mb']:>8.1f} {b['saved_mb']:>8.1f} "
                      f"{b['saved_mb'] / a['saved_mb']:>7.2f}")


def attention_settings(pairs: list[str]) -> dict:
    """`KEY=VALUE` settings of `AttentionConfig` (its scalar fields, each read as its default's type)."""
    import dataclasses

    from fsframework.config import AttentionConfig

    defaults = AttentionConfig()
    fields = {f.name: type(getattr(defaults, f.name)) for f in dataclasses.fields(AttentionConfig)}
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or fields.get(key) not in (int, float, str):
            raise SystemExit(f"--attention {pair}: not KEY=VALUE of a scalar model.attention setting "
                             f"({', '.join(k for k, t in fields.items() if t in (int, float, str))})")
        settings[key] = fields[key](value)
    AttentionConfig(**settings)  # a setting of the wrong type fails here, not in the ranks
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", choices=("memory", "bytes", "work", "time", "recompute"),
                        help="these tables (default: memory, bytes, work and time)")
    parser.add_argument("--kind", default="tfpp")
    parser.add_argument("--kinds", nargs="+", default=["fsl", "fs", "tfpp"])
    parser.add_argument("--n", type=int, nargs="+",
                        help="sequence lengths (memory and time take the first; recompute every one)")
    parser.add_argument("--sp", type=int, nargs="+",
                        help="sequence-parallel sizes of the bytes and work tables (default 2 4 8) and of the memory "
                             "table besides sp = 1 (default 2 4)")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    parser.add_argument("--documents", nargs="+", choices=DOCUMENTS, default=["none"],
                        help="bytes and work tables: none (unmasked rows, the default), one (document masking, every "
                             "row one document), mix (masking, documents of exponential lengths with mean N/8, seeded)")
    parser.add_argument("--batch", type=int, default=1, help="bytes and work tables: rows B (default 1)")
    parser.add_argument("--heads", type=int, default=4, help="bytes table: heads H (default 4)")
    parser.add_argument("--head-dim", type=int, default=32, help="bytes table: head width d (default 32); D = H d")
    parser.add_argument("--attention", nargs="+", default=[], metavar="KEY=VALUE",
                        help="bytes and work tables: model.attention settings (default: AttentionConfig's), "
                             "e.g. window=16 cell_size=4 block_size=8")
    parser.add_argument("--json", help="write the bytes and work records to this file")
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        return keys_worker(spec) if spec.get("mode") == "keys" else worker(spec)
    attention = attention_settings(args.attention)
    shapes = {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "attention": attention}
    documents = list(dict.fromkeys(args.documents))
    n = args.n[0] if args.n else 4096
    tables = args.only or ["memory", "bytes", "work", "time"]
    # the time table times 2 steps after the counted one; memory and recompute need the counted step only
    runs, records = ModelRuns(repeats=2 if "time" in tables else 0), []
    if "memory" in tables:
        memory_table(runs, args.kind, n, [1, *(args.sp or [2, 4])])
    if "bytes" in tables:
        records += bytes_table(args.kinds, args.n or [8192, 32768, 131072], args.sp or [2, 4, 8],
                               args.layout, documents, shapes)
    if "work" in tables:
        from fsframework.config import AttentionConfig

        att = AttentionConfig(**attention)
        records += work_table(args.n or [32768], args.sp or [2, 4, 8], documents, args.batch, att.block_size,
                              att.cell_size)
    if "time" in tables:
        time_table(runs, args.kind, n)
    if "recompute" in tables:
        recompute_table(runs, args.kind, args.n or [4096, 16384])
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
