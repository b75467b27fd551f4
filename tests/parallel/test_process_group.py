"""`multi_rank_job` (around `fsf train` and `fsf run`): a job of several ranks leaves its process
group when it ends, by success or by error; a lone process keeps its one-rank group, which the
next in-process run joins."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch.distributed as dist

from fsframework.parallel import process_group


@pytest.mark.parametrize("world, fails, left", [(2, False, True), (2, True, True), (1, False, False)])
def test_a_multi_rank_job_leaves_its_group_at_the_end(monkeypatch, world, fails, left):
    ended = []
    monkeypatch.setattr(process_group, "shutdown", lambda: ended.append(True))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    with pytest.raises(RuntimeError) if fails else nullcontext():
        with process_group.multi_rank_job():
            if fails:
                raise RuntimeError("a rank failed")
    assert ended == ([True] if left else [])
