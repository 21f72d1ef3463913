from __future__ import annotations

import logging
import shutil
import threading

import pytest
import torch

from speedtronic_diloco.hub import HubClient, HubUnavailable
from speedtronic_diloco.outer import DOWNLOAD_THREADS, MasterOuterLoop, NesterovOuterOptimizer
from speedtronic_diloco.tensors import delta_path, to_safetensors_bytes
from speedtronic_diloco.transport import FilesystemTransport, TransportError


@pytest.mark.parametrize("lr,momentum", [(0.7, 0.9), (0.3, 0.0), (1.0, 0.5)])
def test_nesterov_outer_optimizer_matches_torch_sgd(lr, momentum):
    gen = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    params = {k: torch.nn.Parameter(v.clone()) for k, v in state.items()}
    reference = torch.optim.SGD(
        list(params.values()), lr=lr, momentum=momentum, nesterov=momentum > 0
    )
    ours = NesterovOuterOptimizer(state, lr, momentum)
    for _ in range(6):
        delta = {k: torch.randn(v.shape, generator=gen) for k, v in state.items()}
        for k, p in params.items():
            p.grad = delta[k].clone()
        reference.step()
        ours.step(state, delta)
        for k in state:
            assert torch.equal(state[k], params[k].detach()), k
    for k in state:
        if momentum > 0:  # torch keeps no buffer without momentum
            assert torch.equal(ours.state_dict()[k], reference.state[params[k]]["momentum_buffer"])


def test_a_tensor_frozen_mid_run_stays_put_as_torch_sgd_leaves_a_parameter_without_grad():
    # Frozen after 2 rounds, every node's delta for "b" is zero; the momentum it had built up
    # moved it on for rounds (0.55 in 5 on the loopback Hub). torch skips a grad-less parameter.
    gen = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    params = {k: torch.nn.Parameter(v.clone()) for k, v in state.items()}
    reference = torch.optim.SGD(list(params.values()), lr=0.7, momentum=0.9, nesterov=True)
    ours = NesterovOuterOptimizer(state, 0.7, 0.9)
    for index in range(6):
        delta = {k: torch.randn(v.shape, generator=gen) for k, v in state.items()}
        if index >= 2:
            delta["b"] = torch.zeros(3)
        for k, p in params.items():
            p.grad = None if index >= 2 and k == "b" else delta[k].clone()
        if index == 2:
            frozen = state["b"].clone()
        reference.step()
        ours.step(state, delta)
        for k in state:
            assert torch.equal(state[k], params[k].detach()), (index, k)
    assert torch.equal(state["b"], frozen)


def test_rounds_follow_the_paper_and_torch_sgd_across_a_master_restart(tmp_path):
    """DiLoCo's outer step on the mean pseudo-gradient D: m = mu m + D, theta -= lr (D + mu m);
    a master restarted between rounds resumes its momentum, so the run matches an uninterrupted
    torch.optim.SGD(nesterov=True).
    """
    gen = torch.Generator().manual_seed(0)
    init = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    rounds = [
        [{k: torch.randn(v.shape, generator=gen) for k, v in init.items()} for _ in range(3)]
        for _ in range(4)
    ]
    params = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    sgd = torch.optim.SGD(list(params.values()), lr=0.7, momentum=0.9, nesterov=True)
    theta = {k: v.clone() for k, v in init.items()}
    buf = {k: torch.zeros_like(v) for k, v in init.items()}
    for deltas in rounds:
        for k, p in params.items():
            p.grad = sum(d[k] for d in deltas) / len(deltas)
            buf[k] = 0.9 * buf[k] + p.grad
            theta[k] = theta[k] - 0.7 * (p.grad + 0.9 * buf[k])
        sgd.step()
    hub, loop = _master(tmp_path, init)
    loop.recover()
    for index, deltas in enumerate(rounds):
        for node, delta in enumerate(deltas):
            hub.upload_delta(delta, node_id=f"n{node}", local_step=index + 1, base_outer_step=index)
        if index == 2:
            loop = MasterOuterLoop(hub, init, node_state_dir=tmp_path / "master")
            loop.recover()
        assert loop.sync_once() == index + 1
    state = loop.snapshot()[1]
    for k in init:
        assert torch.allclose(state[k], params[k].detach(), rtol=0, atol=1e-6), k
        assert torch.allclose(state[k], theta[k], rtol=0, atol=1e-6), k


