from __future__ import annotations

import pytest

from speedtronic_config import ConfigError, SpeedtronicConfig, apply_overrides
from speedtronic_config.overrides import override_value, parse_override


def test_overrides_return_a_new_mapping_and_leave_the_input_alone():
    original = {"model": {"n_layer": 2}, "optimizer": {"lr": 0.1}}
    result = apply_overrides(original, ["model.n_layer=6", "optimizer=muon", "max_steps=10"])
    assert result == {
        "model": {"n_layer": 6},
        "optimizer": {"lr": 0.1, "name": "muon"},
        "max_steps": 10,
    }
    assert original == {"model": {"n_layer": 2}, "optimizer": {"lr": 0.1}}
    config = SpeedtronicConfig.from_dict(result)
    assert (config.model.n_layer, config.optimizer.name, config.optimizer.lr) == (6, "muon", 0.1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("data.shuffle=true", True),
        ("optimizer.lr=0.001", 1e-3),
        ("run.name=demo", "demo"),
        ("logging.hooks=[tensorboard, wandb]", ["tensorboard", "wandb"]),
        ("data.text_path=null", None),
        ("run.name='a=b'", "a=b"),
    ],
)
def test_values_are_parsed_as_yaml(text, expected):
    parts, value = parse_override(text)
    assert value == expected
    section, name = parts
    assert apply_overrides({}, [text])[section][name] == expected


def test_exponent_without_a_dot_still_sets_a_number():
    assert (
        SpeedtronicConfig.from_dict(apply_overrides({}, ["optimizer.lr=1e-3"])).optimizer.lr == 1e-3
    )


def test_override_into_shorthands_and_compile():
    assert apply_overrides({"optimizer": "muon"}, ["optimizer.lr=0.01"])["optimizer"] == {
        "name": "muon",
        "lr": 0.01,
    }
    assert apply_overrides({"precision": "bf16"}, ["precision.dtype=fp16"])["precision"] == {
        "mode": "bf16",
        "dtype": "fp16",
    }
    assert apply_overrides({"compile": True}, ["compile.enabled=false"])["compile"] == {
        "enabled": False
    }
    assert apply_overrides({}, ["compile=true"])["compile"] is True
    assert apply_overrides({"precision": {"dtype": "fp16"}}, ["precision=fp32"])["precision"] == {
        "dtype": "fp16",
        "mode": "fp32",
    }


def test_nested_run_override_beats_a_top_level_alias():
    result = apply_overrides({"max_steps": 100}, ["run.max_steps=7"])
    assert SpeedtronicConfig.from_dict(result).run.max_steps == 7


@pytest.mark.parametrize(
    ("raw", "overrides", "written"),
    [
        ({"hub": {"repo_id": "o/r"}}, ["distributed.inner_steps=5"], "hub"),
        # Each of these was refused: `hub: conflicts with distributed`, a spelling the user
        # never wrote twice.
        ({"hub": {"repo_id": "o/r"}}, ["distributed={inner_steps: 5}"], "hub"),
        ({"distributed": {"repo_id": "o/r"}}, ["hub.inner_steps=5"], "distributed"),
        ({"diloco": {"repo_id": "o/r"}}, ["hub={inner_steps: 5}"], "diloco"),
        ({}, ["distributed.repo_id=o/r", "diloco.inner_steps=5"], "distributed"),
    ],
)
def test_a_distributed_override_writes_into_the_spelling_the_config_uses(raw, overrides, written):
    result = apply_overrides(raw, overrides)
    assert result == {written: {"repo_id": "o/r", "inner_steps": 5}}
    assert SpeedtronicConfig.from_dict(result).distributed.inner_steps == 5


def test_scheduler_follows_an_overridden_step_target():
    config = SpeedtronicConfig.from_dict(apply_overrides({"max_steps": 100}, ["max_steps=20"]))
    assert config.scheduler.max_steps == 20


