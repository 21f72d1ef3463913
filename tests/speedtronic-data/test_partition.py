from __future__ import annotations

from speedtronic_data.partition import BlockPlan, block_plan


def test_workers_take_whole_batches_in_turn_and_every_block_once():
    plans = [BlockPlan(start=3, batch_size=2, worker=w, workers=3) for w in range(3)]
    owners = [[w for w, plan in enumerate(plans) if plan.owns(i)] for i in range(15)]
    assert owners[:3] == [[], [], []]  # before start: nobody
    assert all(len(o) == 1 for o in owners[3:])
    assert [o[0] for o in owners[3:]] == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]


def test_main_process_plan_owns_everything_from_start():
    plan = block_plan(start=2, batch_size=4)
    assert (plan.worker, plan.workers) == (0, 1)
    assert [plan.owns(i) for i in range(4)] == [False, False, True, True]
