from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speedtronic_config import (
    ConfigError,
    DataConfig,
    DistributedConfig,
    ModelConfig,
    RunConfig,
    SchedulerConfig,
    SpeedtronicConfig,
    apply_overrides,
)
from speedtronic_config.normalize import ROOT_KEYS, SECTIONS, field_names


def test_defaults():
    config = SpeedtronicConfig()
    assert config.scheduler.max_steps == 1000 and config.scheduler.follows_target
    assert (config.data.block_size, config.data.vocab_size, config.data.seed) == (128, 512, 1234)
    assert (
        config.gradient_checkpointing,
        config.compile,
        config.ooo_backprop,
        config.ooo_streams,
    ) == (False, False, False, 4)
    assert config.accumulation_steps == 1


def test_normalization_fills_data_from_model_and_run():
    config = SpeedtronicConfig.from_dict(
        {"seed": 7, "model": {"max_seq_len": 64, "vocab_size": 99}}
    )
    assert (config.data.block_size, config.data.vocab_size, config.data.seed) == (64, 99, 7)
    explicit = SpeedtronicConfig.from_dict(
        {"model": {"max_seq_len": 64}, "data": {"block_size": 16, "seed": 3}}
    )
    assert (explicit.data.block_size, explicit.data.seed) == (16, 3)


@pytest.mark.parametrize("name", ["reference_transformer", "gpt"])  # gpt: its built-in alias
def test_a_block_longer_than_the_reference_models_context_is_refused(name):
    refused = r"data.block_size: is longer than model.max_seq_len \(64\)"
    model = {"name": name, "max_seq_len": 64}
    with pytest.raises(ConfigError, match=refused):
        SpeedtronicConfig.from_dict({"model": model, "data": {"block_size": 128}})
    # Another registered model decides its own context.
    custom = {"model": {"name": "mine", "max_seq_len": 64}, "data": {"block_size": 128}}
    assert SpeedtronicConfig.from_dict(custom).data.block_size == 128


def test_a_data_vocabulary_larger_than_the_reference_models_is_refused():
    refused = r"data.vocab_size: is larger than model.vocab_size \(384\).*raise model.vocab_size"
    with pytest.raises(ConfigError, match=refused):
        SpeedtronicConfig.from_dict({"model": {"vocab_size": 384}, "data": {"vocab_size": 385}})
    smaller = {"model": {"vocab_size": 384}, "data": {"vocab_size": 300}}
    assert SpeedtronicConfig.from_dict(smaller).data.vocab_size == 300
    custom = {"model": {"name": "mine", "vocab_size": 384}, "data": {"vocab_size": 385}}
    assert SpeedtronicConfig.from_dict(custom).data.vocab_size == 385


def test_log_every_copies_only_onto_the_default_cadence():
    assert SpeedtronicConfig.from_dict({"log_every": 10}).logging.every_steps == 10
    assert (
        SpeedtronicConfig.from_dict(
            {"log_every": 10, "logging": {"every_steps": 5}}
        ).logging.every_steps
        == 5
    )


def test_enabled_single_becomes_master():
    config = SpeedtronicConfig.from_dict({"distributed": {"enabled": True, "repo_id": "o/r"}})
    assert config.distributed.role == "master"
    assert SpeedtronicConfig().distributed.role == "single"
    worker = SpeedtronicConfig.from_dict(
        {"hub": {"enabled": True, "repo_id": "o/r", "role": "worker"}}
    )
    assert worker.distributed.role == "worker"


@pytest.mark.parametrize(
    "values", [{"gradient_checkpointing": True}, {"model": {"gradient_checkpointing": True}}]
)
def test_either_gradient_checkpointing_flag_sets_both(values):
    config = SpeedtronicConfig.from_dict(values)
    assert config.gradient_checkpointing and config.model.gradient_checkpointing


def test_scheduler_horizon_follows_the_step_target_unless_given():
    assert SpeedtronicConfig.from_dict({"max_steps": 10}).scheduler.max_steps == 10
    assert (
        SpeedtronicConfig.from_dict({"max_steps": 10, "data": {"max_steps": 6}}).scheduler.max_steps
        == 6
    )
    kept = SpeedtronicConfig.from_dict({"max_steps": 10, "scheduler": {"max_steps": 1000}})
    assert kept.scheduler.max_steps == 1000 and not kept.scheduler.follows_target


def test_scheduler_horizon_follows_from_python_and_after_mutation():
    config = SpeedtronicConfig(run=RunConfig(max_steps=10))
    assert config.scheduler.max_steps == 10
    config.run.max_steps = 30  # what a CLI --max-steps does
    assert config.validate() is config and config.scheduler.max_steps == 30
    explicit = SpeedtronicConfig(
        run=RunConfig(max_steps=10), scheduler=SchedulerConfig(max_steps=50)
    )
    assert explicit.validate().scheduler.max_steps == 50


