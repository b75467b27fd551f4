"""This rank's part of a batch: inputs, targets and weights cut together, and the loss on them.

Every rank of a sequence-parallel group reads the same sample `[B, N]`. `shard_batch` cuts
the inputs, the targets and the recall weights to this rank's runs in one place (as
torchtitan's context parallelism shards inputs and labels together) and returns them with
the `SPContext` of this sequence length, whose runs are the positions the rank holds. The
model's forward takes that context as an argument; the loss is `lm_losses` on the own
targets, the same function as on one process (`RankBatch.scored`: the model's forward scores
the targets itself, so the output head can run in chunks).

Each rank scores only its own targets but divides by the target count (or weight sum) of
the WHOLE sequence, so the SP group's losses add up to the single-process loss. DeepSpeed
averages gradients over all `dp * sp` ranks as if they were data-parallel replicas; dividing
by `1/sp` of the whole sequence's denominators (the rank's loss times `sp`) turns that average
into the data-parallel average of full-sequence gradients:

    (1 / (dp sp)) sum_g sum_r grad(sp L_gr) = (1 / dp) sum_g grad(L_g),   L_g = sum_r L_gr

The trainer's logged loss (mean over all ranks) is then the DP mean of full losses too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fsframework.models.losses import Denominators, lm_losses, loss_denominators, weighted_losses
from fsframework.parallel.context import SPContext
from fsframework.parallel.sharding import shard_runs


@dataclass(frozen=True)
class RankBatch:
    """What one rank computes on: its inputs, targets and weights (`[B, n]`), the `SPContext` of
    the sequence (None on one process, where `n` is the whole sequence) and the loss's denominators."""

    inputs: torch.Tensor
    targets: torch.Tensor
    weights: Optional[torch.Tensor] = None
    sp: Optional[SPContext] = None
    denominators: Optional[Denominators] = None
    # the packed documents, read apart: the whole rows' `[B, N]` also under sequence parallelism (a
    # rank's part may begin inside a document; `fsframework.parallel.documents`)
    doc_ids: Optional[torch.Tensor] = None

    def logits(self, model) -> torch.Tensor:
        """`model`'s logits `[B, n, V]` of this rank's inputs (the model, or the engine wrapping it)."""
        return model(self.inputs) if self.sp is None else model(self.inputs, sp=self.sp)

    def losses(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to optimise, plain CE) of this rank's share (`fsframework.models.losses.lm_losses`)."""
        return lm_losses(logits, self.targets, self.weights, self.denominators)

    def scored(self, model, loss_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`losses` of this rank's share, the model scoring its own targets: its forward returns the
        per-token losses, the output head run `loss_chunk` positions at a time (0: all at once)."""
        extra = {} if self.sp is None else {"sp": self.sp}
        if self.doc_ids is not None:
            extra["doc_ids"] = self.doc_ids
        ce = model(self.inputs, targets=self.targets, loss_chunk=loss_chunk, **extra)
        return weighted_losses(ce, self.targets, self.weights, self.denominators)


def shard_batch(sp: Optional[SPContext], inputs: torch.Tensor, targets: torch.Tensor,
                weights: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None) -> RankBatch:
    """This rank's `RankBatch` of a batch of whole sequences `[B, N]` (targets `-100` are ignored).
    `sp`: the model's context (`sp_context(model)`), None for a model that is not sequence parallel.
    doc_ids: the rows' packed documents, each read as a row of its own; kept whole under sequence
    parallelism, where the model reads from them where the rank's documents began."""
    if sp is None:
        return RankBatch(inputs, targets, weights, doc_ids=doc_ids)
    # rows read as their documents: runs dealt by the documents' work (zigzag), the same on every rank
    sequence = sp.at_length(inputs.shape[1]) if doc_ids is None else sp.at_documents(doc_ids)
    count, weight_sum = loss_denominators(targets, weights)
    scale = sequence.size  # see the module docstring: the rank's loss times sp
    denominators = Denominators(count / scale, None if weight_sum is None else weight_sum / scale)

    def own(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if x is None else shard_runs(x, sequence.runs)

    return RankBatch(own(inputs), own(targets), own(weights), sequence, denominators, doc_ids)