@pytest.mark.parametrize(
    "text, message",
    [
        ("model.n_layers=3", r"^model.n_layers: unknown key; did you mean n_layer\?"),
        ("modle.n_layer=3", r"^modle: unknown key; did you mean model\?"),
        ("n_layer=3", r"^n_layer: unknown key; did you mean model.n_layer\?$"),
        ("model.lr=1", r"^model.lr: unknown key; did you mean optimizer.lr\?$"),
        ("model.n_layer.x=3", r"model.n_layer is not a mapping; set it whole: model.n_layer=VALUE"),
        ("max_steps.x=3", r"max_steps is not a mapping"),
        ("compile.on=1", r"^compile.on: unknown key"),
        ("model.n_layer", r"override must look like section.key=value"),
        ("=3", r"override must look like"),
        ("model..x=1", r"override must look like"),
        ("run.name=[1,", r"value is not valid YAML"),
    ],
)
def test_bad_overrides_are_config_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides({}, [text])


def test_override_into_a_non_mapping_value_and_bad_root():
    with pytest.raises(ConfigError, match="^model: cannot set a field"):
        apply_overrides({"model": 3}, ["model.n_layer=2"])
    with pytest.raises(ConfigError, match="root must be a mapping"):
        apply_overrides([1], ["max_steps=1"])  # type: ignore[arg-type]
    assert apply_overrides(None, []) == {}


@pytest.mark.parametrize(
    "value",
    ["[1,", "{a: [", "@x", "a: b: c", "'unclosed", "2024-13-45", "9" * 5000, "{a: 1, a: 2}"],
)
def test_a_malformed_value_is_one_line_naming_where(value):
    # PyYAML's own message quotes the text over several lines (8 in #19's probe).
    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, [f"run.name={value}"])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("run.name: value is not valid YAML at line 1, column ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # The fix named run.name whatever the key, and followed a fix the problem already gave.
        (
            "data.text_path=a: b: c",
            "data.text_path: value is not valid YAML at line 1, column 5: mapping values are not "
            "allowed here (got 'a: b: c'); quote a string value, e.g. --set "
            "'data.text_path=\"TEXT\"'",
        ),
        (
            "run.seed=010",
            "run.seed: value is not valid YAML at line 1, column 1: an integer with a leading 0 is "
            "octal in YAML 1.1 (010 is 8); write it without the leading zeros, or quote it if it "
            "is text (got '010')",
        ),
    ],
)
def test_a_malformed_value_names_one_fix_for_its_own_key(text, message):
    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, [text])
    assert str(caught.value) == message


@pytest.mark.parametrize("text", ["data.shard_path=", "data.shard_path=  "])
def test_an_empty_value_is_refused_not_read_as_null(text):
    # An unset shell variable (--set data.shard_path=$SHARDS) must not fall back to synthetic data.
    with pytest.raises(ConfigError, match=r"^data.shard_path: empty value.*data.shard_path=null"):
        parse_override(text)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("data.text_path=corpus #2.txt", "'corpus #2.txt'"),  # was read as 'corpus'
        ("data.text_path=#2.txt", "'#2.txt'"),  # was null: synthetic data
        ("logging.hooks=[tensorboard] # wandb", "'[tensorboard] # wandb'"),
        ("distributed.token=hf_a #b", "a str, value hidden"),
    ],
)
def test_a_comment_in_a_value_is_refused_not_cut_off(text, shown):
    # YAML ends a plain value at ` #`: the rest was dropped, and a value that starts with # was
    # null, which falls back to the default as an empty value would.
    key = text.partition("=")[0]
    with pytest.raises(ConfigError) as caught:
        parse_override(text)
    assert str(caught.value) == (
        f"{key}: the # starts a YAML comment, which would cut the value short (got {shown}); "
        f"drop the comment, or quote a value that holds a #, e.g. --set '{key}=\"a #1\"'"
    )


@pytest.mark.parametrize(
    "text, expected",
    [("run.name=a#1", "a#1"), ("run.name='a #1'", "a #1"), ('run.name="#1"', "#1")],
)
def test_a_hash_that_starts_no_comment_stays_in_the_value(text, expected):
    assert parse_override(text)[1] == expected


