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


def probe_batch(vocab: int) -> torch.Tensor:
    """`[2, 64]` tokens; inputs `[:, :-1]` are 63 long, as the run's sequences."""
    return torch.randint(0, min(vocab, 256), (2, 64), generator=torch.Generator().manual_seed(0))


def main() -> None:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    trainer = Trainer(read_config(run_dir / "config.yaml"))
    trainer.build()
    trainer.maybe_resume()
    assert trainer.resumed_from is not None, f"no checkpoint in {run_dir}"
    tokens = probe_batch(trainer.cfg.model.vocab_size)
    trainer.engine.eval()
    with torch.no_grad():
        loss = trainer.engine(tokens[:, :-1], tokens[:, 1:])
    # each SP rank returns its share of the full-sequence loss times sp: the mean over ranks is
    # the full loss (one data-parallel replica here)
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"loss": loss.item() / dist.get_world_size(),
                                   "checkpoint": trainer.resumed_from.name}))
    dist.barrier()


if __name__ == "__main__":
    main()
