"""Config errors fail early with a message naming the key; the CLI exits non-zero."""

from __future__ import annotations

import re

import pytest

from fsframework.config import ConfigError, load_config
from tests.utils import REPO, run_fsf, run_fsf_process


@pytest.mark.parametrize("override, fragment", [
    ("model.nmae=fs", "model.nmae"),
    ("optim.lr=-0.1", "optim.lr"),
    ("train.max_steps=ten", "train.max_steps"),
    ("model.name=transformer", "model.name"),
    ("parallel.zero_stage=5", "parallel.zero_stage"),
    ("train.nonfinite=ignore", "train.nonfinite"),
    ("train.nonfinite_max_skips=0", "train.nonfinite_max_skips"),
    ("train.preempt_signals=[SIGKILL]", "train.preempt_signals"),
    ("train.loss_chunk=-4096", "train.loss_chunk"),
], ids=["unknown-key", "negative-lr", "wrong-type", "unknown-model", "bad-zero-stage", "nonfinite", "max-skips",
        "preempt-signal", "loss-chunk"])
def test_bad_override_names_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config(None, [override])


def test_freesolo_relations_are_checked():
    with pytest.raises(ConfigError, match="block_size=100 must be a multiple of model.attention.cell_size=32"):
        load_config(None, ["model.name=fs", "model.attention.block_size=100"])
    with pytest.raises(ConfigError, match=r"window=64 must be >= model.attention.block_size - 1 = 127"):
        load_config(None, ["model.name=fs", "model.attention.window=64"])
    with pytest.raises(ConfigError, match="d_model=100 must be a multiple of model.n_heads=3"):
        load_config(None, ["model.d_model=100", "model.n_heads=3"])


@pytest.mark.parametrize("overrides, fragment", [
    (["model.name=argrc"], "model.name=argrc has none"),
    (["parallel.sp=2"], "parallel.sp=2"),
    (["parallel.zero_stage=3"], "parallel.zero_stage=3"),
], ids=["argrc", "sequence-parallel", "zero-3"])
def test_what_compile_does_not_cover_is_refused(overrides, fragment):
    load_config(None, overrides)  # each is a valid job without train.compile
    with pytest.raises(ConfigError, match=r"train\.compile=true .*" + re.escape(fragment)):
        load_config(None, ["train.compile=true", *overrides])


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model:\n  name: tfpp\n  layers: 3\n")
    with pytest.raises(ConfigError, match="model.layers"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("train.max_steps=abc", "invalid value for config key 'train.max_steps': Value 'abc' of type 'str' could not "
                            "be converted to Integer"),
    ("train.progress=maybe", "invalid value for config key 'train.progress': Value 'maybe' is not a valid bool"),
    ("train.maxsteps=3", "invalid config key 'train.maxsteps': Key 'maxsteps' not in 'TrainConfig'. Did you mean: "
                         "'max_steps'?"),
], ids=["int", "bool", "typo"])
def test_a_wrong_value_is_told_from_a_wrong_key(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert str(caught.value).startswith(message)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.max_steps"])


def test_every_shipped_yaml_is_valid():
    for path in sorted((REPO / "yamls").glob("*.yaml")):
        if "eval" in path.stem:
            continue
        load_config(path)


def test_cli_rejects_bad_config_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    # `python -m fsframework` as a user runs it: the exit code of a real process
    proc = run_fsf_process("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", "optim.lrr=0.1",
                           check=False)
    assert proc.returncode != 0
    assert "optim.lrr" in proc.stderr
    assert not run_dir.exists(), "nothing may be written for an invalid config"


def test_cli_config_prints_resolved_yaml():
    proc = run_fsf("config", str(REPO / "yamls" / "quickstart.yaml"), "train.max_steps=7")
    assert "max_steps: 7" in proc.stdout


# --- schema versions: renamed keys, migration of saved configs -------------------------------------------

FIXTURES = REPO / "tests" / "fixtures"
# config.yaml files as runs saved them before schema_version 2 (no schema_version key; every key of
# that schema, model.max_seq_len and train.copy_warmup_* included)
V1_DEFAULT = FIXTURES / "config_v1_default.yaml"
V1_FREESOLO = FIXTURES / "config_v1_freesolo_copy_warmup.yaml"


@pytest.mark.parametrize("old, new", [
    ("train.copy_warmup_steps", "research.copy_warmup_steps"),
    ("train.copy_warmup_seq_len", "research.copy_warmup_seq_len"),
    ("train.copy_warmup_max_passage", "research.copy_warmup_max_passage"),
    ("train.copy_warmup_draw", "research.copy_warmup_draw"),
])
def test_a_moved_key_names_its_new_place(old, new, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"{old} moved to {new}")):
        load_config(None, [f"{old}=5"])
    section, key = old.split(".")
    path = tmp_path / "job.yaml"
    path.write_text(f"{section}:\n  {key}: 5\n")
    with pytest.raises(ConfigError, match=re.escape(f"{old} moved to {new}")):
        load_config(path)


