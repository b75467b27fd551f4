"""`train.compile`: decoder blocks compiled in place (fsframework.models.compile) give the eager
model's losses and gradients, keep its parameter names, and a run trains with them as without."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from fsframework.models.compile import compile_blocks, compiled_blocks
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf, tiny_model

VOCAB = 61


@pytest.mark.parametrize("name", ["tfpp", "swa"])
def test_compiled_blocks_give_the_eager_losses_and_gradients(name):
    torch.manual_seed(0)
    eager = tiny_model(name, VOCAB)
    compiled = compile_blocks(copy.deepcopy(eager))
    assert compiled_blocks(compiled) == len(compiled.layers) and compiled_blocks(eager) == 0
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints name the same tensors
    tokens = torch.randint(0, VOCAB, (2, 65), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (eager, compiled):
        loss = model(tokens[:, :-1], targets=tokens[:, 1:]).mean()
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (label, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=label)


def test_packed_documents_of_new_lengths_do_not_compile_again():
    """With document masking the blocks see the packed rows (the attention call, which reads each
    document apart, stays eager), so documents of new lengths reuse the compiled graphs; the masked
    losses are the eager model's."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager = tiny_model("tfpp", VOCAB)
    compiled = compile_blocks(copy.deepcopy(eager))
    tokens = torch.randint(0, VOCAB, (2, 65), generator=torch.Generator().manual_seed(1))
    graphs = []
    for cuts in ([10, 30], [5, 17, 50], [33], [7, 60]):  # other document lengths at every step
        doc_ids = torch.zeros(2, 64, dtype=torch.long)
        for cut in cuts:
            doc_ids[:, cut:] += 1
        with torch.no_grad():
            losses = [model(tokens[:, :-1], targets=tokens[:, 1:], doc_ids=doc_ids).mean()
                      for model in (eager, compiled)]
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1:] == graphs[:-1], graphs  # compiled once, at the first step


def test_a_model_without_blocks_is_refused():
    with pytest.raises(TypeError, match="no decoder blocks"):
        compile_blocks(tiny_model("argrc", VOCAB))


def test_a_compiled_run_trains_as_the_eager_one(tmp_path, data_cache):
    def losses(run_dir, *extra):
        proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", f"data.cache_dir={data_cache}",
                *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=3", "optim.warmup_steps=1",
                "train.progress=false", "train.tensorboard=false", *extra)
        assert ("decoder blocks compiled" in proc.stdout) == ("train.compile=true" in extra), proc.stdout
        return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled", "train.compile=true")
    assert len(eager) == len(compiled) == 3
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(eager, compiled)), (eager, compiled)