def test_nesterov_rejects_bad_hyperparameters_and_state():
    with pytest.raises(ValueError, match="outer_lr"):
        NesterovOuterOptimizer({"w": torch.zeros(1)}, 0.0)
    with pytest.raises(ValueError, match="outer_momentum"):
        NesterovOuterOptimizer({"w": torch.zeros(1)}, 0.7, 1.0)
    opt = NesterovOuterOptimizer({"w": torch.zeros(2)}, 0.7)
    with pytest.raises(ValueError, match="does not match"):
        opt.load_state_dict({"w": torch.zeros(3)})


def test_integer_buffers_are_not_updated():
    state = {"w": torch.zeros(2), "n": torch.tensor([4])}
    opt = NesterovOuterOptimizer(state, 0.5, 0.9)
    opt.step(state, {"w": torch.ones(2)})
    assert torch.equal(state["n"], torch.tensor([4])) and torch.equal(
        state["w"], torch.full((2,), -0.95)
    )


def _master(tmp_path, state, **kwargs):
    hub = HubClient(
        "org/run", transport=FilesystemTransport(tmp_path / "repo"), sleeper=lambda s: None
    )
    hub.create_repo()
    return hub, MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", **kwargs)


def test_sync_once_applies_each_delta_once_and_persists_ledger(tmp_path):
    state = {"w": torch.zeros(3)}
    hub, loop = _master(tmp_path, state, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    assert hub.global_metadata().outer_step == 0
    hub.upload_delta({"w": torch.ones(3)}, node_id="a", local_step=5, base_outer_step=0)
    hub.upload_delta({"w": torch.full((3,), 3.0)}, node_id="b", local_step=5, base_outer_step=0)
    assert loop.sync_once() == 1
    assert torch.equal(loop.snapshot()[1]["w"], torch.full((3,), -2.0))  # mean delta 2, lr 1
    assert hub.delta_paths() == []  # consumed deltas are deleted in the publishing commit
    assert hub.global_metadata().outer_step == 1
    # A retried upload whose first response was lost re-creates the same path: it is not applied
    # again.
    hub.upload_delta({"w": torch.ones(3)}, node_id="a", local_step=5, base_outer_step=0)
    assert loop.sync_once() == 1
    restarted = MasterOuterLoop(
        hub, state, node_state_dir=tmp_path / "master", outer_lr=1.0, outer_momentum=0.0
    )
    assert restarted.outer_step == 1 and delta_path("a", 5, 0) in restarted.processed_filenames
    assert torch.equal(restarted.snapshot()[1]["w"], torch.full((3,), -2.0))


def test_a_round_downloads_many_deltas_in_parallel_and_aggregates_them_in_order(tmp_path):
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    nodes = 2 * DOWNLOAD_THREADS + 3  # more than one batch of downloads
    for index in range(nodes):
        hub.upload_delta(
            {"w": torch.full((2,), float(index))},
            node_id=f"n{index:02d}",
            local_step=4,
            base_outer_step=0,
        )
    assert loop.sync_once() == 1
    assert torch.equal(
        loop.snapshot()[1]["w"], torch.full((2,), -(nodes - 1) / 2)
    )  # minus the mean delta
    assert len(loop.processed_filenames) == nodes and loop.counters["applied"] == nodes


def test_a_nodes_consecutive_deltas_add_up_and_nodes_average(tmp_path):
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    for step in (4, 8, 12):  # node a was three boundaries ahead of the master's round
        hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=step, base_outer_step=0)
    hub.upload_delta({"w": torch.full((2,), 5.0)}, node_id="b", local_step=4, base_outer_step=0)
    assert loop.sync_once() == 1
    assert torch.equal(loop.snapshot()[1]["w"], torch.full((2,), -4.0))  # mean(1 + 1 + 1, 5)
    assert loop.counters["applied"] == 4


