"""The fast subset of `hatch run reliability` (tools/reliability): a few of each probe, so CI keeps
them honest, and the whole bad-input corpus (run in this process here, seconds: its expected lines
drift with every reworded message, and the README counts its cases). The full run (20 SIGKILL
trials, 2,000 fuzzed inputs, every disk fault) is `hatch run reliability`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "reliability"))
sys.path.insert(0, str(ROOT / "tests" / "speedtronic"))

import corpus  # noqa: E402
import disks  # noqa: E402
import fuzz  # noqa: E402
import harness  # noqa: E402
import kills  # noqa: E402
import secrets_scan  # noqa: E402
import signals  # noqa: E402
from cli_testkit import run_in_process  # noqa: E402


def failed(result: harness.Result) -> list[dict]:
    return [case for case in result.cases if not case.get("ok", True)]


@pytest.fixture(autouse=True)
def fresh_streams():
    """Each probe's secret checks see only its own processes' output."""
    harness.STREAMS.clear()
    harness.INPUTS.clear()
    yield


def test_a_kill_between_write_and_rename_resumes_bit_equal_with_no_temp_left(tmp_path):
    result = kills.run(tmp_path, quick=True, rng=random.Random(19))
    assert result.passed, failed(result)
    rename = next(c for c in result.cases if c["mode"] == "rename")
    assert rename["temp_files_after_kill"] == 1  # the window #19 found: a named temp file
    assert rename["temp_files_after_resume"] == 0 and rename["bit_equal"]


def test_sigterm_and_sigint_checkpoint_and_exit_143_and_130(tmp_path):
    result = signals.run(tmp_path, quick=True, rng=random.Random(19))
    assert result.passed, failed(result)
    assert sorted(c["exit"] for c in result.cases) == [130, 143]


def test_bad_inputs_are_one_line_with_their_exit_code_and_touch_nothing(
    tmp_path, monkeypatch, capfd
):
    # Every case in this process, with a CLI process's environment (the env token set): the cases
    # are refusals, and 88 spawned interpreters, each importing torch, took over a minute.
    environment = harness.child_env(threads=None)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "PYTHONUNBUFFERED"):
        monkeypatch.setenv(name, environment[name])
    monkeypatch.delenv("SPEEDTRONIC_DEBUG", raising=False)

    def run_cli(args, cwd, *, label="", **_):
        monkeypatch.chdir(cwd)
        result = run_in_process(args, capfd)
        harness.STREAMS.append((label, result.stdout + result.stderr))
        return result

    monkeypatch.setattr(corpus, "run_cli", run_cli)
    result = corpus.run(tmp_path, quick=False, rng=random.Random(19))
    assert result.passed, failed(result)
    assert result.figures["cases"] == len(corpus.cases())


def test_fuzzed_configs_are_config_errors_or_sound(tmp_path):
    result = fuzz.run(tmp_path, quick=True, rng=random.Random(19))
    assert result.passed, failed(result)
    assert result.figures["examples"] == 200 and result.figures["valid"] > 0


def test_the_fuzz_oracle_flags_nonsense():
    from speedtronic_config import SpeedtronicConfig

    config = SpeedtronicConfig()
    config.model.n_layer, config.run.name = 10**20, " "  # what 2.0's validation let through
    assert fuzz.nonsense(config) == ["run.name is blank", "model.n_layer=100000000000000000000"]


def test_a_full_disk_and_a_read_only_folder_leave_the_checkpoints_intact(tmp_path):
    result = disks.run(tmp_path, quick=True, rng=random.Random(19))
    assert result.passed, failed(result)


def test_no_fake_token_reaches_a_file_or_a_stream(tmp_path):
    result = secrets_scan.run(tmp_path, quick=True, rng=random.Random(19))
    assert result.passed, failed(result)
    assert result.figures["files"] > 5 and result.figures["archive_members"] > 0


def test_the_secret_scan_finds_a_planted_token(tmp_path):
    import torch

    (tmp_path / "plain.txt").write_text(f"x {harness.TOKENS['env']} y")
    torch.save({"config": {"token": harness.TOKENS["set"]}}, tmp_path / "step_1.pt")
    _, _, members, hits = secrets_scan.scan_files([tmp_path])
    assert members > 0
    assert {hit.rsplit(": ", 1)[1] for hit in hits} == {
        harness.TOKENS["env"],
        harness.TOKENS["set"],
    }
