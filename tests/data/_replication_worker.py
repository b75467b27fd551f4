"""One rank of the replication test: reads two batches and writes their tokens to a file."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from fsframework.data.loader import TokenLoader, make_streaming_dataset

if __name__ == "__main__":
    data_dir, sp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    dataset = make_streaming_dataset(data_dir, batch_size=2, shuffle=True, seed=7, replication=sp)
    loader = TokenLoader(dataset, batch_size=2)
    batches = [next(loader)["inputs"].tolist() for _ in range(2)]
    with open(out, "w") as f:
        json.dump(batches, f)
    dist.barrier()
    dist.destroy_process_group()