def test_a_nodes_deltas_against_different_globals_are_averaged_not_summed(tmp_path):
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    hub.upload_delta({"w": torch.zeros(2)}, node_id="z", local_step=1, base_outer_step=0)
    assert loop.sync_once() == 1
    # Node a trained from outer step 0 (two deltas: one displacement of 2 + 4), installed step 1
    # and trained from it (one displacement of 3); node b trained from step 1 (displacement 9).
    hub.upload_delta({"w": torch.full((2,), 2.0)}, node_id="a", local_step=10, base_outer_step=0)
    hub.upload_delta({"w": torch.full((2,), 4.0)}, node_id="a", local_step=20, base_outer_step=0)
    hub.upload_delta({"w": torch.full((2,), 3.0)}, node_id="a", local_step=30, base_outer_step=1)
    hub.upload_delta({"w": torch.full((2,), 9.0)}, node_id="b", local_step=10, base_outer_step=1)
    assert loop.sync_once() == 2
    # mean(6, 3, 9) = 6; summing node a's three deltas (mean(9, 9) = 9) stepped half as far again.
    assert torch.equal(loop.snapshot()[1]["w"], torch.full((2,), -6.0))
    assert loop.counters["applied"] == 5


def test_invalid_and_stale_deltas_are_skipped_with_reasons(tmp_path, caplog):
    state = {"w": torch.zeros(3)}
    events = []
    hub, loop = _master(
        tmp_path,
        state,
        outer_lr=1.0,
        outer_momentum=0.0,
        staleness_limit=0,
        events=lambda e, p: events.append((e, p)),
    )
    loop.recover()
    hub.upload_bytes(b"\x80\x04not safetensors", delta_path("bad", 1, 0))
    hub.upload_delta({"w": torch.ones(4)}, node_id="shape", local_step=1, base_outer_step=0)
    hub.upload_delta(
        {"w": torch.tensor([1.0, float("nan"), 0.0])},
        node_id="nan",
        local_step=1,
        base_outer_step=0,
    )
    hub.upload_delta(
        {"w": torch.ones(3, dtype=torch.float64)}, node_id="dtype", local_step=1, base_outer_step=0
    )
    hub.upload_bytes(
        to_safetensors_bytes({"w": torch.zeros(3), "x": torch.zeros(400_000)}),
        delta_path("huge", 1, 0),
    )
    hub.upload_delta({"w": torch.ones(3)}, node_id="good", local_step=1, base_outer_step=0)
    assert loop.sync_once() == 1
    assert torch.equal(loop.snapshot()[1]["w"], -torch.ones(3))
    assert loop.counters["skipped_invalid"] == 5 and loop.counters["applied"] == 1
    hub.upload_delta({"w": torch.ones(3)}, node_id="late", local_step=2, base_outer_step=0)
    hub.upload_delta({"w": torch.ones(3)}, node_id="future", local_step=2, base_outer_step=9)
    assert loop.sync_once() == 1
    assert loop.counters["skipped_stale"] == 1 and loop.counters["skipped_invalid"] == 6
    text = caplog.text
    for reason in [
        "not a valid safetensors",
        "shape",
        "non-finite",
        "dtype",
        "implausible size",
        "stale",
        "ahead",
    ]:
        assert reason in text
    assert events and events[-1][0] == "diloco/outer_round" and events[-1][1]["skipped"] == 2
    # This round's counts stay apart from the running totals.
    assert events[-1][1]["applied"] == 0 and events[-1][1]["total_applied"] == 1
    assert events[-1][1]["total_skipped_invalid"] == 6


