"""`python -m tests.parallel.probed_fsf ARGS` is `fsf ARGS` (under torchrun) that, right after the
trainer resumes a checkpoint into the DeepSpeed engine (ZeRO shards, sequence parallelism), writes
the engine's own loss on a fixed batch to the JSON file `$FSF_PROBE_LOSS`, then trains on as usual:
the consolidation test compares it with the loss of the weights merged from the same checkpoint,
and the resume test checks the run it continues, in one launch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from fsframework.train.trainer import Trainer

PROBE_ENV = "FSF_PROBE_LOSS"

# English bytes (the runs train on byte-tokenized text): six steps of training move a model's loss
# on text by tenths, on uniformly random tokens by less than a thousandth, which a fresh init's
# loss can fall within
PROBE_TEXT = ("The quick brown fox jumps over the lazy dog while the committee reads its minutes aloud; "
              "a long sentence of plain words, spaces and punctuation, as the training corpus has.")


def probe_batch(vocab: int) -> torch.Tensor:
    """`[2, 64]` byte tokens of English text; inputs `[:, :-1]` are 63 long, as the run's sequences."""
    data = torch.tensor(list(PROBE_TEXT.encode()), dtype=torch.long)
    assert int(data.max()) < vocab and data.numel() >= 128
    return data[:128].view(2, 64)


def write_engine_loss(trainer: Trainer, out: Path) -> None:
    """The engine's loss on the probe batch, on rank 0, with the engine left as training wants it."""
    tokens = probe_batch(trainer.cfg.model.vocab_size)
    trainer.engine.eval()
    with torch.no_grad():
        loss = trainer.losses(tokens[:, :-1], tokens[:, 1:])[1]
    trainer.engine.train()
    # each SP rank's loss is its share of the full-sequence loss times sp: the mean over ranks is
    # the full loss (one data-parallel replica here)
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"loss": loss.item() / dist.get_world_size(),
                                   "checkpoint": trainer.resumed_from.name}))


def probing_resume(out: Path):
    maybe_resume = Trainer.maybe_resume

    def probed(self: Trainer) -> None:
        maybe_resume(self)
        if self.resumed_from is not None:
            write_engine_loss(self, out)

    return probed


if __name__ == "__main__":
    from fsframework.cli import app

    Trainer.maybe_resume = probing_resume(Path(os.environ[PROBE_ENV]))
    app(prog_name="fsf")
