"""atomic_torch_save: torch.save through speedtronic_config's atomic writes."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from speedtronic_config import atomic
from speedtronic_config.atomic import atomic_write
from speedtronic_systems.atomic import atomic_torch_save


class Unpicklable:
    """Raises while torch.save is halfway through writing the archive."""

    def __reduce__(self):
        raise RuntimeError("cannot serialize this")


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request, monkeypatch):
    """Run each test with Linux unnamed temp files and with the portable named-temp fallback."""
    if request.param == "named":
        monkeypatch.setattr(atomic, "_open_anonymous", lambda folder: None)
    elif atomic._open_anonymous is None or not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE on this platform")
    return request.param


def test_torch_save_round_trips_with_weights_only_load(tmp_path, temp_kind):
    target = tmp_path / "ckpt.pt"
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step": 7}
    atomic_torch_save(state, target)
    loaded = torch.load(target, weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], state["model"]["w"])


def test_exception_mid_serialization_keeps_the_old_file_and_leaves_no_litter(tmp_path, temp_kind):
    target = tmp_path / "ckpt.pt"
    atomic_torch_save({"step": 1}, target)
    before = target.read_bytes()
    # A large tensor first, so bytes are already written when the bad object raises.
    with pytest.raises(RuntimeError, match="cannot serialize this"):
        atomic_torch_save({"big": torch.zeros(1 << 18), "bad": Unpicklable()}, target)
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]


class FullDisk:
    """A file whose writes fail with ENOSPC after `room` bytes, as a full filesystem's do."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def test_a_full_disk_during_torch_save_is_the_oserror_not_torchs_enforce_fail(tmp_path, temp_kind):
    target = tmp_path / "ckpt.pt"
    atomic_torch_save({"step": 1}, target)
    before = target.read_bytes()
    # torch.save reports it as "RuntimeError: [enforce fail at inline_container.cc:672]" (#19).
    with pytest.raises(OSError) as caught:
        atomic_write(target, lambda h: torch.save({"x": torch.zeros(1 << 16)}, FullDisk(h, 4096)))
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]
