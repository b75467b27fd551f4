"""Copy losses on repeated-passage batches, the copying onset and the copy drill experiment."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fsframework.config import AttentionConfig

from experiments.copying import copy_losses, copying_onset
from fsframework.data.synthetic import repeat_batch
from tests.utils import REPO


def induction_oracle(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits of a perfect copier: predict what followed the latest earlier occurrence of the
    current token; uniform when the token has not been seen."""
    logits = torch.zeros(*tokens.shape, vocab)
    for b, row in enumerate(tokens.tolist()):
        last_seen: dict[int, int] = {}
        for t, token in enumerate(row):
            if token in last_seen:
                logits[b, t, row[last_seen[token] + 1]] = 50.0
            last_seen[token] = t
    return logits


def test_batches_pack_passages_twice_and_mask_the_predictable_targets():
    gen = torch.Generator().manual_seed(0)
    tokens, first, second = repeat_batch(gen, 4, 96, draw=100_000, max_passage=20)
    assert tokens.shape == (4, 97) and first.shape == second.shape == (4, 96)
    assert not (first & second).any()
    # copy positions are exactly those a perfect copier gets right, so its loss is ~0 there,
    # and no copying helps on the first copies (the copier is even confidently wrong where a
    # passage starts after a token it has seen)
    oracle = induction_oracle(tokens[:, :-1], 100_000)
    first_loss, second_loss = copy_losses(oracle, tokens[:, 1:], first, second)
    assert second_loss < 1e-3
    assert first_loss >= math.log(100_000) - 1e-3
    # the unmarked targets start second copies: they follow a first copy's last token, seen
    # once, so copying cannot predict them (the oracle is uniform there)
    start_loss, _ = copy_losses(oracle, tokens[:, 1:], ~first & ~second, second)
    assert start_loss == pytest.approx(math.log(100_000), abs=1e-4)
    assert int(first.sum()) > int(second.sum()) > 0.6 * int(first.sum())


def test_onset_is_the_first_step_copying_halves_the_loss():
    records = [{"step": 0, "first": 5.5, "second": 5.6}, {"step": 100, "first": 5.5, "second": 3.0},
               {"step": 200, "first": 5.5, "second": 2.0}, {"step": 300, "first": 5.5, "second": 0.5}]
    assert copying_onset(records) == 200
    assert copying_onset(records[:2]) is None


@pytest.mark.parametrize("model", ["tfpp", "fs", "torch"])
def test_copy_drill_tool_trains_and_writes_records(tmp_path, model):
    import runpy

    out = tmp_path / "drill.json"
    argv = ["--model", model, "--steps", "4", "--every", "2", "--d-model", "32", "--layers", "2",
            "--heads", "2", "--vocab", "256", "--draw", "64", "--seq-len", "64", "--max-passage", "12",
            "--batch-tokens", "256", "--window", "16", "--cell-size", "8", "--block-size", "16",
            "--retained-cells", "2", "--recent-cells", "1", "--out", str(out)]
    runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"](argv)
    result = json.loads(out.read_text())
    steps = [r["step"] for r in result["records"]]
    assert steps == [0, 2, 4]
    # untrained, both copies cost about chance over the 256-token vocab
    assert result["records"][0]["first"] == pytest.approx(math.log(256), abs=0.5)
    assert result["onset"] is None


def test_copy_drill_schedule_grows_the_length_and_probes_first_and_last(tmp_path):
    import runpy

    out = tmp_path / "drill.json"
    argv = ["--model", "tfpp", "--schedule", "32:2,64:2", "--every", "2", "--d-model", "32", "--layers", "2",
            "--heads", "2", "--vocab", "256", "--draw", "64", "--min-passage", "4", "--batch-tokens", "256",
            "--window", "16", "--cell-size", "8", "--block-size", "16", "--out", str(out)]
    runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"](argv)
    records = json.loads(out.read_text())["records"]
    assert [(r["step"], r["seq_len"]) for r in records] == [(0, 32), (2, 64), (4, 64)]
    assert set(records[0]["by_length"]) == {"32", "64"}
    # the onset fields follow the longest probe length
    assert records[-1]["first"] == records[-1]["by_length"]["64"]["first"]
    with pytest.raises(SystemExit, match="LENGTH:STEPS"):
        runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"](["--schedule", "64-2"])
    with pytest.raises(SystemExit, match="need a FreeSolo model"):
        runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"](["--model", "tfpp", "--routing"])


