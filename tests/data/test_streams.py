"""Streaming reads: remote S3 (a real S3-compatible server on loopback), mixtures, seeded
shuffle, and sequence-parallel replication across real ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fsframework.data.loader import TokenLoader, make_streaming_dataset
from fsframework.data.shards import pack_documents, write_mds
from tests.utils import REPO, read_ahead_threads


def _write(path: Path, marker: int, docs: int = 40, seq_len: int = 16) -> Path:
    """A dataset whose every token equals `marker` (so a sample tells its stream)."""
    write_mds(pack_documents([[marker] * 30] * docs, seq_len, eos_id=marker), path)
    return path


@pytest.fixture()
def s3_server(monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1", "S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    yield endpoint
    server.stop()


def test_remote_s3_dataset_streams_and_caches(s3_server, tmp_path):
    import boto3

    local = _write(tmp_path / "src" / "train", marker=5)
    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket="fsf-shards")
    for f in local.iterdir():
        client.upload_file(str(f), "fsf-shards", f"corpus/train/{f.name}")
    dataset = make_streaming_dataset([("s3://fsf-shards/corpus/train", None)], batch_size=2, shuffle=False, seed=0,
                                     local_cache=str(tmp_path / "cache"))
    loader = TokenLoader(dataset, batch_size=2)
    batch = next(loader)
    loader.close()
    assert batch["inputs"].shape == (2, 16) and int(batch["inputs"][0, 0]) == 5
    assert list((tmp_path / "cache").rglob("shard.*")), "remote shards are cached locally"


def test_streams_mix_by_proportion(tmp_path):
    a, b = _write(tmp_path / "a", marker=1, docs=200), _write(tmp_path / "b", marker=2, docs=200)
    dataset = make_streaming_dataset([(str(a), 0.75), (str(b), 0.25)], batch_size=4, shuffle=True, seed=1)
    markers = Counter(int(sample["tokens"][0]) for sample in dataset)  # one epoch as drawn
    share = markers[1] / (markers[1] + markers[2])
    assert 0.7 < share < 0.8, markers


def test_shuffle_is_deterministic_by_seed(tmp_path):
    src = tmp_path / "src"
    write_mds(pack_documents([[i % 250] * 17 for i in range(300)], 16, eos_id=255), src)

    def order(seed, tag):
        ds = make_streaming_dataset(str(src), batch_size=4, shuffle=True, seed=seed)
        loader = TokenLoader(ds, batch_size=4)
        out = [next(loader)["inputs"][:, 0].tolist() for _ in range(3)]
        loader.close()
        return out

    first, again, other = order(3, "a"), order(3, "b"), order(4, "c")
    assert first == again
    assert first != other


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ranks
def test_sequence_parallel_groups_share_samples(tmp_path):
    """4 ranks, sp=2: ranks {0,1} and {2,3} form groups; a group sees one sample stream."""
    src = tmp_path / "src"
    write_mds(pack_documents([list(range(i, i + 20)) for i in range(200)], 16, eos_id=255), src)
    world, sp, port = 4, 2, _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(REPO / "tests/data/_replication_worker.py"), str(src),
                                       str(sp), str(tmp_path / f"rank{rank}.json")], env=env, cwd=REPO))
    for p in procs:
        assert p.wait(timeout=180) == 0
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert seen[0] == seen[1] and seen[2] == seen[3]
    first = {tuple(row) for batch in seen[0] for row in batch}
    second = {tuple(row) for batch in seen[2] for row in batch}
    assert not first & second, "different data-parallel groups read different samples"
    assert np.asarray(seen[0]).shape == (2, 2, 16)


def _train_on(source: Path, run_dir: Path):
    from tests.utils import run_fsf

    return run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}",
                   "data.source=shards", f"data.path={source}", "data.seq_len=32", "data.micro_batch_size=2", "model.name=tfpp", "model.d_model=32",
                   "model.n_layers=1", "model.n_heads=2", "train.max_steps=40", "train.progress=false",
                   "train.tensorboard=false", check=False)


def test_damaged_or_missing_shard_is_named(tmp_path):
    root = tmp_path / "ds"
    write_mds(pack_documents([[i % 200] * 50 for i in range(400)], 32, eos_id=256), root / "train", size_limit=4096)
    shards = sorted((root / "train").glob("shard.*"))
    assert len(shards) > 3
    data = bytearray(shards[0].read_bytes())
    data[100:120] = b"x" * 20  # same size, wrong content: found when the loader reads it
    shards[0].write_bytes(bytes(data))
    proc = _train_on(root, tmp_path / "run_corrupt")
    assert proc.returncode != 0
    assert f"shard {shards[0].name}" in proc.stderr and "hash mismatch" in proc.stderr

    shards[2].unlink()  # found at start-up, before any step
    proc = _train_on(root, tmp_path / "run_missing")
    assert proc.returncode != 0
    assert f"shard {shards[2].name}: file missing" in proc.stderr
    assert not (tmp_path / "run_missing" / "metrics.jsonl").exists()


def test_a_loader_closed_mid_epoch_stops_its_read_ahead_threads(tmp_path):
    # streaming's two read-ahead threads poll until their epoch ends: a loop that stops after a few
    # batches (every training run) must end them, or each run would leave two polling for good
    dataset = make_streaming_dataset([(str(_write(tmp_path / "a", marker=3, docs=400)), None)], batch_size=2,
                                     shuffle=False, seed=0)
    others = frozenset(read_ahead_threads())  # another test's, in this process
    loader = TokenLoader(dataset, batch_size=2)
    next(loader)
    mine = read_ahead_threads(besides=others)
    assert len(mine) == 2, mine  # the epoch under way reads ahead (predownload) and then waits
    loader.close()
    assert not read_ahead_threads(wait_s=5, besides=others)
    next(loader)  # a closed loader starts the next epoch when asked again
    loader.close()
