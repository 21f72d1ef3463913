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


def test_ranks_take_whole_batches_in_turn_then_deal_them_to_their_workers():
    plans = [
        BlockPlan(start=0, batch_size=2, worker=w, workers=2, rank=r, world_size=2)
        for r in range(2)
        for w in range(2)
    ]
    owners = [[i for i, plan in enumerate(plans) if plan.owns(b)] for b in range(16)]
    assert all(len(o) == 1 for o in owners)  # every block produced exactly once
    # batch g goes to rank g % 2; a rank's own batches alternate between its two workers
    assert [o[0] for o in owners] == [0, 0, 2, 2, 1, 1, 3, 3, 0, 0, 2, 2, 1, 1, 3, 3]
    resumed = BlockPlan(start=4, batch_size=2, rank=1, world_size=2)  # rank 1 had taken 2 batches
    assert [b for b in range(16) if resumed.owns(b)] == [10, 11, 14, 15]
