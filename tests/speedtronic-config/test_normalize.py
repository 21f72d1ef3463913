from __future__ import annotations

import pytest

from speedtronic_config import ConfigError
from speedtronic_config.normalize import canonical


def test_none_and_empty_give_empty_sections_and_default_flags():
    tree = canonical(None)
    assert tree["run"] == {} and tree["distributed"] == {}
    assert (
        tree["gradient_checkpointing"],
        tree["compile"],
        tree["ooo_backprop"],
        tree["ooo_streams"],
    ) == (False, False, False, 4)


@pytest.mark.parametrize("root", [[1, 2], "text", 3])
def test_non_mapping_root_says_so(root):
    with pytest.raises(ConfigError, match="root must be a mapping"):
        canonical(root)


def test_unknown_root_key_suggests():
    with pytest.raises(ConfigError, match=r"^modle: unknown key; did you mean model\?"):
        canonical({"modle": {}})


@pytest.mark.parametrize("key, nested", [("model.n_layer", "model"), ("run.max_steps", "run")])
def test_a_dotted_root_key_names_the_nested_form(key, nested):
    # The --set / --cuda-overlay form in a config file (configs/quickstart-cuda.yaml is an
    # overlay): was "unknown key; valid keys: <all 25>", or for run.max_steps "did you mean
    # max_steps?".
    field = key.split(".")[1]
    with pytest.raises(ConfigError) as caught:
        canonical({key: 3})
    assert str(caught.value) == (
        f"{key}: unknown key (a dotted name is the --set and --cuda-overlay form); "
        f"nest it in a config file: {nested}: {{{field}: ...}}"
    )


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError) as caught:
        canonical({"model": [{"n_layer": 2}]})  # `- n_layer: 2`: a list item
    assert str(caught.value) == (
        "model: expected a mapping (got [{'n_layer': 2}]); write its fields as `field: value` "
        "lines indented under model:"
    )
    with pytest.raises(ConfigError) as caught:
        canonical({"precision": False})  # `precision: off`, YAML 1.1's false
    assert str(caught.value).endswith("under precision:, or name one, e.g. precision: bf16")
    assert canonical({"model": None})["model"] == {}


def test_top_level_run_aliases_win_over_nested_fields():
    tree = canonical(
        {"run": {"name": "nested", "seed": 1}, "name": "top", "max_steps": 5, "log_every": 2}
    )
    assert tree["run"] == {"name": "top", "seed": 1, "max_steps": 5, "log_every": 2}


@pytest.mark.parametrize("alias", ["hub", "diloco"])
def test_section_aliases_stand_in_for_distributed(alias):
    assert canonical({alias: {"repo_id": "org/x"}})["distributed"] == {"repo_id": "org/x"}


@pytest.mark.parametrize(
    "keys", [("distributed", "hub"), ("distributed", "diloco"), ("hub", "diloco")]
)
def test_section_aliases_are_rejected_next_to_each_other(keys):
    with pytest.raises(ConfigError, match="conflicts with"):
        canonical({key: {} for key in keys})


def test_optimizer_and_precision_shorthands():
    tree = canonical(
        {"optimizer": "muon", "muon_plus": True, "cautious": "true", "precision": "bf16"}
    )
    assert tree["optimizer"] == {"name": "muon", "muon_plus": True, "cautious": True}
    assert tree["precision"] == {"mode": "bf16"}


def test_equal_duplicates_are_fine_and_conflicting_ones_rejected():
    assert canonical({"optimizer": {"name": "muon", "cautious": True}, "cautious": True})[
        "optimizer"
    ]["cautious"]
    with pytest.raises(ConfigError, match=r"^muon_plus: conflicts with optimizer.muon_plus"):
        canonical({"optimizer": {"name": "muon", "muon_plus": False}, "muon_plus": True})


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, True),
        ("false", False),
        ({"enabled": True}, True),
        ({"enabled": "False"}, False),
        ({}, False),
        (" Auto", "auto"),
        ({"enabled": "auto"}, "auto"),
    ],
)
def test_compile_bool_or_mapping(value, expected):
    assert canonical({"compile": value})["compile"] is expected


def test_compile_mapping_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match=r"^compile.enable: unknown key; did you mean enabled\?"):
        canonical({"compile": {"enable": True}})
    with pytest.raises(ConfigError, match="^compile: expected a boolean or auto"):
        canonical({"compile": "fast"})
    with pytest.raises(ConfigError, match="^compile.enabled: expected a boolean or auto"):
        canonical({"compile": {"enabled": 2}})


@pytest.mark.parametrize("flag", ["gradient_checkpointing", "ooo_backprop"])
def test_root_booleans_are_never_truthy_by_accident(flag):
    assert canonical({flag: "false"})[flag] is False
    assert canonical({flag: "True"})[flag] is True
    with pytest.raises(ConfigError, match=f"^{flag}: expected a boolean"):
        canonical({flag: "off"})
