from __future__ import annotations

import pytest

from speedtronic_data import DataError
from speedtronic_data.position import DataPosition, read_state


def test_each_pass_is_the_next_epoch_unless_a_resume_point_was_loaded():
    position = DataPosition()
    assert position.start_pass() == (0, 0)
    position.samples += 8
    assert (position.epoch, position.samples) == (0, 8)
    assert position.start_pass() == (
        1,
        0,
    )  # a pass left early does not continue: the next one is a new epoch
    position.resume_at(4, 12, "state")
    assert (position.epoch, position.samples) == (4, 12)  # reported at once, before the pass starts
    assert position.start_pass() == (4, 12)
    assert position.start_pass() == (5, 0)


def test_a_pass_run_to_its_end_moves_the_position_to_the_next_epoch():
    position = DataPosition()
    position.start_pass()
    position.samples += 8
    position.end_pass(0)
    assert (position.epoch, position.samples) == (1, 0)
    assert position.start_pass() == (1, 0)
    position.resume_at(3, 4, "state")  # loaded while the pass ran: the loaded point stands
    position.end_pass(1)
    assert position.start_pass() == (3, 4)


def test_negative_positions_are_rejected_by_name():
    with pytest.raises(DataError, match="my state has a negative epoch or position"):
        DataPosition().resume_at(0, -1, "my state")


def test_read_state_names_the_expected_shape():
    assert read_state({"epoch": "2", "windows": 3}, "windows", "X") == (2, 3)
    for bad in ({"epoch": 1}, None, {"epoch": "one", "windows": 0}):
        with pytest.raises(
            DataError, match=r"is not a X state \(expected \{'epoch': int, 'windows': int\}\)"
        ):
            read_state(bad, "windows", "X")