def test_copy_drill_saves_the_model_and_continues_from_it(tmp_path):
    import runpy

    main = runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"]
    small = ["--model", "tfpp", "--d-model", "32", "--layers", "2", "--heads", "2", "--vocab", "256",
             "--draw", "64", "--seq-len", "64", "--max-passage", "12", "--batch-tokens", "256", "--every", "2",
             "--window", "16", "--cell-size", "8", "--block-size", "16"]
    main([*small, "--steps", "4", "--save", str(tmp_path / "drill.pt"), "--out", str(tmp_path / "a.json")])
    main([*small, "--steps", "0", "--init", str(tmp_path / "drill.pt"), "--out", str(tmp_path / "b.json")])
    trained = json.loads((tmp_path / "a.json").read_text())["records"][-1]
    loaded = json.loads((tmp_path / "b.json").read_text())["records"][-1]
    # the same held-out probe on the saved weights gives the trained model's losses
    assert loaded["first"] == pytest.approx(trained["first"], abs=1e-5)
    assert loaded["second"] == pytest.approx(trained["second"], abs=1e-5)
    fresh = json.loads((tmp_path / "a.json").read_text())["records"][0]
    assert fresh["first"] != pytest.approx(trained["first"], abs=1e-3)
    # continuing counts steps on from the saved model's, and saves at every probe
    main([*small, "--steps", "2", "--init", str(tmp_path / "drill.pt"), "--save", str(tmp_path / "more.pt"),
          "--out", str(tmp_path / "c.json")])
    assert [r["step"] for r in json.loads((tmp_path / "c.json").read_text())["records"]] == [4, 6]
    assert torch.load(tmp_path / "more.pt", weights_only=True)["step"] == 6
    # --init-shared: the TF++ weights start an FS model; FreeSolo's own tensors keep their init
    fs = [*small[:1], "fs", *small[2:]]
    with pytest.raises(RuntimeError, match="Missing key"):
        main([*fs, "--steps", "0", "--init", str(tmp_path / "drill.pt")])
    main([*fs, "--steps", "0", "--init", str(tmp_path / "drill.pt"), "--init-shared", "--save", str(tmp_path / "fs.pt")])
    tfpp, upcycled = (torch.load(tmp_path / name, weights_only=True)["model"] for name in ("drill.pt", "fs.pt"))
    assert all(torch.equal(tensor, upcycled[name]) for name, tensor in tfpp.items())
    initial_gain = AttentionConfig().readout_gain  # FreeSolo's own tensors keep their initial values
    assert set(upcycled) - set(tfpp) and all(torch.equal(upcycled[name], torch.full_like(upcycled[name], initial_gain))
                                             for name in upcycled if name.endswith("lr_norm_weight"))
    with pytest.raises(SystemExit, match="does not have"):  # an FS model's extras do not fit TF++
        main([*small, "--steps", "0", "--init", str(tmp_path / "fs.pt"), "--init-shared"])
    # --readout-gain 0 silences the long-range branch: the upcycled FS model is TF++ inside its window
    main([*fs, "--steps", "0", "--init", str(tmp_path / "drill.pt"), "--init-shared", "--readout-gain", "0",
          "--save", str(tmp_path / "fs0.pt"), "--out", str(tmp_path / "fs0.json")])
    main([*small[:1], "swa", *small[2:], "--steps", "0", "--init", str(tmp_path / "drill.pt"),
          "--out", str(tmp_path / "swa.json")])
    silenced, windowed = (json.loads((tmp_path / name).read_text())["records"][-1] for name in ("fs0.json", "swa.json"))
    assert silenced["second"] == pytest.approx(windowed["second"], abs=1e-5)
    assert silenced["first"] == pytest.approx(windowed["first"], abs=1e-5)
    assert silenced["second"] != pytest.approx(loaded["second"], abs=1e-4)  # the window does change it
    gains = [t for name, t in torch.load(tmp_path / "fs0.pt", weights_only=True)["model"].items()
             if name.endswith("lr_norm_weight")]
    assert gains and all(torch.equal(t, torch.zeros_like(t)) for t in gains)
    with pytest.raises(SystemExit, match="need a FreeSolo model"):
        main([*small, "--steps", "0", "--readout-gain", "0"])
    # --combine gate: FS with a per-token gate on the readout, its gate kept at init by --init-shared
    main([*fs, "--steps", "0", "--init", str(tmp_path / "drill.pt"), "--init-shared", "--combine", "gate",
          "--save", str(tmp_path / "gated.pt")])
    gated = torch.load(tmp_path / "gated.pt", weights_only=True)["model"]
    assert any(name.endswith("w_gate.bias") for name in gated)
    assert not any(name.endswith("w_gate.bias") for name in upcycled)
    with pytest.raises(SystemExit, match="need a FreeSolo model"):
        main([*small, "--steps", "0", "--combine", "gate"])
    # --set-head-gain: one head's gain over a loaded model, the rest as saved
    main([*fs, "--steps", "0", "--init", str(tmp_path / "fs0.pt"), "--set-head-gain", "1.0=10",
          "--save", str(tmp_path / "head.pt")])
    head = torch.load(tmp_path / "head.pt", weights_only=True)["model"]
    gain = head["layers.1.attn.lr_norm_weight"][0]
    assert torch.equal(gain, torch.full_like(gain, 10))
    assert not head["layers.1.attn.lr_norm_weight"][1].any() and not head["layers.0.attn.lr_norm_weight"].any()
    for bad in ("2.0=1", "1.2=1", "1.0", "x.0=1", "1.0=big"):  # 2 layers of 2 heads
        with pytest.raises(SystemExit, match="LAYER.HEAD=GAIN"):
            main([*fs, "--steps", "0", "--set-head-gain", bad])


