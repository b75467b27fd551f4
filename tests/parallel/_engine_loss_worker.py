"""One rank of the consolidation proof: resume a run's newest checkpoint into the DeepSpeed
engine exactly as training does (ZeRO shards, sequence parallelism) and write the engine's own
loss on a fixed batch, for the test to compare with the consolidated weights' loss.

Usage (under torchrun): python _engine_loss_worker.py RUN_DIR OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fsframework.checkpoints import read_config
from fsframework.train.trainer import Trainer


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


def main() -> None:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    trainer = Trainer(read_config(run_dir / "config.yaml"))
    trainer.build()
    trainer.maybe_resume()
    assert trainer.resumed_from is not None, f"no checkpoint in {run_dir}"
    tokens = probe_batch(trainer.cfg.model.vocab_size)
    trainer.engine.eval()
    with torch.no_grad():
        loss = trainer.losses(tokens[:, :-1], tokens[:, 1:])[1]
    # each SP rank's loss is its share of the full-sequence loss times sp: the mean over ranks is
    # the full loss (one data-parallel replica here)
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"loss": loss.item() / dist.get_world_size(),
                                   "checkpoint": trainer.resumed_from.name}))
    dist.barrier()


if __name__ == "__main__":
    main()
