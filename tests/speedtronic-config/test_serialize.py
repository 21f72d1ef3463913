from __future__ import annotations

import os

import yaml

from speedtronic_config import SpeedtronicConfig
from speedtronic_config.serialize import dump_yaml, redact

TOKEN = "hf_very_secret_token_123"


def _secret_config() -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {"distributed": {"enabled": True, "repo_id": "o/r", "token": TOKEN}}
    )


def test_to_dict_is_unredacted_by_default_and_redacts_on_request():
    config = _secret_config()
    assert config.to_dict()["distributed"]["token"] == TOKEN
    safe = config.to_dict(redact_secrets=True)
    assert safe["distributed"]["token"] is None
    assert TOKEN not in repr(safe) and TOKEN not in repr(config)
    assert config.distributed.token == TOKEN  # redaction never touches the live config


def test_yaml_redaction_and_round_trip(tmp_path):
    config = _secret_config()
    assert TOKEN in config.to_yaml()
    text = config.to_yaml(redact_secrets=True)
    assert TOKEN not in text
    assert SpeedtronicConfig.from_dict(yaml.safe_load(config.to_yaml())) == config


def test_save_always_redacts_and_reloads(tmp_path):
    config = _secret_config()
    path = config.save(tmp_path / "nested" / "run.yaml")
    assert path == tmp_path / "nested" / "run.yaml"
    text = path.read_text()
    assert TOKEN not in text
    reloaded = SpeedtronicConfig.from_yaml(path)
    assert reloaded.distributed.token is None
    reloaded.distributed.token = TOKEN
    assert reloaded == config
    assert sorted(os.listdir(path.parent)) == ["run.yaml"]  # no temporary file left behind


def test_yaml_file_round_trip_is_stable(tmp_path):
    config = SpeedtronicConfig.from_dict(
        {"name": "x", "optimizer": "muon", "logging": {"hooks": ["wandb"]}}
    )
    first = config.save(tmp_path / "a.yaml")
    second = SpeedtronicConfig.from_yaml(first).save(tmp_path / "b.yaml")
    assert first.read_text() == second.read_text()


def test_redact_and_dump_helpers():
    assert redact({"distributed": {"token": "t"}}) == {"distributed": {"token": None}}
    assert redact({"run": {}}) == {"run": {}}
    assert yaml.safe_load(dump_yaml({"data": {"dataset": object(), "x": [1, (2, 3)]}})) == {
        "data": {"dataset": None, "x": [1, [2, 3]]}
    }


def test_a_dataset_path_object_is_saved_as_its_path(tmp_path):
    # A pathlib path in data.dataset was written as `dataset: null`: save() lost the data source.
    config = SpeedtronicConfig.from_dict({"data": {"dataset": tmp_path / "train_*.bin"}})
    saved = SpeedtronicConfig.from_yaml(config.save(tmp_path / "run.yaml"))
    assert saved.data.dataset == str(tmp_path / "train_*.bin")