def test_a_delta_damaged_on_disk_is_skipped_for_good_without_retries(tmp_path, caplog):
    state = {"w": torch.zeros(3)}
    hub, loop = _master(tmp_path, state, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    sleeps = []
    hub.sleeper = sleeps.append
    hub.upload_delta({"w": torch.full((3,), 7.0)}, node_id="bad", local_step=1, base_outer_step=0)
    damaged = (
        hub.transport.root / "objects" / hub.transport._tree(hub.head())[delta_path("bad", 1, 0)]
    )
    damaged.write_bytes(damaged.read_bytes()[:-4] + b"\0\0\0\0")  # bit rot, same length
    hub.upload_delta({"w": torch.ones(3)}, node_id="good", local_step=1, base_outer_step=0)
    with caplog.at_level(logging.WARNING):
        assert loop.sync_once() == 1
    assert torch.equal(loop.snapshot()[1]["w"], -torch.ones(3))  # the good delta alone
    assert loop.counters["skipped_invalid"] == 1 and sleeps == []  # no backoff on damage
    assert "skipping delta" in caplog.text and "corrupt" in caplog.text
    assert delta_path("bad", 1, 0) in loop.processed_filenames  # not fetched again next round
    assert hub.delta_paths() == []


def test_failed_publish_is_resent_before_the_next_round(tmp_path):
    state = {"w": torch.zeros(2)}
    hub, loop = _master(tmp_path, state, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    original = hub.transport.commit

    def down(*args, **kwargs):
        raise TransportError("down", transient=True)

    hub.transport.commit = down
    assert loop.sync_once() == 1
    assert hub.global_metadata().outer_step == 0 and loop.counters["publish_failures"] == 1
    hub.transport.commit = original
    loop.sync_once()
    assert hub.global_metadata().outer_step == 1


def test_a_restarted_master_says_where_its_state_came_from_and_publishes_what_it_lacked(
    tmp_path,
):
    """A master killed between saving a round and publishing it publishes that round when it
    restarts; it said so (and where its state came from) at INFO only, which the CLI never shows.
    """
    events = []
    kwargs = {"outer_lr": 1.0, "outer_momentum": 0.0, "events": lambda e, p: events.append((e, p))}
    state = {"w": torch.zeros(2)}
    hub, loop = _master(tmp_path, state, **kwargs)
    loop.recover()
    start = {"outer_step": 0, "source": "new", "republished": False, "ledger": 0}
    assert events == [("diloco/master_start", start)]
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    original = hub.transport.commit

    def down(*args, **kwargs):
        raise TransportError("down", transient=True)

    hub.transport.commit = down
    assert loop.sync_once() == 1 and hub.global_metadata().outer_step == 0  # saved, unpublished
    hub.transport.commit = original
    MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", **kwargs).recover()
    start = {"outer_step": 1, "source": "local", "republished": True, "ledger": 1}
    assert events[-1] == ("diloco/master_start", start)
    assert hub.global_metadata().outer_step == 1
    MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", **kwargs).recover()
    assert events[-1] == ("diloco/master_start", dict(start, republished=False))
    shutil.rmtree(tmp_path / "master")  # its disk lost: the published model and ledger
    MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", **kwargs).recover()
    start = {"outer_step": 1, "source": "published", "republished": False, "ledger": 1}
    assert events[-1] == ("diloco/master_start", start)


def test_a_full_shared_folder_is_a_failed_publish_the_round_still_reports(tmp_path, caplog):
    """A shared folder's OSError while publishing (disk full, remounted read-only) escaped the
    round: no outer_round event, no publish_failures count, and a traceback every round.
    """
    events = []
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, events=lambda e, p: events.append((e, p)))
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    original = hub.transport.commit

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(hub.transport.root / "objects" / "x"))

    hub.transport.commit = full
    with caplog.at_level(logging.WARNING, logger="speedtronic_diloco.outer"):
        assert loop.sync_once() == 1
    assert loop.counters["publish_failures"] == 1 and "No space left" in loop._state.last_error
    assert events[-1][0] == "diloco/outer_round" and events[-1][1]["published"] is False
    assert any("publishing outer step 1 failed" in r.getMessage() for r in caplog.records)
    hub.transport.commit = original
    loop.sync_once()  # resent once the folder has room
    assert hub.global_metadata().outer_step == 1


def test_recover_adopts_newer_global_and_its_ledger(tmp_path):
    state = {"w": torch.zeros(2)}
    hub, loop = _master(tmp_path, state, outer_lr=1.0)
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    loop.sync_once()
    # The master's local disk is lost: a fresh master adopts the Hub copy and its ledger.
    fresh = MasterOuterLoop(hub, state, node_state_dir=tmp_path / "other", outer_lr=1.0)
    fresh.recover()
    assert fresh.outer_step == 1 and delta_path("a", 1, 0) in fresh.processed_filenames
    assert torch.equal(fresh.snapshot()[1]["w"], loop.snapshot()[1]["w"])