def test_copy_drill_probes_untrained_lengths_at_scaled_and_at_training_distances(tmp_path):
    import runpy

    out = tmp_path / "drill.json"
    argv = ["--model", "fs", "--steps", "2", "--every", "2", "--d-model", "32", "--layers", "2", "--heads", "2",
            "--vocab", "256", "--draw", "64", "--seq-len", "32", "--max-passage", "8", "--batch-tokens", "128",
            "--probe-lengths", "32,128", "--window", "4", "--cell-size", "4", "--block-size", "8", "--routing",
            "--out", str(out)]
    runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"](argv)
    records = json.loads(out.read_text())["records"]
    # the trained length is probed once; the untrained one with scaled and with training passages
    assert set(records[-1]["by_length"]) == {"32", "128"}
    assert set(records[-1]["at_train_distances"]) == {"128"}
    assert records[-1]["at_train_distances"]["128"] != records[-1]["by_length"]["128"]
    # scaled passages put copies further back than any training copy (passages of 8: 7 back)
    assert records[-1]["by_length"]["128"]["beyond_training"] is not None
    assert records[-1]["at_train_distances"]["128"]["beyond_training"] is None
    assert records[-1]["by_length"]["32"]["beyond_window"] is not None  # passages of 5..8 lie beyond a window of 4
    # --routing: routing recall per layer on every probe
    routing = records[-1]["routing"]
    assert set(routing) == {"32", "128", "128@train"} and all(len(layers) == 2 for layers in routing.values())
    assert routing["128"][0]["queries"] > routing["128@train"][0]["queries"] > 0  # scaled copies lie further back
    assert 0 <= routing["128"][1]["best_head"] <= 1
    assert routing["128"][1]["chance"] <= routing["128"][1]["reach_chance"]  # the reach holds the source's cell
    assert routing["128"][1]["chance"] <= routing["128"][1]["passage_chance"]
    # and the readout's weight on the source wherever a head selected its cell (K = 4 cells of 4)
    readout = routing["128"][1]
    assert readout["readout_chance"] == 1 / 16 and readout["readout_pairs"] > 0
    assert 0 < readout["readout_mean"] <= readout["readout_best_head"] <= 1
    # --set-lam 0: the same probes routed by content alone (no norm prior) give other losses
    main = runpy.run_path(str(REPO / "experiments" / "copy_drill.py"))["main"]
    main([*argv[:argv.index("--out")], "--steps", "0", "--set-lam", "0", "--out", str(tmp_path / "lam0.json")])
    content_only = json.loads((tmp_path / "lam0.json").read_text())["records"][0]
    assert content_only["by_length"]["128"] != json.loads(out.read_text())["records"][0]["by_length"]["128"]
    # --probe-routing off: the long-range branch reads nothing, which changes the losses
    main([*argv[:argv.index("--out")], "--steps", "0", "--probe-routing", "off", "--out", str(tmp_path / "off.json")])
    off = json.loads((tmp_path / "off.json").read_text())["records"][0]["by_length"]["128"]
    assert off != json.loads(out.read_text())["records"][0]["by_length"]["128"]
    assert off["beyond_window"] is not None