def test_a_horizon_assigned_in_python_is_kept_even_at_the_followed_value():
    # docs/migrating.md restores 2.0's schedule with "set scheduler.max_steps explicitly"; an
    # assignment equal to the value it followed (1000, the default target) was taken for unset,
    # and the run.max_steps edit below moved it to 3000 silently.
    config = SpeedtronicConfig()
    config.scheduler.max_steps = 1000
    config.run.max_steps = 3000
    assert config.validate().scheduler.max_steps == 1000
    assert config.to_dict()["scheduler"]["max_steps"] == 1000
    config.scheduler.max_steps = None  # unset again: follows the target
    assert config.validate().scheduler.max_steps == 3000 and config.scheduler.follows_target


def test_derived_fields_follow_their_source_after_mutation():
    # build_runtime validates an edited config: derived fields kept the old source's value, so a
    # raised max_seq_len trained at the old length and a smaller one or vocab_size was refused.
    config = SpeedtronicConfig(data=DataConfig(seed=5))
    config.model.max_seq_len, config.model.vocab_size, config.run.seed = 512, 256, 7
    config.model.n_head, config.model.d_model = 4, 512
    config.validate()
    assert (config.data.block_size, config.data.vocab_size) == (512, 256)
    assert (config.model.n_kv_head, config.model.d_ff) == (4, 2048)
    assert config.data.seed == 5  # set: kept
    config.data.block_size = 100  # set now: kept from here on
    config.model.max_seq_len = 1024
    assert config.validate().data.block_size == 100
    explicit = SpeedtronicConfig.from_dict({"data": {"block_size": 128}})
    explicit.model.max_seq_len = 256
    assert explicit.validate().data.block_size == 128