def test_a_removed_key_says_it_was_removed(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.max_seq_len was removed"):
        load_config(None, ["model.max_seq_len=4096"])
    path = tmp_path / "job.yaml"
    path.write_text("model:\n  max_seq_len: 4096\n")
    with pytest.raises(ConfigError, match=r"model\.max_seq_len was removed"):
        load_config(path)


def test_the_research_keys_are_checked_under_their_new_names():
    cfg = load_config(None, ["research.copy_warmup_steps=3"])
    assert cfg.research.copy_warmup_steps == 3 and not hasattr(cfg.train, "copy_warmup_steps")
    with pytest.raises(ConfigError, match=r"research\.copy_warmup_draw=100000 exceeds"):
        load_config(None, ["research.copy_warmup_steps=3", "research.copy_warmup_draw=100000"])


def test_saved_configs_record_the_schema_version():
    from fsframework.config import SCHEMA_VERSION, Config, to_yaml

    assert SCHEMA_VERSION == 5
    text = to_yaml(Config())
    assert text.startswith("schema_version: 5\n")
    assert "max_seq_len" not in text and "research:\n  copy_warmup_steps: 0" in text


def test_version_1_run_configs_are_migrated():
    from fsframework.config import load_run_config

    cfg = load_run_config(V1_FREESOLO)
    assert cfg.schema_version == 5 and cfg.model.name == "fs"
    a = cfg.model.attention
    assert (a.readout_gain_param, a.readout_gain_lr, a.readout_backward) == ("linear", 1.0, "gain"), \
        "an old run keeps how it trained its gains"
    assert (cfg.research.copy_warmup_steps, cfg.research.copy_warmup_seq_len, cfg.research.copy_warmup_max_passage,
            cfg.research.copy_warmup_draw) == (3, 128, 32, 256)
    default = load_run_config(V1_DEFAULT)
    assert default.research.copy_warmup_steps == 0 and default.model.name == "tfpp"
    # overrides use the current names, after the migration
    assert load_run_config(V1_DEFAULT, ["research.copy_warmup_steps=2"]).research.copy_warmup_steps == 2
    with pytest.raises(ConfigError, match="moved to research.copy_warmup_steps"):
        load_run_config(V1_DEFAULT, ["train.copy_warmup_steps=2"])
    # the same files are rejected as job files: a job is written in the current schema
    with pytest.raises(ConfigError, match="was removed|moved to"):
        load_config(V1_FREESOLO)


def test_migrate_is_a_pure_function_of_the_saved_dict():
    from fsframework.config import migrate

    old = {"model": {"name": "fs", "max_seq_len": 4096}, "train": {"copy_warmup_steps": 3, "max_steps": 7}}
    new = migrate(old)
    assert new == {"schema_version": 5, "model": {"name": "fs", "attention": {"readout_gain_param": "linear", "readout_gain_lr": 1.0,
                                                             "readout_backward": "gain"}},
                   "train": {"max_steps": 7}, "research": {"copy_warmup_steps": 3}}
    assert old["train"]["copy_warmup_steps"] == 3, "the input is left alone"
    assert migrate(new) == new, "a current config passes through"
    with pytest.raises(ConfigError, match="schema_version=9 is unknown"):
        migrate({"schema_version": 9})


def test_version_2_configs_keep_the_readout_gain_form_they_trained_with():
    """Schema 3 added model.attention.readout_gain_param, readout_gain_lr and readout_backward; a version-2 run
    trained g itself at optim.lr with the true gradient, and reads as such."""
    import yaml

    from fsframework.config import Config, migrate, to_yaml

    data = yaml.safe_load(to_yaml(Config()))
    data["schema_version"] = 2
    del data["model"]["attention"]["readout_gain_lr"]
    del data["model"]["attention"]["readout_gain_param"]
    del data["model"]["attention"]["readout_backward"]
    a = Config().model.attention
    assert (a.readout_gain_param, a.readout_gain_lr, a.readout_backward) == ("linear", 10.0, "gain")
    migrated = migrate(data)["model"]["attention"]
    assert (migrated["readout_gain_param"], migrated["readout_gain_lr"], migrated["readout_backward"]) == \
        ("linear", 1.0, "gain")
    data["model"]["attention"]["readout_gain_lr"] = 7.0  # a value a run recorded is never replaced
    assert migrate(data)["model"]["attention"]["readout_gain_lr"] == 7.0


def test_the_checkpoint_reader_migrates_through_the_one_load_function(tmp_path):
    from fsframework.checkpoints import RunDir, read_config

    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    run.config.write_text(V1_FREESOLO.read_text())
    assert RunDir.holding_config(run.config) == run
    assert RunDir.holding_config(V1_FREESOLO) is None, "a file outside a run directory is a job file"
    assert read_config(run.root).research.copy_warmup_steps == 3
    assert read_config(run.config).research.copy_warmup_steps == 3
    # `fsf config` (as `fsf train`) reads a run's own config.yaml migrated, e.g. to resume it
    proc = run_fsf("config", str(run.config))
    assert "schema_version: 5" in proc.stdout and "copy_warmup_steps: 3" in proc.stdout
    bad = run_fsf("config", str(V1_FREESOLO), check=False)
    assert bad.returncode == 2 and "moved to research.copy_warmup_steps" in bad.stderr


def test_world_size_check_is_shared():
    from fsframework.config import check_world_size

    assert check_world_size(8, 4) == 2
    with pytest.raises(ConfigError, match="world size 6 is not a multiple of parallel.sp=4"):
        check_world_size(6, 4)
    with pytest.raises(ConfigError, match="parallel.sp=0 must be >= 1"):
        check_world_size(4, 0)


# --- schema 4: a kind's own settings in their own group (model.attention.fsb.*, model.attention.rewired.*) ----

# a config.yaml as the schema-3 code saved it, with the flat keys set off their defaults
V3_FLAT = FIXTURES / "config_v3_flat_kind_settings.yaml"
FLAT_KEYS = {  # schema 3 -> schema 4, with the fixture's value
    "model.attention.fsb_top_k": ("model.attention.fsb.top_k", 3),
    "model.attention.fsb_beam_width": ("model.attention.fsb.beam_width", 8),
    "model.attention.fsb_bound_c": ("model.attention.fsb.bound_c", 4.0),
    "model.attention.fsb_forests": ("model.attention.fsb.forests", "ftau"),
    "model.attention.fsb_calibration": ("model.attention.fsb.calibration", "tau.json"),
    "model.attention.rewired_runway": ("model.attention.rewired.runway", "mean"),
    "model.attention.rewired_score": ("model.attention.rewired.score", "bilinear"),
    "model.attention.rewired_head": ("model.attention.rewired.head", 1),
}


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_version_3_flat_kind_settings_are_migrated_into_their_groups():
    import yaml

    from fsframework.config import load_run_config, migrate

    saved = yaml.safe_load(V3_FLAT.read_text())
    assert saved["schema_version"] == 3 and all(k.rpartition(".")[2] in saved["model"]["attention"] for k in FLAT_KEYS)
    cfg = load_run_config(V3_FLAT)
    assert cfg.schema_version == 5
    for new, value in FLAT_KEYS.values():
        assert _get(cfg, new) == value, new
    attention = migrate(saved)["model"]["attention"]
    assert not any(key.startswith(("fsb_", "rewired_")) for key in attention), "no flat key is left behind"
    assert attention["fsb"] == {"top_k": 3, "beam_width": 8, "bound_c": 4.0, "forests": "ftau", "calibration": "tau.json"}
    assert attention["rewired"] == {"runway": "mean", "score": "bilinear", "head": 1}
    # overrides on top of the migrated file use the new keys
    assert load_run_config(V3_FLAT, ["model.attention.fsb.top_k=2"]).model.attention.fsb.top_k == 2
    # a version-1 file had none of these keys: it reads with the defaults
    default = load_run_config(V1_DEFAULT).model.attention
    assert (default.fsb.top_k, default.rewired.runway) == (4, "last")


@pytest.mark.parametrize("old", sorted(FLAT_KEYS))
def test_an_old_flat_kind_setting_fails_in_one_line_naming_its_new_key(old, tmp_path):
    from fsframework.config import load_run_config

    new, value = FLAT_KEYS[old]
    expected = f"config key {old} moved to {new} in schema_version 4; write {new} instead"
    for read in (lambda: load_config(None, [f"{old}={value}"]),
                 lambda: load_config(REPO / "yamls" / "quickstart.yaml", [f"{old}={value}"]),
                 lambda: load_run_config(V3_FLAT, [f"{old}={value}"])):  # `fsf eval RUN KEY=VALUE`
        with pytest.raises(ConfigError) as error:
            read()
        assert str(error.value) == expected
    path = tmp_path / "job.yaml"  # a job file written with the old key
    path.write_text(f"model:\n  attention:\n    {old.rpartition('.')[2]}: {value}\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)


def test_the_cli_names_the_new_key_of_an_old_override():
    proc = run_fsf("config", str(REPO / "yamls" / "rewired-cpu.yaml"), "model.attention.rewired_head=1",
                   "model.attention.fsb_top_k=2", check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "moved to" in line]
    assert len(lines) == 1 and "write model.attention.rewired.head instead" in lines[0] \
        and "write model.attention.fsb.top_k instead" in lines[0], proc.stderr


def test_an_exports_model_config_of_an_older_schema_builds():
    """config.json of an export records the model config and its schema version; an export's
    modeling file from before schema 4 passes the model config alone."""
    import yaml

    from fsframework.config import migrate
    from fsframework.export.remote import model_config_from_dict

    model = yaml.safe_load(V3_FLAT.read_text())["model"]
    for version in (3, None):
        cfg = model_config_from_dict(model, version)
        assert (cfg.attention.fsb.beam_width, cfg.attention.rewired.head) == (8, 1)
    current = migrate(yaml.safe_load(V3_FLAT.read_text()))["model"]
    assert model_config_from_dict(current, 4) == model_config_from_dict(model, 3)


def test_importing_and_validating_the_config_imports_no_torch():
    """The config (its checks included) imports no torch and no model (the kinds are a table of facts),
    so a bad job fails before torch loads."""
    import subprocess
    import sys

    code = f"""
import sys
from pathlib import Path
import fsframework.config as c
from fsframework.config.kinds import KIND_NAMES as MODEL_NAMES
for path in sorted(Path({str(REPO / "yamls")!r}).glob("*.yaml")):
    c.load_config(path)
for name in MODEL_NAMES:
    c.validate(c.load_config(None, ["model.name=" + name]))
c.load_run_config({str(V1_FREESOLO)!r}); c.load_run_config({str(V3_FLAT)!r})
c.to_yaml(c.Config()); c.check_world_size(8, 2)
try:
    c.load_config(None, ["model.attention.fsb.beam_width=1"])
except c.ConfigError:
    pass
else:
    raise SystemExit("no ConfigError")
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "fsframework.models")))
assert not loaded, loaded
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
