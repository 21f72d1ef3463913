from __future__ import annotations

import pytest

from speedtronic_config import ConfigError, SpeedtronicConfig, apply_overrides
from speedtronic_config.secrets import describe_hidden, is_secret_path

TOKEN = "hf_FAKEfakeFAKE0123456789"


@pytest.mark.parametrize(
    "path",
    ["distributed.token", "hub.token", "diloco.token", "distributed", "hub", " distributed.token"]
    + ["distributed.token:hf_x", "distributed.token[0]"],
)
def test_secret_paths(path):
    assert is_secret_path(path)


@pytest.mark.parametrize(
    "path", ["distributed.repo_id", "run.name", "model", "token", "", "--set", "tokens.x"]
)
def test_other_paths_are_not_secret(path):
    assert not is_secret_path(path)


def test_describe_hidden_names_only_the_type():
    assert describe_hidden(123456789012345) == "an int, value hidden"
    assert describe_hidden([1]) == "a list, value hidden"


@pytest.mark.parametrize(
    "override",
    [
        "distributed.token=123456789012345",  # #19: echoed as "expected a string (got ...)"
        f"distributed.token=@{TOKEN}",  # not valid YAML: PyYAML quoted it, then so did we
        f"distributed.token=[{TOKEN}, x]",
        f"distributed.token={{a: {TOKEN}}}",
        f"distributed.token={TOKEN}\x00",
        f"hub.token=[{TOKEN}]",
        f"distributed={TOKEN}",
        f"distributed.token:{TOKEN}",  # a typo for '='
    ],
)
def test_a_malformed_secret_is_never_echoed(override):
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict(apply_overrides({}, [override]))
    message = str(caught.value)
    assert TOKEN not in message and "123456789012345" not in message
    assert "\n" not in message
    assert caught.value.value is None


def test_a_valid_secret_is_accepted_and_other_values_are_still_shown():
    config = SpeedtronicConfig.from_dict(apply_overrides({}, [f"distributed.token={TOKEN}"]))
    assert config.distributed.token == TOKEN
    with pytest.raises(ConfigError, match=r"\(got 'x'\)"):
        SpeedtronicConfig.from_dict({"distributed": {"repo_id": "a", "role": "x"}})