def test_master_state_file_for_another_model_is_rejected(tmp_path):
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)})
    loop.recover()
    with pytest.raises(
        ValueError,
        match=r"outer_state.safetensors does not match the model \(w: shape .*\): give this "
        r"master the model.\* settings it was written with, or, for a new run \(its own "
        r"distributed.repo_id\), delete it or point distributed.state_dir elsewhere$",
    ):
        MasterOuterLoop(hub, {"w": torch.zeros(5)}, node_state_dir=tmp_path / "master")
    # It said only to delete it: then the repository's model was refused, naming no fix.
    elsewhere = MasterOuterLoop(hub, {"w": torch.zeros(5)}, node_state_dir=tmp_path / "other")
    with pytest.raises(
        ValueError,
        match=r"^published global state at outer step 0 in org/run does not match the model "
        r"\(w: shape .*\): .*; give this master the run's model.\* settings or its own "
        r"distributed.repo_id$",
    ):
        elsewhere.recover()


def test_bad_loop_settings_are_rejected(tmp_path):
    hub = HubClient("org/run", transport=FilesystemTransport(tmp_path), sleeper=lambda s: None)
    with pytest.raises(ValueError, match="staleness_limit"):
        MasterOuterLoop(hub, {"w": torch.zeros(1)}, node_state_dir=tmp_path, staleness_limit=-1)
    with pytest.raises(ValueError, match="poll_interval"):
        MasterOuterLoop(hub, {"w": torch.zeros(1)}, node_state_dir=tmp_path, poll_interval=0)


def test_thread_runs_rounds_and_restarts(tmp_path):
    state = {"w": torch.zeros(2)}
    rounds = []
    hub, loop = _master(
        tmp_path, state, poll_interval=0.01, on_global_update=lambda s, n: rounds.append(n)
    )
    loop.recover()
    for attempt in range(2):
        loop.start()
        hub.upload_delta(
            {"w": torch.ones(2)}, node_id="a", local_step=attempt + 1, base_outer_step=attempt
        )
        for _ in range(1500):  # up to 15 s on a loaded machine
            if hub.global_metadata().outer_step == attempt + 1:
                break
            __import__("time").sleep(0.01)
        loop.stop()
    assert rounds == [0, 1, 2]


def test_a_hub_outage_is_one_line_a_round_not_a_traceback(tmp_path, caplog):
    """While the Hub stays unreachable past the client's retries, each round says so in one line
    and the loop goes on; it logged a full traceback every round for as long as the outage lasted.
    The line is INFO: the client warned once when the outage began (test_hub.py).
    """
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, poll_interval=0.01)
    loop.recover()
    failed = threading.Semaphore(0)

    def head():
        failed.release()
        raise HubUnavailable("head on org/run failed 6 times; last error: 503")

    hub.head = head
    with caplog.at_level(logging.INFO, logger="speedtronic_diloco.outer"):
        loop.start()
        for _ in range(2):  # two rounds failed: the loop survived the first
            assert failed.acquire(timeout=15)
        loop.stop()
    failures = [r for r in caplog.records if "outer round failed" in r.getMessage()]
    assert failures and all(r.exc_info is None and r.levelname == "INFO" for r in failures)
    assert "retrying in 0s: head on org/run failed 6 times" in failures[0].getMessage()
    assert loop._state.last_error.startswith("head on org/run")