@pytest.mark.parametrize(
    "text,fix",
    [
        ("run.device=", "give it a value (its default is auto)"),
        ("device=", "give it a value (its default is auto)"),  # the run alias
        ("optimizer=", "give it a value (its default is adamw)"),  # the section's shorthand
        ("model.n_layer=", "give it a value (its default is 4)"),
        ("compile=", "give it a value"),
    ],
)
def test_an_empty_value_for_a_field_that_refuses_null_names_its_default(text, fix):
    with pytest.raises(ConfigError) as caught:
        parse_override(text)
    assert str(caught.value).endswith(f"empty value; {fix}")
    assert "null" not in str(caught.value)


def test_a_mapping_for_a_section_changes_only_the_fields_it_names():
    raw = {"model": {"n_layer": 2, "d_model": 64}, "optimizer": "muon"}
    result = apply_overrides(raw, ["model={n_layer: 6}", "optimizer={lr: 0.01}"])
    assert result["model"] == {"n_layer": 6, "d_model": 64}
    assert result["optimizer"] == {"name": "muon", "lr": 0.01}
    # null still resets a section to its defaults, and then a mapping sets it afresh.
    assert apply_overrides(raw, ["model=null", "model={n_layer: 6}"])["model"] == {"n_layer": 6}


@pytest.mark.parametrize("section", ["optimizer", "precision"])
def test_null_resets_a_shorthand_section_written_as_a_mapping(section):
    # docs/cli.md: `--set model=null` resets a section. For these two it set the shorthand field
    # (`optimizer.name: must not be null`) when the file wrote the section as a mapping.
    raw = {"optimizer": {"name": "muon", "lr": 0.01}, "precision": {"mode": "bf16"}}
    config = SpeedtronicConfig.from_dict(apply_overrides(raw, [f"{section}=null"]))
    assert getattr(config, section) == type(getattr(config, section))()


def test_a_run_mapping_wins_over_the_top_level_aliases_it_names():
    result = apply_overrides({"name": "old", "seed": 3}, ["run={name: new}"])
    assert result == {"seed": 3, "run": {"name": "new"}}
    assert SpeedtronicConfig.from_dict(result).run.name == "new"


@pytest.mark.parametrize(
    "raw, override",
    [
        # 2.0's root-level form, overridden in the section: refused as a conflict.
        ({"optimizer": "muon", "muon_plus": True, "cautious": True}, "optimizer.muon_plus=false"),
        ({"optimizer": "muon", "muon_plus": True}, "optimizer={muon_plus: false}"),
        # and the section's field, overridden in the root-level form.
        ({"optimizer": {"name": "muon", "muon_plus": True}}, "muon_plus=false"),
    ],
)
def test_an_optimizer_override_replaces_a_field_set_in_either_form(raw, override):
    config = SpeedtronicConfig.from_dict(apply_overrides(raw, [override]))
    assert (config.optimizer.name, config.optimizer.muon_plus) == ("muon", False)
    assert config.optimizer.cautious is raw.get("cautious", False)


@pytest.mark.parametrize("depth", [40, 3000])
def test_a_value_nested_too_deeply_is_one_config_error(depth):
    with pytest.raises(ConfigError, match=r"^model.name: is nested more than 32 levels deep"):
        parse_override("model.name=" + "[" * depth + "]" * depth)


@pytest.mark.parametrize(
    "value",
    [
        "/runs/emo\U0001f600/metrics.jsonl",
        "a: b",
        "null",
        "runs/a #1/metrics.jsonl",  # quoted: a bare ` #` is refused as a comment
        # PyYAML wrote a NEL raw in a quoted string and read it back as a space (a
        # --cuda-overlay's run.output_dir, and the metrics path made from it).
        "runs/a\x85b",
        ["x\x85", 3],
        3,
        1e-8,
        None,
        [1, "x"],
        {"a": [1]},
    ],
)
def test_override_value_reads_back_exactly(value):
    assert parse_override(f"run.name={override_value(value)}")[1] == value


def test_a_base_60_override_is_refused():
    # `--set run.max_steps=1:30` ran 90 steps; `run.name=12:30` was refused as 750.
    with pytest.raises(ConfigError, match=r"^run.max_steps: .* base 60 in YAML 1.1"):
        apply_overrides({}, ["run.max_steps=1:30"])
    assert apply_overrides({}, ["run.name='12:30'"]) == {"run": {"name": "12:30"}}
