from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speedtronic_trainer import (
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)

# Sharded checkpoints come from fsdp runs (torch>=2.7); these tests write one in one process with
# dcp.save(no_dist=True), also new in 2.7.
needs_sharded_torch = pytest.mark.skipif(
    torch.__version__ < (2, 7), reason="writes a sharded checkpoint with torch>=2.7's dcp.save"
)


def state(step: int) -> dict:
    return {"step": step, "weights": torch.full((3,), float(step))}


def test_should_save_only_on_exact_positive_interval():
    manager = CheckpointManager("unused", every_steps=3)
    assert [s for s in range(10) if manager.should_save(s)] == [3, 6, 9]
    assert not CheckpointManager("unused", every_steps=3, enabled=False).should_save(3)


def test_bad_arguments_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="every_steps"):
        CheckpointManager("x", every_steps=0)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager("x", keep_last=0)


def test_save_writes_step_file_and_latest_pointer(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt", every_steps=1)
    path = manager.save(4, state(4))
    assert path == manager.path_for(4) == tmp_path / "ckpt" / "step_4.pt"
    assert json.loads((tmp_path / "ckpt" / "latest").read_text()) == {
        "step": 4,
        "file": "step_4.pt",
    }
    assert manager.latest_path() == path
    loaded = manager.load_latest()
    assert loaded["step"] == 4 and torch.equal(loaded["weights"], state(4)["weights"])
    assert loaded["checkpoint_path"] == str(path)
    assert not [
        p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")
    ]  # no temp files left


def test_pointer_wins_over_file_order_and_damaged_pointer_falls_back(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(10, state(10))
    manager.save(2, state(2))  # e.g. a rewind: the pointer, not the highest number, is the truth
    assert manager.load_latest()["step"] == 2
    (tmp_path / "latest").write_text("{not json")
    assert manager.latest_path() == tmp_path / "step_10.pt"


def test_prune_keeps_the_newest_and_the_pointed_file(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        manager.save(step, state(step))
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_3.pt", "step_4.pt"]
    unlimited = CheckpointManager(tmp_path, keep_last=None)
    unlimited.save(5, state(5))
    unlimited.prune()
    assert len(list(tmp_path.glob("step_*.pt"))) == 3


def test_prune_keeps_keep_last_of_this_runs_own_beside_an_earlier_runs_later_steps(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 20, 30):  # an earlier run's
        manager.save(step, state(step))
    for step in (1, 2, 3):  # a run started fresh in the same folder
        manager.save(step, state(step))
    # Its own two newest stay for a fallback; the earlier run's are left as they were.
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == [
        "step_2.pt",
        "step_20.pt",
        "step_3.pt",
        "step_30.pt",
    ]


def test_load_latest_is_none_without_checkpoints(tmp_path):
    assert CheckpointManager(tmp_path / "missing").load_latest() is None
    assert CheckpointManager(tmp_path / "missing").latest_path() is None


def test_truncated_latest_raises_naming_the_file_and_resume_falls_back(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(1, state(1))
    path = manager.save(2, state(2))
    path.write_bytes(path.read_bytes()[:40])  # a preempted copy, truncated
    with pytest.raises(CheckpointError, match="step_2.pt"):
        manager.load(path)
    warnings: list[str] = []
    loaded = manager.load_latest(warn=warnings.append)
    assert loaded["step"] == 1
    assert len(warnings) == 1 and warnings[0].endswith("; trying an older checkpoint")
    assert "step_2.pt" in warnings[0] and "delete it" not in warnings[0]  # one advice, not two


def test_a_latest_pointer_naming_a_deleted_file_is_reported_in_one_line(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(8, state(8))
    manager.save(10, state(10)).unlink()  # deleted by hand: its two steps are not in step_8
    warnings: list[str] = []
    assert manager.load_latest(warn=warnings.append)["step"] == 8
    assert warnings == [
        f"`latest` in {tmp_path} names step_10.pt, which does not exist; resuming from the "
        "newest checkpoint there, step_8.pt"
    ]
    (tmp_path / "latest").write_text("{not json")
    warnings.clear()
    assert manager.load_latest(warn=warnings.append)["step"] == 8
    assert len(warnings) == 1 and "`latest` in" in warnings[0] and "unreadable" in warnings[0]
    # Every step file gone (deleted by hand to free space): the pointer is the only trace of the
    # run, and a resume that starts at step 0 says why.
    (tmp_path / "latest").write_text('{"step": 10, "file": "step_10.pt"}')
    (tmp_path / "step_8.pt").unlink()
    warnings.clear()
    assert manager.load_latest(warn=warnings.append) is None
    assert warnings == [
        f"`latest` in {tmp_path} names step_10.pt, which does not exist, and no other checkpoint "
        "is there"
    ]


def test_a_corrupt_latest_falls_back_to_an_older_checkpoint_never_a_newer_one(tmp_path):
    # step_10 is an earlier run's, which this run (steps 1 and 2) started fresh beside.
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(10, state(10))
    manager.save(1, state(1))
    manager.save(2, state(2)).write_bytes(b"garbage")
    warnings: list[str] = []
    assert manager.load_latest(warn=warnings.append)["step"] == 1
    assert len(warnings) == 1 and "step_2.pt" in warnings[0]
    (tmp_path / "step_1.pt").unlink()
    with pytest.raises(CheckpointError, match="no loadable checkpoint") as refused:
        manager.load_latest(warn=warnings.append)
    assert str(refused.value).endswith(
        "not tried: step_10.pt, past the step `latest` names (an earlier run's); to go on, put an "
        "undamaged copy of one there, or start a new run in another run.output_dir"
    )


def test_fallback_is_reported_in_one_line_on_stderr_by_default(tmp_path, capsys):
    # 2.0 used warnings.warn: "file:line: RuntimeWarning: ..." plus the source line (#19).
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(1, state(1))
    manager.save(2, state(2)).write_bytes(b"garbage")
    assert manager.load_latest()["step"] == 1
    err = capsys.readouterr().err
    assert err.startswith("warning: checkpoint ") and len(err.splitlines()) == 1


def test_every_checkpoint_corrupt_is_an_error_naming_each_and_the_fix(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1)).write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as refused:
        manager.load_latest(warn=lambda message: None)
    message = str(refused.value)
    assert message.startswith(f"no loadable checkpoint in {tmp_path}: checkpoint {tmp_path}/step_1")
    assert "\n" not in message and message.endswith(
        "; to go on, put an undamaged copy of one there, or start a new run in another "
        "run.output_dir"
    )


def test_bytes_changed_inside_a_tensor_fail_its_crc_and_resume_falls_back(tmp_path):
    # The file's layout stays whole, so torch loads it (it records each record's CRC-32 but never
    # checks it): the run would resume with a damaged weight, or fail on an invalid RNG state.
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(1, state(1))
    path = manager.save(2, {"step": 2, "weights": torch.full((64,), 2.0)})
    data = bytearray(path.read_bytes())
    data[data.index(torch.full((64,), 2.0).numpy().tobytes()) + 9] ^= 0x10  # one bit flipped
    path.write_bytes(bytes(data))
    warnings: list[str] = []
    assert manager.load_latest(warn=warnings.append)["step"] == 1
    assert warnings == [
        f"checkpoint {path} is corrupt (archive/data/0 fails the CRC-32 check torch.save recorded "
        "for it: its bytes changed after it was written); trying an older checkpoint"
    ]
    # A file saved with torch.serialization.set_crc32_options(False) records none: not checked.
    computed = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        manager.save(3, state(3))
    finally:
        torch.serialization.set_crc32_options(computed)
    assert manager.load_latest(warn=warnings.append)["step"] == 3 and len(warnings) == 1


class NotATensor:
    pass


def test_loading_is_weights_only(tmp_path):
    path = tmp_path / "step_1.pt"
    torch.save(
        {"step": 1, "payload": NotATensor()}, path
    )  # pickled code would run on an unsafe load
    with pytest.raises(CheckpointError, match="holds pickled objects a Speedtronic checkpoint"):
        CheckpointManager(tmp_path).load(path)


def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from speedtronic_trainer import checkpoint

    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(4, state(4))

    def full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_torch_save", full)
    with pytest.raises(CheckpointError) as caught:
        manager.save(8, state(8))
    assert str(caught.value) == (
        f"no space left on {tmp_path} while writing step 8; the previous checkpoint is intact "
        "(step_4.pt)"
    )
    assert manager.load_latest()["step"] == 4


def test_a_failed_write_names_only_a_checkpoint_of_this_run_as_intact(tmp_path, monkeypatch):
    import errno

    from speedtronic_trainer import checkpoint

    earlier = CheckpointManager(tmp_path, keep_last=None)
    for step in (2, 3):
        earlier.save(step, state(step))
    (tmp_path / "step_3.pt").write_bytes(b"torn")  # `latest` names a damaged file
    resumed, fresh = CheckpointManager(tmp_path), CheckpointManager(tmp_path)
    assert resumed.load_latest(warn=lambda line: None)["step"] == 2  # fell back from step_3.pt

    def full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_torch_save", full)
    failed = {}
    for name, manager, step in [("resumed", resumed, 4), ("fresh", fresh, 1)]:
        with pytest.raises(CheckpointError) as caught:
            manager.save(step, state(step))
        failed[name] = str(caught.value).split("; ")[1]
    assert failed == {
        "resumed": "the previous checkpoint is intact (step_2.pt)",  # not the damaged step_3.pt
        "fresh": "no checkpoint of this run was written (step_3.pt is an earlier run's)",
    }


def test_a_digest_tells_copies_of_a_save_from_another_save_of_the_step(tmp_path):
    import shutil

    from speedtronic_trainer.checkpoint import checkpoint_digest

    digests = {}
    for crc32 in (True, False):  # without CRC-32s in the file, its bytes are hashed
        torch.serialization.set_crc32_options(crc32)
        try:
            for attempt in (1, 2):  # the same step saved twice, with other weights
                path = tmp_path / f"{crc32}{attempt}" / "step_3.pt"
                CheckpointManager(path.parent).save(3, state(3 + attempt))
                copy = shutil.copy(path, tmp_path / f"{crc32}{attempt}.pt")
                digests[crc32, attempt] = checkpoint_digest(path)
                assert checkpoint_digest(copy) == digests[crc32, attempt]
        finally:
            torch.serialization.set_crc32_options(True)
    assert len(set(digests.values())) == len(digests)


def test_a_checkpoint_folder_removed_while_listed_holds_no_checkpoints(tmp_path, monkeypatch):
    # A peer rank's trainer that ends removes the empty folder it made, between any check here
    # for the folder and the listing (seen once in a data-parallel test: FileNotFoundError).
    gone = tmp_path / "checkpoints"
    monkeypatch.setattr(Path, "is_dir", lambda self: self == gone or Path.exists(self))
    assert CheckpointManager(gone).checkpoint_paths() == []
    assert CheckpointManager(gone).latest_path() is None


def test_pruning_removes_temp_files_an_interrupted_save_left(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    stale = [tmp_path / ".step_3.pt.0a1b2c3d4e5f.tmp", tmp_path / ".latest.abcdef.tmp"]
    for path in stale:
        path.write_bytes(b"x" * 100)  # a kill between the write and the rename leaves these
    foreign = tmp_path / ".other.tmp"
    foreign.write_bytes(b"keep")
    manager.save(1, state(1))
    assert not any(path.exists() for path in stale) and foreign.exists()
    stale[0].write_bytes(b"x")
    assert manager.remove_stale_temp_files() == [stale[0]]


def test_copy_to_file_or_folder(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        manager.copy_to(tmp_path / "out.pt")
    manager.save(3, state(3))
    (tmp_path / "export").mkdir()
    assert manager.copy_to(tmp_path / "export") == tmp_path / "export" / "step_3.pt"
    copied = manager.copy_to(tmp_path / "deep" / "final.pt")
    assert torch.load(copied, weights_only=True)["step"] == 3


def test_from_config_roots_relative_directory_under_output_dir(tmp_path):
    section = SimpleNamespace(directory="checkpoints", every_steps=7, keep_last=None, enabled=False)
    manager = CheckpointManager.from_config(section, output_dir=tmp_path)
    assert (manager.directory, manager.every_steps, manager.keep_last, manager.enabled) == (
        tmp_path / "checkpoints",
        7,
        None,
        False,
    )
    section.directory = str(tmp_path / "abs")
    assert (
        CheckpointManager.from_config(section, output_dir="elsewhere").directory == tmp_path / "abs"
    )


def draw() -> tuple:
    return (
        random.random(),
        float(np.random.rand()),
        float(np.random.randn()),
        torch.rand(3).tolist(),
    )


def test_rng_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in NumPy's state
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"rng": capture_rng_state()})
    expected = draw()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(manager.load_latest()["rng"])
    assert draw() == expected


def test_restore_rng_ignores_missing_state():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    restore_rng_state(None)
    restore_rng_state({})
    assert torch.equal(before, torch.get_rng_state())


@needs_sharded_torch
def test_a_sharded_checkpoint_loads_alone_without_dcps_single_process_warning(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    from speedtronic_trainer.sharded import load_sharded

    source, target, path = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2), tmp_path / "step_1.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's save says the same; only the load is ours
        dcp.save({"model": source.state_dict()}, checkpoint_id=str(path), no_dist=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_sharded(path, target, None)
    assert not [w for w in caught if "torch.distributed is disabled" in str(w.message)]
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def _sharded(manager: CheckpointManager, step: int, model: torch.nn.Module) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    staging = manager.sharded_staging_for(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(staging), no_dist=True)
    path = manager.publish_sharded(staging, state(step))
    assert path == manager.sharded_path_for(step) and not staging.exists()
    manager.commit(path)
    return path


@needs_sharded_torch
def test_a_sharded_checkpoint_replaces_one_of_its_step_only_once_complete(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    first = _sharded(manager, 2, torch.nn.Linear(30, 20))
    (first / "__1_0.distcp").write_bytes(b"rank 1's shard")  # as saved at world size 2
    old_shards = {p.name: p.read_bytes() for p in first.iterdir()}
    # A rerun's save of step 2 killed while its ranks wrote: the committed folder is untouched,
    # and the next start removes what the save left.
    staging = manager.sharded_staging_for(2)
    staging.mkdir()
    (staging / "__0_0.distcp").write_bytes(b"half a shard")
    assert {p.name: p.read_bytes() for p in first.iterdir()} == old_shards
    assert manager.load_latest()["step"] == 2
    assert manager.remove_stale_temp_files() == [staging] and not staging.exists()
    # A rerun's complete save takes the name; nothing of the old folder stays beside it.
    second = _sharded(manager, 2, torch.nn.Linear(30, 21))
    assert second == first and {p.name for p in tmp_path.iterdir()} == {"step_2.dcp", "latest"}
    # Resaved at world size 1: no shard of the earlier save is left to take disk space.
    assert "__1_0.distcp" not in {p.name for p in second.iterdir()}
    assert (second / "__0_0.distcp").read_bytes() != old_shards["__0_0.distcp"]


@needs_sharded_torch
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_sharded_checkpoint_falls_back_to_an_older_one(tmp_path, damage):
    manager = CheckpointManager(tmp_path, keep_last=None)
    manager.save(1, state(1))
    shard = next(_sharded(manager, 2, torch.nn.Linear(30, 20)).glob("*.distcp"))
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])  # a rank's write cut short
    else:
        shard.unlink()
    warnings = []
    assert manager.load_latest(warn=warnings.append)["step"] == 1
    expected = "holds 100 bytes of" if damage == "truncated" else "is missing"
    assert len(warnings) == 1 and "step_2.dcp is damaged" in warnings[0]
    assert expected in warnings[0] and "trying an older checkpoint" in warnings[0]


@needs_sharded_torch
def test_a_sharded_checkpoint_dcp_cannot_read_fails_in_one_line(tmp_path):
    from speedtronic_trainer.sharded import load_sharded

    path = _sharded(CheckpointManager(tmp_path), 1, torch.nn.Linear(3, 2))
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, unreadable content
    with pytest.raises(CheckpointError) as caught:
        load_sharded(path, torch.nn.Linear(3, 2), None)
    message = str(caught.value)
    assert message.startswith(f"sharded checkpoint {path} could not be loaded (")
    assert "\n" not in message and "resume from an older one" in message