def test_finish_waits_for_the_round_in_progress_then_runs_its_last_round(tmp_path):
    """A round still retrying the Hub when the master stops is waited for, not run beside (the
    process would exit in its middle: its ledger saved, its event never logged).
    """
    fetching, release, warned = threading.Event(), threading.Event(), threading.Event()

    class Warned(logging.Handler):
        def emit(self, record):
            if "still retrying the Hub" in record.getMessage():
                warned.set()

    logger = logging.getLogger("test-finish")
    logger.addHandler(Warned())
    rounds = []
    hub, loop = _master(
        tmp_path,
        {"w": torch.zeros(2)},
        outer_lr=1.0,
        outer_momentum=0.0,
        poll_interval=0.01,
        logger=logger,
        events=lambda e, p: rounds.append(p) if e == "diloco/outer_round" else None,
    )
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    reads = []
    read = hub.read_bytes

    def slow_read(*args, **kwargs):  # the thread's download, held until the test lets it go
        reads.append(args[0])
        fetching.set()
        assert release.wait(30)
        return read(*args, **kwargs)

    hub.read_bytes = slow_read
    loop.start()
    assert fetching.wait(30)
    finisher = threading.Thread(target=loop.finish, kwargs={"warn_after": 0.01})
    finisher.start()
    assert warned.wait(30)
    assert finisher.is_alive() and len(reads) == 1  # waiting: no last round beside it
    release.set()
    finisher.join(30)
    assert not finisher.is_alive()
    # The held round applied the delta and logged it; the last round found nothing left.
    assert [r["applied"] for r in rounds] == [1] and loop.outer_step == 1
    assert loop.processed_filenames == {delta_path("a", 1, 0)}


def test_nodes_with_identical_pseudo_gradients_are_named_once(tmp_path, caplog):
    hub, loop = _master(tmp_path, {"w": torch.zeros(2)}, outer_lr=1.0, outer_momentum=0.0)
    loop.recover()
    for round_ in range(2):
        for node in ("a", "b"):  # same seed, same batches: the same displacement
            delta = {"w": torch.tensor([1.0, 2.0])}
            hub.upload_delta(delta, node_id=node, local_step=4, base_outer_step=round_)
        delta = {"w": torch.tensor([2.0, 1.0])}  # same sum, other batches
        hub.upload_delta(delta, node_id="c", local_step=4, base_outer_step=round_)
        with caplog.at_level("WARNING", logger="speedtronic_diloco.outer"):
            assert loop.sync_once() == round_ + 1
    named = [r.getMessage() for r in caplog.records if "identical" in r.getMessage()]
    assert named == [
        "nodes a, b sent identical pseudo-gradients from outer step 0: they trained on the same "
        "batches; give each node its own data.seed (or data.shard_path)"
    ]
    assert loop.counters["applied"] == 6  # warned, still applied as 2.0 did


def test_a_resumed_master_continues_its_total_counters(tmp_path):
    """total_* counters in diloco/outer_round restarted at 0 after a resume (total_rounds=1 after
    two rounds), so a plotted total jumped back.
    """
    events = []
    kwargs = {"outer_lr": 1.0, "outer_momentum": 0.0, "events": lambda e, p: events.append(p)}
    state = {"w": torch.zeros(2)}
    hub, loop = _master(tmp_path, state, **kwargs)
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=1, base_outer_step=0)
    hub.upload_delta({"w": torch.ones(3)}, node_id="b", local_step=1, base_outer_step=0)
    assert loop.sync_once() == 1
    loop = MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", **kwargs)
    loop.recover()
    hub.upload_delta({"w": torch.ones(2)}, node_id="a", local_step=2, base_outer_step=1)
    assert loop.sync_once() == 2
    totals = {k: v for k, v in events[-1].items() if k.startswith("total_")}
    assert totals == {
        "total_rounds": 2,
        "total_applied": 2,
        "total_skipped_stale": 0,
        "total_skipped_invalid": 1,
        "total_publish_failures": 0,
    }


def test_a_master_resumed_with_other_outer_settings_says_which_it_uses(tmp_path, caplog):
    state = {"w": torch.zeros(2)}
    hub, loop = _master(tmp_path, state, outer_lr=0.7, outer_momentum=0.9)
    loop.recover()
    with caplog.at_level(logging.WARNING, logger="speedtronic_diloco.outer"):
        MasterOuterLoop(hub, state, node_state_dir=tmp_path / "master", outer_lr=0.7)
        assert not caplog.records
        MasterOuterLoop(
            hub, state, node_state_dir=tmp_path / "master", outer_lr=0.5, outer_momentum=0.0
        )
    (record,) = caplog.records
    assert "outer_lr 0.7 -> 0.5" in record.getMessage()
    assert "outer_momentum 0.9 -> 0" in record.getMessage()
    assert "using 0.5 and 0" in record.getMessage()
