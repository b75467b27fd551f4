"""One rank of the SP-vs-single-process check: every model kind, forward logits and all gradients.

Usage: python _equivalence_worker.py SP KIND[,KIND...] N[,N...] [LAYOUT[,LAYOUT]]
Under the zigzag layout only the kinds it cuts into two runs per rank are checked (the others
run contiguous under it, as in the contiguous check). KIND `rewired-ablation` is the rewired
model's ablations together: mean runway (a prefix sum across slices), bilinear score with Bmat
moved off the identity, runway head 1.
Rank 0 computes the single-process reference (same seed, whole sequence) and sends its logits
and gradients to every rank: one reference per world, not one per rank. Gradients of the SP run are
averaged over the world as DeepSpeed does; with dp > 1 every DP group gets its
own sample and the reference is the mean of the per-sample full gradients.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist

from fsframework.config import AttentionConfig, ModelConfig, ParallelConfig, RewiredConfig
from fsframework.models import freesolo_attention
from fsframework.models.freesolo_attention import set_fsb_thresholds
from fsframework.models.registry import KINDS, build_model
from fsframework.models.losses import lm_losses
from fsframework.parallel.batch import shard_batch
from fsframework.parallel.collectives import CommCounter
from fsframework.parallel.groups import init_groups
from fsframework.parallel.parallelize import parallelize, sp_context
from fsframework.parallel.sharding import shard_runs
from tests.parallel.ranks import finish_rank

FREESOLO_OP = freesolo_attention.freesolo  # the op itself, which `record_key_lengths` wraps

TOL = 1e-5


REWIRED_ABLATION = "rewired-ablation"
FSL_TOKENS = "fsl-tokens"  # FS-L routing by the cells' token keys (model.attention.route_score=tokens)


def registry_kind(kind: str) -> str:
    return {REWIRED_ABLATION: "rewired", FSL_TOKENS: "fsl"}.get(kind, kind)


def tiny(kind: str) -> ModelConfig:
    # block 16 and window 40: a window wider than some slices, so halos span several ranks
    rewired = RewiredConfig(runway="mean", score="bilinear", head=1) if kind == REWIRED_ABLATION else RewiredConfig()
    att = AttentionConfig(window=40, block_size=16, cell_size=4, top_k=2, recent_cells=2, retained_cells=3,
                          combine="gate" if kind == "fsl" else "sum", impl="reference", rewired=rewired,
                          route_score="tokens" if kind == FSL_TOKENS else "mean")
    return ModelConfig(name=registry_kind(kind), vocab_size=61, d_model=32, n_layers=2, n_heads=2, attention=att)


def build(kind: str, cfg: ModelConfig):
    """The kind's model, seeded by the caller (every rank builds the same weights)."""
    model = build_model(cfg)
    if kind == "fsb":  # FS-B reads with per-head thresholds that a checkpoint's calibration supplies
        set_fsb_thresholds(model, [[0.3, 0.5], [0.4, 0.2]], "test thresholds")
    if kind == REWIRED_ABLATION:  # Bmat off the identity, so the bilinear score is really tested
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.bmat.add_(0.3 * torch.randn_like(layer.attn.bmat))
    return model


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))


def sample(seed: int, n: int, vocab: int):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (2, n + 1), generator=gen)
    weights = 1.0 + 9.0 * (torch.rand(2, n, generator=gen) < 0.2).float()
    targets = tokens[:, 1:].clone()
    targets[0, 3] = -100
    return tokens[:, :-1], targets, weights


def reference_of(reference, cfg: ModelConfig, n: int, groups, weighted: bool):
    """The single process's logits for this rank's DP group's sample and its parameter gradients
    (averaged over the DP groups' samples), computed on rank 0 and sent to every rank."""
    result = [None]
    if groups.rank == 0:
        logits_per_group = []
        for g in range(groups.dp):  # every DP group's sample on one process
            tokens, targets, weights = sample(100 + g, n, cfg.vocab_size)
            logits = reference(tokens)
            (lm_losses(logits, targets, weights if weighted else None)[0] / groups.dp).backward()
            logits_per_group.append(logits.detach())
        result[0] = (logits_per_group, [p.grad for p in reference.parameters()])
    dist.broadcast_object_list(result, src=0)
    logits_per_group, grads = result[0]
    return logits_per_group[groups.dp_rank], grads