def test_sections_may_be_given_as_mappings_but_not_other_types():
    config = SpeedtronicConfig(model={"n_layer": 2})  # type: ignore[arg-type]
    assert isinstance(config.model, ModelConfig) and config.model.n_layer == 2
    with pytest.raises(ConfigError, match="^model: expected a ModelConfig"):
        SpeedtronicConfig(model=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^model.n_layers: unknown key; did you mean n_layer"):
        SpeedtronicConfig(model={"n_layers": 2})  # type: ignore[arg-type]


def test_root_flags_are_validated():
    assert SpeedtronicConfig.from_dict({"compile": {"enabled": "true"}}).compile is True
    assert SpeedtronicConfig(compile="false").compile is False  # type: ignore[arg-type]
    for streams in (0, 9):
        with pytest.raises(ConfigError, match="^ooo_streams: must be between 1 and 8"):
            SpeedtronicConfig.from_dict({"ooo_streams": streams})
    assert SpeedtronicConfig.from_dict({"ooo_streams": 8, "ooo_backprop": True}).ooo_streams == 8


def test_compile_mode_is_checked_and_kept_through_a_round_trip():
    config = SpeedtronicConfig.from_dict({"compile": "auto", "compile_mode": "Max-Autotune"})
    assert (config.compile, config.compile_mode) == ("auto", "max-autotune")
    assert SpeedtronicConfig.from_dict(config.to_dict()).compile_mode == "max-autotune"
    assert SpeedtronicConfig().compile_mode == "default"
    with pytest.raises(ConfigError, match="^compile_mode: unsupported value .got 'fast'.; choose"):
        SpeedtronicConfig.from_dict({"compile": True, "compile_mode": "fast"})
    # A mode without compiling would be ignored in silence.
    with pytest.raises(ConfigError, match="^compile_mode: has no effect while compile is false"):
        SpeedtronicConfig.from_dict({"compile_mode": "reduce-overhead"})
    config = SpeedtronicConfig(compile=True, compile_mode="reduce-overhead")
    config.compile = False
    with pytest.raises(ConfigError, match="^compile_mode: has no effect"):
        config.validate()
    hint = "^compile.mode: unknown key; set compile_mode at the top level$"
    with pytest.raises(ConfigError, match=hint):
        SpeedtronicConfig.from_dict({"compile": {"enabled": True, "mode": "max-autotune"}})
    with pytest.raises(ConfigError, match=hint):
        apply_overrides({"compile": True}, ["compile.mode=max-autotune"])
    values = apply_overrides({"compile": True}, ["compile_mode=reduce-overhead"])
    assert SpeedtronicConfig.from_dict(values).compile_mode == "reduce-overhead"


def test_validate_rechecks_sections_after_mutation():
    config = SpeedtronicConfig()
    config.model.dropout = 1.5
    with pytest.raises(ConfigError, match="^model.dropout: must satisfy"):
        config.validate()
    config = SpeedtronicConfig()
    config.run.max_steps = 0
    with pytest.raises(ConfigError, match="^run.max_steps"):
        config.validate()


def test_unknown_nested_key_suggests_the_valid_name():
    with pytest.raises(ConfigError, match=r"^model.n_layers: unknown key; did you mean n_layer\?$"):
        SpeedtronicConfig.from_dict({"model": {"n_layers": 3}})
    with pytest.raises(ConfigError, match=r"^distributed.tokn: unknown key; did you mean token\?$"):
        SpeedtronicConfig.from_dict({"hub": {"tokn": "x"}})


@pytest.mark.parametrize(
    "values, message",
    [
        # A field in the wrong place listed every valid key, or a close name that was not it.
        ({"lr": 0.01}, "lr: unknown key; did you mean optimizer.lr?"),
        (
            {"model": {"warmup_steps": 5}},
            "model.warmup_steps: unknown key; did you mean scheduler.warmup_steps?",
        ),
        (
            {"every_steps": 5},
            "every_steps: unknown key; did you mean checkpoint.every_steps or logging.every_steps?",
        ),
    ],
)
def test_a_field_of_another_section_names_that_section(values, message):
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict(values)
    assert str(caught.value) == message


def test_muon_shorthand_forms_are_equivalent():
    short = SpeedtronicConfig.from_dict({"optimizer": "muon", "muon_plus": True, "cautious": True})
    long = SpeedtronicConfig.from_dict(
        {"optimizer": {"name": "muon", "muon_plus": True, "cautious": True}}
    )
    assert short == long and short.optimizer.muon_plus
    with pytest.raises(ConfigError, match="^optimizer.muon_plus: requires optimizer.name: muon"):
        SpeedtronicConfig.from_dict({"muon_plus": True})


def test_precision_shorthand():
    assert SpeedtronicConfig.from_dict({"precision": "bf16"}).precision.mode == "bf16"
    with pytest.raises(ConfigError, match="^precision.mode: unsupported value"):
        SpeedtronicConfig.from_dict({"precision": "fp64"})


def test_2_1_fields_load():
    config = SpeedtronicConfig.from_dict(
        {
            "run": {"nonfinite_loss": "skip"},
            "data": {
                "shard_path": "d/train_*.bin",
                "val_shard_path": "d/val_*.bin",
                "val_text_path": "v.txt",
                "eval_every": 50,
                "eval_steps": 5,
            },
            "scheduler": {"name": "wsd", "decay_ratio": 0.3},
            "checkpoint": {"save_final": False, "save_on_signal": "false"},
            "logging": {"hooks": ["tensorboard"], "progress": False},
            "distributed": {"transport": "filesystem", "endpoint": "/mnt/x", "staleness_limit": 1},
        }
    )
    assert config.run.nonfinite_loss == "skip" and config.data.eval_every == 50
    assert config.scheduler.decay_ratio == 0.3 and config.checkpoint.save_on_signal is False
    assert config.logging.hooks == ["tensorboard"] and config.distributed.staleness_limit == 1


def test_dict_round_trip_is_exact():
    values = {
        "name": "demo",
        "max_steps": 12,
        "model": {"n_head": 4, "d_model": 64, "n_kv_head": 2},
        "data": {"micro_batch_size": 2, "target_batch_size": 8},
        "optimizer": "muon",
        "distributed": {"enabled": True, "repo_id": "o/r", "token": "hf_x"},
        "compile": {"enabled": True},
    }
    config = SpeedtronicConfig.load(values)
    again = SpeedtronicConfig.from_dict(config.to_dict())
    assert again == config and again.to_dict() == config.to_dict()
    assert again.scheduler.follows_target  # "not given" survives the round trip
    assert again.accumulation_steps == 4


def test_round_trip_keeps_a_following_horizon_following():
    config = SpeedtronicConfig.from_dict({"max_steps": 12})
    tree = config.to_dict()
    assert tree["scheduler"]["max_steps"] is None
    tree["run"]["max_steps"] = 40
    assert SpeedtronicConfig.from_dict(tree).scheduler.max_steps == 40


def test_from_dict_does_not_share_lists_with_the_input():
    hooks = ["wandb"]
    config = SpeedtronicConfig.from_dict({"logging": {"hooks": hooks}})
    config.logging.hooks.append("tensorboard")
    assert hooks == ["wandb"]


def test_dataset_object_is_kept_programmatically():
    marker = object()
    assert SpeedtronicConfig(data=DataConfig(dataset=marker)).data.dataset is marker


def test_distributed_section_from_python():
    config = SpeedtronicConfig(distributed=DistributedConfig(enabled=True, repo_id="o/r"))
    assert config.distributed.role == "master"


# Keys drawn mostly from the schema so the property reaches deep validation, not only unknown keys.
_SECTION_KEYS = sorted(
    {name for cls in SECTIONS.values() for name in field_names(cls)} | {"enabled"}
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 2**33)
    | st.floats(allow_nan=True)
    | st.sampled_from(
        ["true", "False", "auto", "muon", "bf16", "wsd", "tensorboard", "1e-3", "", "x"]
    )
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(_SECTION_KEYS) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_sections = st.dictionaries(st.sampled_from(_SECTION_KEYS), _values, max_size=4)
_roots = st.dictionaries(
    st.sampled_from(sorted(ROOT_KEYS)) | st.text(max_size=5), _sections | _values, max_size=5
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_roots)
def test_arbitrary_mappings_give_a_config_or_a_config_error(values):
    try:
        config = SpeedtronicConfig.from_dict(values)
    except ConfigError:
        return
    assert SpeedtronicConfig.from_dict(config.to_dict()) == config
