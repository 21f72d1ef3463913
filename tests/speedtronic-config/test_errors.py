from __future__ import annotations

import pickle
import re

import pytest

from speedtronic_config import SpeedtronicConfig
from speedtronic_config.errors import ConfigError, describe_ranks, unknown_key


def test_config_error_is_a_value_error_with_parts():
    error = ConfigError("model.n_head", "must be positive", value=0, allowed="use 1 or more")
    assert isinstance(error, ValueError)
    assert (error.path, error.value, error.allowed) == ("model.n_head", 0, "use 1 or more")
    assert str(error) == "model.n_head: must be positive (got 0); use 1 or more"


def test_config_error_without_value_or_path():
    assert str(ConfigError("", "root must be a mapping")) == "root must be a mapping"
    assert ConfigError("x", "bad").value is None


def test_config_error_takes_2_0s_single_message():
    # 2.0's ConfigError was a plain ValueError: user factories raise it with one message.
    error = ConfigError("model.n_head must be positive")
    assert str(error) == "model.n_head must be positive" and error.path == ""
    assert str(ConfigError()) == ""


def test_config_error_survives_pickling_with_its_secret_still_hidden():
    error = ConfigError("distributed.token", "bad", value="hf_abcdefgh", allowed="fix it")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ConfigError and str(copy) == str(error) and "hf_" not in str(copy)
    assert (copy.path, copy.problem, copy.value, copy.allowed) == (
        "distributed.token",
        "bad",
        None,
        "fix it",
    )


def test_unknown_key_suggests_closest_name():
    error = unknown_key("model", "n_layers", ["n_layer", "n_head", "d_model"])
    assert str(error) == "model.n_layers: unknown key; did you mean n_layer?"
    assert error.path == "model.n_layers"


def test_unknown_key_lists_valid_keys_when_nothing_is_close():
    error = unknown_key("", "zzzz", ["run", "model"])
    assert "valid keys: model, run" in str(error)
    with pytest.raises(ConfigError):
        raise error


def test_control_characters_in_a_key_stay_on_one_line():
    # Found by the reliability fuzzer: an override key holding a newline split the message.
    error = unknown_key("compile", "a\nb\x89", ["enabled"])
    assert str(error) == "compile.a\\nb\\x89: unknown key; valid keys: enabled"
    assert error.path == "compile.a\nb\x89"


def test_a_huge_value_is_shown_short_and_never_breaks_the_message():
    # repr of an int past 4,300 digits raises ValueError; a 400-digit one spans the line.
    for value, shown in ((10**5000, "got an integer of about 5000 digits)"), (10**400, "...)")):
        with pytest.raises(ConfigError, match=re.escape(shown)) as caught:
            SpeedtronicConfig.from_dict({"optimizer": {"lr": value}})
        assert len(str(caught.value)) < 140


def test_ranks_that_disagree_are_described_by_value_in_order_of_appearance():
    assert describe_ranks(["bf16", "fp32", "bf16", None]) == (
        "bf16 on rank 0, 2; fp32 on rank 1; None on rank 3"
    )
    assert describe_ranks(["step_3.pt"]) == "step_3.pt on rank 0"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # A key in the wrong case listed every valid key (`RUN` is nothing like `run` to difflib).
        ({"RUN": {}}, "RUN: unknown key; did you mean run?"),
        ({"model": {"N_LAYER": 2}}, "model.N_LAYER: unknown key; did you mean n_layer?"),
    ],
)
def test_a_suggestion_ignores_case(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        SpeedtronicConfig.from_dict(values)


def test_a_boolean_key_is_named_as_one_with_the_fix():
    # `yes: 3` in the model section read "model.True: unknown key; valid keys: ...": a key the
    # user never wrote, and no reason why.
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict({"model": {True: 3}})
    assert str(caught.value).startswith(
        "model.True: unknown key, a boolean: YAML 1.1 reads a bare yes, no, on, off, true or false "
        "as a boolean; quote the key, or give the setting's name: valid keys: d_ff"
    )
