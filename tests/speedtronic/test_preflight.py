"""Every folder a run writes is probed before the first step (#19: found at the first checkpoint,
after checkpoint.every_steps steps were lost)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speedtronic.preflight import check_output_paths, output_folders
from speedtronic_config import ConfigError, SpeedtronicConfig


def config(tmp_path: Path, **sections) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict({"output_dir": str(tmp_path / "run"), **sections})


def test_every_folder_the_run_writes_is_listed(tmp_path):
    cfg = config(
        tmp_path,
        logging={"file": str(tmp_path / "logs" / "run.log"), "json_file": "m/metrics.jsonl"},
        distributed={
            "enabled": True,
            "repo_id": "org/run",
            "transport": "filesystem",
            "endpoint": str(tmp_path / "shared"),
            "node_id": "w1",
        },
    )
    assert output_folders(cfg) == [
        ("run.output_dir", tmp_path / "run"),
        ("checkpoint.directory", tmp_path / "run" / "checkpoints"),
        ("logging.file", tmp_path / "logs"),
        ("logging.json_file", Path("m")),
        ("distributed.state_dir", tmp_path / "run" / ".speedtronic" / "diloco" / "w1"),
        ("distributed.endpoint", tmp_path / "shared" / "org" / "run"),
    ]
    without = config(tmp_path, checkpoint={"enabled": False, "directory": "/elsewhere"})
    assert [setting for setting, _ in output_folders(without)] == ["run.output_dir"]


def test_writable_folders_are_created_and_left_clean(tmp_path):
    check_output_paths(config(tmp_path, checkpoint={"directory": str(tmp_path / "ck")}))
    assert list((tmp_path / "ck").iterdir()) == []
    assert (tmp_path / "run").is_dir()


def test_a_folder_under_a_file_names_the_setting(tmp_path):
    (tmp_path / "run").write_text("a file where the output folder should be")
    with pytest.raises(
        ConfigError,
        match=r"^run.output_dir: cannot write to .*run \(.*run is a file, not a folder\)",
    ):
        check_output_paths(config(tmp_path))


def test_an_unwritable_checkpoint_folder_names_its_setting(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    cfg = config(tmp_path, checkpoint={"directory": str(blocker / "checkpoints")})
    with pytest.raises(ConfigError) as caught:
        check_output_paths(cfg)
    assert caught.value.path == "checkpoint.directory"
    assert "nothing was trained" in str(caught.value)


@pytest.mark.parametrize("setting", ["file", "json_file"])
def test_a_log_file_that_is_a_folder_names_its_setting_and_creates_nothing(tmp_path, setting):
    folder = tmp_path / "logs"
    folder.mkdir()
    with pytest.raises(ConfigError) as caught:
        check_output_paths(config(tmp_path, logging={setting: str(folder)}))
    assert str(caught.value) == (
        f"logging.{setting}: {folder} is a folder; name a file; nothing was trained"
    )
    assert not (tmp_path / "run").exists()  # checked before any folder is created


def test_a_file_in_the_way_of_the_shared_folder_repository_names_the_endpoint(tmp_path):
    (tmp_path / "shared" / "org").mkdir(parents=True)
    (tmp_path / "shared" / "org" / "run").write_text("not the repository")
    distributed = {"enabled": True, "repo_id": "org/run", "transport": "filesystem"}
    cfg = config(tmp_path, distributed={**distributed, "endpoint": str(tmp_path / "shared")})
    with pytest.raises(ConfigError, match=r"^distributed.endpoint: cannot write to .*org/run"):
        check_output_paths(cfg)


@pytest.mark.parametrize("mode", ["disabled", "single"])
def test_diloco_switched_off_by_mode_writes_no_node_state(tmp_path, mode):
    # 2.0 switches DiLoCo off with mode: disabled/single even when enabled: true; such a run has
    # no node: no state folder, and no shared folder (endpoint is not required then).
    distributed = {"enabled": True, "mode": mode, "transport": "filesystem"}
    cfg = config(tmp_path, distributed=distributed)
    assert [setting for setting, _ in output_folders(cfg)] == [
        "run.output_dir",
        "checkpoint.directory",
    ]
    check_output_paths(cfg)
    assert not (tmp_path / "run" / ".speedtronic").exists()
