"""`tools/launch_ranks.py`, the benchmarks' launcher (bench_sp, bench_sp_fs, bench_zero3_layout): `world` ranks
of a script with torch.distributed's env:// variables, each rank's last JSON line returned in rank order;
a rank that fails stops the others (which would wait in a collective) and is the one named, with its log.
The ranks here are plain Python scripts (no torch), so the launcher alone is timed."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.utils import REPO, load_tool

WORKER = """import json, os, sys, time
spec = json.loads(sys.argv[sys.argv.index("--worker") + 1])
rank = int(os.environ["RANK"])
if rank == spec.get("fail"):
    print("rank", rank, "broke here", file=sys.stderr)
    sys.exit(3)
if spec.get("fail") is not None or spec.get("hang"):
    time.sleep(120)  # as a rank waiting in a collective for its failed peer
print("a line before the result")
print(json.dumps({"rank": rank, "spec": spec, **{k: os.environ[k] for k in (
    "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "PYTHONPATH")}}))
"""


@pytest.mark.ranks
def test_ranks_in_order_and_the_failed_one_named(tmp_path):
    launch = load_tool("launch_ranks.py").launch
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    results = launch(3, {"size": 7}, str(script))
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["spec"] == {"size": 7} and r["WORLD_SIZE"] == "3" and r["OMP_NUM_THREADS"] == "1" for r in results)
    assert [r["LOCAL_RANK"] for r in results] == ["0", "1", "2"]
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in results}) == 1  # one rendezvous
    assert results[0]["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO), str(REPO / "kernels")]  # this checkout's code

    start = time.monotonic()
    with pytest.raises(SystemExit, match=r"rank 1 of 3 failed:\nrank 1 broke here"):
        launch(3, {"fail": 1}, str(script))  # ranks 0 and 2 would wait two minutes
    with pytest.raises(SystemExit, match=r"rank 0 of 2 timed out after 1 s"):
        launch(2, {"hang": True}, str(script), timeout_s=1)
    assert time.monotonic() - start < 30