def check(kind: str, n: int, sp: int, groups, layout: str) -> list[str]:
    cfg = tiny(kind)
    torch.manual_seed(0)
    model = build(kind, cfg)
    weighted = kind in ("swa", "fsl")
    ref_logits, ref_grads = reference_of(copy.deepcopy(model), cfg, n, groups, weighted)
    parallelize(model, ParallelConfig(sp=sp, sp_layout=layout), groups)
    tokens, targets, weights = sample(100 + groups.dp_rank, n, cfg.vocab_size)
    mine = shard_batch(sp_context(model), tokens, targets, weights if weighted else None)
    lengths = record_key_lengths() if kind in ("fs", "fsl") else []
    with CommCounter.counting() as traffic:
        if weighted:  # the trainer's path: the model scores its own targets, the head in ragged chunks
            loss, _ = mine.scored(model, loss_chunk=5)
        else:
            logits = mine.logits(model)
            loss, _ = mine.losses(logits)
        loss.backward()
    if weighted:
        with torch.no_grad():
            logits = mine.logits(model)
    errors = []
    ctx = mine.sp
    runs = ctx.runs
    if kind == "fs":  # FS fetches the selected cells after gathering the summaries, never the prefix
        errors += fs_traffic_errors(dict(traffic), runs, n)
    if lengths:  # compact keys: fewer than the prefix where the queries read only some earlier cells
        print(f"rank {groups.rank}: {kind} N={n} {ctx.layout} compact keys {any(k < full for k, full in lengths)} "
              f"relayed {traffic.get('relayed cells', 0)} bytes")
    err = rel_rms(logits.detach(), shard_runs(ref_logits, runs))
    worst = err
    if err > TOL:
        errors.append(f"{kind} N={n}: logits of runs {runs} differ, rel rms {err:.2e}")
    for (name, p), ref_grad in zip(model.named_parameters(), ref_grads):
        grad = p.grad.clone()
        dist.all_reduce(grad)
        grad /= groups.world_size  # what DeepSpeed does with the gradients of all ranks
        err = rel_rms(grad, ref_grad)
        worst = max(worst, err)
        if err > TOL:
            errors.append(f"{kind} N={n}: gradient of {name} differs, rel rms {err:.2e}")
    print(f"rank {groups.rank}: {kind} N={n} {ctx.layout} runs {runs} worst rel rms {worst:.1e}")
    return errors


def record_key_lengths() -> list[tuple[int, int]]:
    """(keys handed to the FreeSolo op, start + n) of every FreeSolo attention call from here on."""
    seen = []

    def recording(q, k, v, state, *args):
        seen.append((k.shape[1], state.start + q.shape[1]))
        return FREESOLO_OP(q, k, v, state, *args)
    freesolo_attention.freesolo = recording  # the layers call the op through their module's name
    return seen


def fs_traffic_errors(traffic: dict, runs: list, n: int) -> list[str]:
    """FS under SP sends summaries, requests and cells only (fsframework.parallel.selected), never the
    all-gathered prefix."""
    if set(traffic) - {"summaries", "requests", "cells", "relayed cells"} or "summaries" not in traffic:
        return [f"fs N={n} runs {runs}: sent {traffic}, not the selected cells (summaries, requests, cells)"]
    return []


def main() -> None:
    sp, kinds, lengths = int(sys.argv[1]), sys.argv[2].split(","), [int(x) for x in sys.argv[3].split(",")]
    layouts = sys.argv[4].split(",") if len(sys.argv) > 4 else ["contiguous"]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    groups = init_groups(sp)
    finish_rank([e for layout in layouts for kind in kinds_under(layout, kinds) for n in lengths
                 for e in check(kind, n, sp, groups, layout)], groups.rank)


def kinds_under(layout: str, kinds: list[str]) -> list[str]:
    """The kinds a layout changes: zigzag cuts the causal prefix kinds (not a whole language
    model such as AR-GRC) into two runs per rank (fsframework.parallel.parallelize)."""
    if layout == "contiguous":
        return kinds
    return [k for k in kinds if KINDS[registry_kind(k)].keys == "prefix" and not KINDS[registry_kind(k)].language_model]


if __name__ == "__main__":
    main()
