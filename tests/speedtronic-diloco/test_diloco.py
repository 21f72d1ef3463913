"""DumbDiLoCoCoordinator against the loopback Hub server with the real huggingface_hub client."""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
import urllib.request
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

import pytest
import torch

from speedtronic_diloco.diloco import DumbDiLoCoCoordinator
from speedtronic_diloco.hub import HubClient, HubError, HubRefused
from speedtronic_diloco.tensors import delta_path, from_safetensors_bytes, parse_delta_ref
from speedtronic_diloco.testing.hub_server import HubServer
from speedtronic_diloco.transport import HfApiTransport, TransportError

TRUE_W = torch.tensor([[1.5, -2.0, 0.5, 3.0]])


@runtime_checkable
class SyncCoordinator(
    Protocol
):  # the trainer's SyncCoordinator protocol, restated: the trainer is never imported
    def start(self) -> None: ...
    def after_optimizer_step(self, model: Any, step: int) -> bool | None: ...
    def stop(self) -> None: ...
    def state_dict(self) -> dict[str, Any] | None: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def section(**overrides):
    values = dict(
        role="worker",
        node_id="w1",
        inner_steps=4,
        poll_interval=3600.0,
        outer_lr=0.7,
        outer_momentum=0.9,
        repo_id="org/run",
        token="hf_SECRET_in_config",
        async_delta_upload=False,
        async_global_poll=False,
        delta_upload_queue_size=1,
        delta_upload_overflow="skip",
        delta_upload_shutdown_timeout=5.0,
        global_wait_timeout=0.0,
        staleness_limit=2,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def client(server, tmp_path, name, **kwargs):
    transport = HfApiTransport("org/run", endpoint=server.url, cache_dir=tmp_path / f"cache-{name}")
    return HubClient(
        "org/run",
        transport=transport,
        retry_initial=0.01,
        retry_max=0.01,
        sleeper=lambda s: None,
        **kwargs,
    )


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1, bias=False)


def node(server, tmp_path, name, seed=0, tokenizer=None, **overrides):
    net = model(seed)
    role = "master" if name == "master" else "worker"
    coordinator = DumbDiLoCoCoordinator(
        section(role=role, node_id=name, **overrides),
        net,
        hub=client(server, tmp_path, name),
        state_dir=tmp_path / "state" / name,
        tokenizer=tokenizer,
    )
    return coordinator, net, torch.optim.AdamW(net.parameters(), lr=0.05)


def wait_for(predicate, what, seconds=15.0):
    """Poll a background lane's progress; generous, because CI machines are loaded."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")


def record_weights(coordinator):
    """Return {local step: the weight the coordinator saw at that step, before any global
    install}.
    """
    weights = {}
    boundary = coordinator.after_optimizer_step
    coordinator.after_optimizer_step = lambda model, step: (
        weights.__setitem__(step, model.weight.detach().clone()),
        boundary(model, step),
    )[1]
    return weights


def snapshot(coordinator, net, opt):
    """Return what a checkpoint keeps of a node now: its DiLoCo state, model and optimizer."""
    model_state = {k: v.clone() for k, v in net.state_dict().items()}
    return coordinator.state_dict(), model_state, copy.deepcopy(opt.state_dict())


def resume(server, tmp_path, name, saved):
    """Start node `name` again from `saved` (a snapshot); return it, its model and optimizer, and
    the (event, payload) list it records from its start.
    """
    checkpoint, model_state, optimizer_state = saved
    resumed, net, opt = node(server, tmp_path, name)
    net.load_state_dict(model_state)
    opt.load_state_dict(optimizer_state)
    resumed.prepare_state(checkpoint)
    events = []
    resumed.events = lambda event, payload: events.append((event, payload))
    resumed.start()
    return resumed, net, opt, events


def train(coordinator, net, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    resets = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(net(x), x @ TRUE_W.T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step = coordinator.local_step + 1
        if coordinator.after_optimizer_step(net, step):
            opt.state.clear()
            resets.append(step)
    return resets


def held_out_loss(state):
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(256, 4, generator=gen)
    return float(torch.nn.functional.mse_loss(x @ state["weight"].T, x @ TRUE_W.T))


def server_log(server):
    return json.loads(urllib.request.urlopen(server.url + "/_test/log").read())


def test_coordinator_satisfies_the_trainer_protocol(server, tmp_path):
    coordinator, _, _ = node(server, tmp_path, "master")
    assert isinstance(coordinator, SyncCoordinator)


def test_rounds_with_master_and_two_workers_apply_every_delta_once(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    workers = [node(server, tmp_path, f"w{i}", seed=i + 1) for i in range(2)]
    for coordinator, net, _ in workers:
        coordinator.start()  # installs the master's initial global
        assert coordinator.last_global_step == 0 and torch.equal(net.weight, master_net.weight)
    initial = held_out_loss(master.master.snapshot()[1])
    for round_index in range(4):
        for seed, (coordinator, net, opt) in enumerate(
            workers + [(master, master_net, master_opt)]
        ):
            train(coordinator, net, opt, 4, seed=100 * round_index + seed)
        master.master.sync_once()
    outer_step, state = master.master.snapshot()
    assert outer_step >= 3
    assert held_out_loss(state) < 0.5 * initial
    for coordinator, _, _ in workers:  # every worker installed newer global versions at boundaries
        assert coordinator.counters["globals_installed"] >= 3 and coordinator.last_global_step >= 2
    uploaded = {p for c in server_log(server) for p in c["added"] if parse_delta_ref(p)}
    processed = master.master.processed_filenames
    assert uploaded and uploaded <= processed | set(master.hub.delta_paths())
    assert master.master.counters["applied"] == len(
        uploaded & processed
    )  # each applied exactly once
    for coordinator, _, _ in workers + [(master, None, None)]:
        coordinator.stop()


def test_a_stopping_master_applies_the_deltas_that_landed_in_a_last_round(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")  # no round of its own
    worker, net, opt = node(server, tmp_path, "w1", seed=1)
    master.start()
    worker.start()
    train(master, master_net, master_opt, 4, seed=1)
    train(worker, net, opt, 4, seed=2)
    worker.stop()
    sent = set(master.hub.delta_paths())
    master.stop()
    assert len(sent) == 2 and master.master.processed_filenames == sent
    assert master.hub.global_metadata().outer_step == 1 and master.hub.delta_paths() == []


def test_synchronous_delta_mode_remains_available(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    baseline = {k: v.clone() for k, v in net.state_dict().items()}
    assert train(worker, net, opt, 4, seed=1) == [4]  # uploaded at the boundary: reset requested
    data = worker.hub.read_bytes(delta_path("w1", 4, 0))
    assert torch.allclose(
        from_safetensors_bytes(data)["weight"], baseline["weight"] - net.weight.detach()
    )
    assert worker.counters["uploads"] == 1
    master.stop()


def test_async_delta_dispatch_does_not_block_training(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True, inner_steps=2)
    gate = threading.Event()
    worker.start()
    original = worker.hub.transport.commit
    worker.hub.transport.commit = lambda *a, **k: (gate.wait(30), original(*a, **k))[1]
    train(worker, net, opt, 2, seed=1)  # boundary 2: dispatched, upload blocked in the lane
    wait_for(lambda: worker._inflight is not None, "the lane to take the step-2 upload")
    train(worker, net, opt, 2, seed=2)  # boundary 4: the queue (size 1) holds it
    train(worker, net, opt, 2, seed=3)  # boundary 6: lane full -> skipped, not blocked
    assert worker.counters["uploads_skipped"] == 1 and worker.counters["uploads"] == 0
    # Every undelivered job is checkpointed under its own name: the one in flight and the queued
    # one.
    assert [job["step"] for job in worker.state_dict()["pending_uploads"]] == [2, 4]
    gate.set()
    worker.stop()
    assert worker.counters["uploads"] == 2
    paths = worker.hub.delta_paths()
    assert delta_path("w1", 2, 0) in paths and delta_path("w1", 4, 0) in paths
    master.stop()


def test_async_delta_failure_is_resent_under_its_own_name(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True)
    worker.hub.retry_attempts = 1
    worker.start()
    baseline = {k: v.clone() for k, v in net.state_dict().items()}
    server.faults.add("503", method="POST", path="/commit/", times=1)
    train(worker, net, opt, 4, seed=1)
    worker.stop()  # drains the lane: the upload failed
    assert worker.counters["upload_failures"] == 1 and worker.hub.delta_paths() == []
    worker.start()  # restart after stop
    train(worker, net, opt, 4, seed=2)
    worker.stop()
    # The failed delta is re-sent as itself (had it landed after all, the master would skip the
    # repeat); merged into the next one, its work would count twice in that case.
    first, second = (
        from_safetensors_bytes(worker.hub.read_bytes(delta_path("w1", step, 0)))["weight"]
        for step in (4, 8)
    )
    both = baseline["weight"] - net.weight.detach()  # both rounds of work, old baseline
    assert not torch.allclose(second, both, atol=1e-6)
    assert torch.allclose(first + second, both, atol=1e-6)
    master.stop()


def test_async_global_poll_installs_on_training_thread_at_a_boundary(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    events = []
    worker, net, opt = node(
        server, tmp_path, "w1", async_global_poll=True, poll_interval=0.01, inner_steps=3
    )
    worker.events = lambda event, payload: events.append((event, threading.get_ident(), payload))
    worker.start()
    train(master, master_net, master_opt, 4, seed=5)
    master.master.sync_once()  # outer step 1 published
    wait_for(lambda: worker._candidate is not None, "the poll lane to fetch outer step 1")
    assert worker.last_global_step == 0  # fetched, not installed yet
    train(worker, net, opt, 2, seed=1)
    assert worker.last_global_step == 0  # mid-round: local steps are never thrown away
    train(worker, net, opt, 1, seed=2)
    assert worker.last_global_step == 1
    installs = [e for e in events if e[0] == "diloco/global_installed"]
    assert installs and all(ident == threading.get_ident() for _, ident, _ in installs)
    published = master.hub.download_global_state()
    assert torch.equal(net.weight.detach(), published["weight"])
    worker.stop()
    master.stop()


@pytest.mark.parametrize("legacy", [False, True], ids=["pending_uploads", "legacy_pending_upload"])
def test_prepared_resume_restores_pending_upload_without_double_counting(server, tmp_path, legacy):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True)
    worker.start()
    gate = threading.Event()
    original = worker.hub.transport.commit
    worker.hub.transport.commit = lambda *a, **k: (gate.wait(30), original(*a, **k))[1]
    train(worker, net, opt, 4, seed=1)
    checkpoint = worker.state_dict()
    assert [job["step"] for job in checkpoint["pending_uploads"]] == [4]
    if legacy:  # 2.0 checkpoints hold one job under pending_upload
        checkpoint["pending_upload"] = checkpoint.pop("pending_uploads")[0]
    assert "hf_SECRET_in_config" not in repr(checkpoint)
    model_state = {k: v.clone() for k, v in net.state_dict().items()}
    worker.settings = worker.settings.__class__(
        **{**worker.settings.__dict__, "delta_upload_shutdown_timeout": 0.0}
    )
    worker.stop()  # the process "dies" with the upload still stuck
    gate.set()
    # "block": the step-8 delta waits for the re-sent step-4 upload instead of being skipped when
    # a loaded machine has not finished it yet (skipping is tested on its own).
    resumed, net2, opt2 = node(
        server, tmp_path, "w1", async_delta_upload=True, delta_upload_overflow="block"
    )
    net2.load_state_dict(model_state)
    resumed.prepare_state(checkpoint)
    resumed.start()
    train(resumed, net2, opt2, 4, seed=2)
    resumed.stop()
    first = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 4, 0)))["weight"]
    second = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 8, 0)))["weight"]
    assert torch.allclose(
        second, model_state["weight"] - net2.weight.detach(), atol=1e-6
    )  # only new work
    assert not torch.allclose(first, second)
    master.stop()


def test_resumed_worker_starts_from_the_latest_global(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    checkpoint = worker.state_dict()  # taken at outer step 0
    train(master, master_net, master_opt, 4, seed=1)
    assert master.master.sync_once() == 1
    resumed, net2, _ = node(server, tmp_path, "w1", seed=5)
    resumed.prepare_state(checkpoint)
    resumed.start()
    published = resumed.hub.download_global_state()
    assert resumed.last_global_step == 1 and torch.equal(net2.weight.detach(), published["weight"])
    resumed.stop()
    worker.stop()
    master.stop()


@pytest.mark.parametrize("reset", [True, False])
def test_a_global_installed_at_start_asks_for_the_inner_optimizer_reset(server, tmp_path, reset):
    """A resumed node restores its AdamW moments from its checkpoint, then installs a newer global
    over its weights at start: as at a boundary install, reset_inner_optimizer clears them (start
    said nothing, so the moments of the discarded trajectory drove the first steps).
    """
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    assert master.reset_after_start  # installed outer step 0 over its own start
    worker, _, _ = node(server, tmp_path, "w1", reset_inner_optimizer=reset)
    worker.start()
    checkpoint = worker.state_dict()  # taken at outer step 0
    train(master, master_net, master_opt, 4, seed=1)
    assert master.master.sync_once() == 1
    resumed, _, _ = node(server, tmp_path, "w1", reset_inner_optimizer=reset)
    resumed.prepare_state(checkpoint)
    resumed.start()
    assert resumed.last_global_step == 1 and resumed.reset_after_start is reset
    resumed.stop()
    # Resumed with nothing newer to install, its checkpointed moments stay.
    again, _, _ = node(server, tmp_path, "w1", reset_inner_optimizer=reset)
    again.prepare_state(resumed.state_dict())
    again.start()
    assert again.last_global_step == 1 and again.reset_after_start is False
    again.stop()
    worker.stop()
    master.stop()


def test_a_resumed_node_sends_its_work_since_the_last_boundary_before_installing(server, tmp_path):
    """A checkpoint between boundaries (checkpoint.every_steps 50, inner_steps 20; or a SIGTERM)
    holds steps no delta carried yet. Resumed, the node installed the newer global over them, and
    their batches, never trained again, were lost to the run.
    """
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    train(worker, net, opt, 6, seed=1)  # the step-4 delta left; steps 5-6 are only local
    checkpoint = worker.state_dict()
    model_state = {k: v.clone() for k, v in net.state_dict().items()}
    worker.stop()  # the process stops (or is killed) here
    train(master, master_net, master_opt, 4, seed=2)
    assert master.master.sync_once() == 1
    resumed, net2, _ = node(server, tmp_path, "w1")
    net2.load_state_dict(model_state)
    resumed.prepare_state(checkpoint)
    resumed.start()
    assert resumed.last_global_step == 1  # the newer global, installed before the first step
    sent = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 6, 0)))["weight"]
    assert torch.allclose(sent, checkpoint["baseline"]["weight"] - model_state["weight"])
    assert master.master.sync_once() == 2  # and it counts
    resumed.stop()
    # A node resumed at a boundary (or with nothing new) sends nothing extra.
    again, net3, _ = node(server, tmp_path, "w1")
    net3.load_state_dict(net2.state_dict())
    again.prepare_state(resumed.state_dict())
    again.start()
    assert again.last_global_step == 2 and delta_path("w1", 6, 1) not in again.hub.list_files()
    again.stop()
    master.stop()


@pytest.mark.parametrize("published", [True, False], ids=["round_between", "no_round_between"])
def test_a_node_resumed_from_before_a_delta_it_sent_sends_that_work_once(
    server, tmp_path, published
):
    """A node sends its step-4 delta, then dies before its next checkpoint, and resumes from its
    step-2 one: it trains steps 3-4 again. Where the master published a round meanwhile, the
    resumed node sent steps 1-2 again at start and steps 3-4 again at step 4 (under the new base),
    so the master applied that work twice.
    """
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    train(worker, net, opt, 2, seed=1)
    saved = snapshot(worker, net, opt)
    first = record_weights(worker)
    train(worker, net, opt, 2, seed=2)  # the step-4 delta leaves; then the process dies
    assert delta_path("w1", 4, 0) in worker.hub.list_files()
    if published:
        assert master.master.sync_once() == 1
    resumed, net2, opt2, events = resume(server, tmp_path, "w1", saved)
    if resumed.reset_after_start:
        opt2.state.clear()
    again = record_weights(resumed)
    train(resumed, net2, opt2, 2, seed=2)  # steps 3-4 again, on the same batches
    # Nothing of steps 1-4 leaves again: the step-4 delta in the repository holds them.
    assert [p for p in resumed.hub.delta_paths() if "/w1/" in p] == (
        [] if published else [delta_path("w1", 4, 0)]
    )
    assert not [e for e, _ in events if e.startswith("diloco/upload")]
    assert torch.equal(again[4], first[4])  # the replay is the first run's steps
    assert master.master.sync_once() == 1 and master.master.counters["applied"] == 1
    one_round = resumed.hub.download_global_state()
    assert resumed.last_global_step == int(published)
    if published:  # installed at step 4, as the first process would have at its next boundary
        assert torch.equal(net2.weight.detach(), one_round["weight"])
    # The work after it leaves as usual, and counts.
    weights = record_weights(resumed)
    train(resumed, net2, opt2, 4, seed=3)
    sent = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 8, int(published))))
    start = one_round["weight"] if published else first[4]
    assert torch.allclose(sent["weight"], start - weights[8], atol=1e-6)
    assert master.master.sync_once() == 2 and master.master.counters["applied"] == 2
    resumed.stop()
    worker.stop()
    master.stop()


@pytest.mark.parametrize(
    ("checkpoint_at", "failures"),
    [(2, 2), (6, 2), (6, 1)],
    ids=["checkpoint_before_the_failure", "checkpoint_keeps_it", "checkpoint_keeps_it_landed"],
)
def test_a_resumed_node_sends_exactly_its_deltas_missing_from_the_repository(
    server, tmp_path, checkpoint_at, failures
):
    """The step-4 upload fails and is kept, the step-8 one lands (its re-send before it fails too,
    or lands), and the node dies before its next checkpoint. Resumed from step 2, it counted every
    step through 8 as sent and steps 1-4 were lost; resumed from step 6, whose checkpoint keeps
    the step-4 delta, it sent that delta again even where it had landed.
    """
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.hub.retry_attempts = 1
    worker.start()
    first = record_weights(worker)
    for begin in range(0, 8, 2):  # then the process dies, after step 8
        if begin == 2:  # the step-4 upload, then its re-send at step 8
            server.faults.add("503", method="POST", path="/commit/", times=failures)
        if begin == checkpoint_at:
            saved = snapshot(worker, net, opt)
        train(worker, net, opt, 2, seed=10 + begin)
    assert worker.counters["upload_failures"] == failures
    missing = failures == 2
    resumed, net2, opt2, events = resume(server, tmp_path, "w1", saved)
    for begin in range(checkpoint_at, 8, 2):  # the same batches again
        train(resumed, net2, opt2, 2, seed=10 + begin)
    # Steps 1-4 leave once, as the earlier process computed them; steps 5-8 do not leave again.
    uploads = [p["local_step"] for e, p in events if e == "diloco/upload"]
    assert uploads == ([4] if missing else [])
    assert {p for p in resumed.hub.delta_paths() if "/w1/" in p} == {
        delta_path("w1", 4, 0),
        delta_path("w1", 8, 0),
    }
    kept = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 4, 0)))
    assert torch.allclose(kept["weight"], model(0).weight.detach() - first[4], atol=1e-6)
    assert master.master.sync_once() == 1 and master.master.counters["applied"] == 2
    resumed.stop()
    master.stop()


def test_a_node_resumed_several_boundaries_back_installs_the_global_at_the_last_one_sent(
    server, tmp_path
):
    """A node sends its step-4 and step-8 deltas (the master publishing a round after each), then
    dies before its next checkpoint, and resumes from its step-2 one. It installed the newest
    global at step 4 and trained steps 5-8 again on it, though that global held them already;
    the replay now installs nothing until step 8, the last boundary the earlier process sent.
    """
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    train(worker, net, opt, 2, seed=1)
    saved = snapshot(worker, net, opt)
    for seed in (2, 3):  # steps 3-4 and 5-8; a round follows each boundary
        train(worker, net, opt, 2 if seed == 2 else 4, seed=seed)
        assert master.master.sync_once() == seed - 1
    assert master.master.counters["applied"] == 2
    resumed, net2, opt2, events = resume(server, tmp_path, "w1", saved)
    assert resumed.last_global_step == 0
    train(resumed, net2, opt2, 2, seed=2)
    assert resumed.last_global_step == 0  # step 4 sent already: replayed, not installed over
    train(resumed, net2, opt2, 4, seed=3)
    latest = resumed.hub.download_global_state()
    assert resumed.last_global_step == 2 and torch.equal(net2.weight.detach(), latest["weight"])
    installs = [(p["outer_step"], p["local_step"]) for e, p in events if e.endswith("installed")]
    assert installs == [(2, 8)]
    assert not [e for e, _ in events if e.startswith("diloco/upload")]
    # The next boundary sends steps 9-12 alone, against the global it installed.
    weights = record_weights(resumed)
    train(resumed, net2, opt2, 4, seed=4)
    sent = from_safetensors_bytes(resumed.hub.read_bytes(delta_path("w1", 12, 2)))
    assert torch.allclose(sent["weight"], latest["weight"] - weights[12], atol=1e-6)
    assert master.master.sync_once() == 3 and master.master.counters["applied"] == 3
    resumed.stop()
    master.stop()


def test_a_resumed_node_that_cannot_list_its_deltas_says_so_and_trains_on(server, tmp_path, caplog):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1")
    worker.start()
    train(worker, net, opt, 4, seed=1)
    resumed, _, _ = node(server, tmp_path, "w1")
    resumed.prepare_state(worker.state_dict())

    def unreachable(node_id):
        raise HubError("list_files on org/run failed 5 times; last error: 503")

    resumed.hub.delta_steps = unreachable
    resumed.start()
    assert "could not list this node's deltas in org/run, so steps trained again" in caplog.text
    assert resumed.last_global_step == 0
    resumed.stop()
    worker.stop()
    master.stop()


def test_install_latest_global_between_boundaries(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", seed=3)
    worker.start()
    assert not worker.install_latest_global()  # nothing newer than outer step 0
    train(master, master_net, master_opt, 4, seed=1)
    train(worker, net, opt, 4, seed=2)
    assert master.master.sync_once() == 1  # a synchronous round, run by the caller
    assert worker.install_latest_global() and worker.last_global_step == 1
    assert torch.equal(net.weight.detach(), master.master.snapshot()[1]["weight"])
    worker.stop()
    master.stop()


@pytest.mark.parametrize(
    ("published", "refusal"),
    [
        (
            {"weight": torch.zeros(1, 4), "bias": torch.zeros(1)},
            r"has entries this model lacks.*bias",
        ),
        ({"weight": torch.zeros(2, 4)}, r"has other shapes for \['weight'\]"),
    ],
)
def test_a_global_model_of_another_model_is_refused_at_start(server, tmp_path, published, refusal):
    # An extra entry used to be installed into the baseline; the first delta then failed with
    # "current state lacks baseline tensors" mid-training instead of naming the repository.
    hub = client(server, tmp_path, "other")
    hub.create_repo()
    hub.publish_global(published, outer_step=0, consumed=[])
    worker, net, _ = node(server, tmp_path, "w1")
    with pytest.raises(HubError, match=f"org/run {refusal}.*different model"):
        worker.start()
    assert worker.last_global_step == -1


def test_a_module_of_another_dtype_than_the_global_is_refused_at_start(server, tmp_path):
    # It trained on, and the master skipped each of its deltas ("dtype torch.bfloat16 !=
    # torch.float32") where only the master's log showed it.
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, _ = node(server, tmp_path, "w1")
    net.to(torch.bfloat16)
    with pytest.raises(
        HubError, match=r"in org/run is torch.float32 where this model is torch.bfloat16"
    ):
        worker.start()
    assert worker.last_global_step == -1
    master.stop()


def test_a_worker_started_before_its_master_waits_for_the_repository_quietly(
    server, tmp_path, caplog
):
    # Each poll of the missing repository used to log "global poll failed ... 404", once a second.
    worker, _, _ = node(server, tmp_path, "w1", global_wait_timeout=1.0)
    worker.start()
    assert worker.last_global_step == -1 and "global poll failed" not in caplog.text
    assert "no global model in org/run after 1s (is its master running" in caplog.text
    worker.stop()


def test_worker_without_a_global_model_trains_but_sends_nothing(server, tmp_path, caplog):
    worker, net, opt = node(server, tmp_path, "w1")
    worker.hub.create_repo()
    worker.start()
    train(worker, net, opt, 4, seed=1)
    assert worker.hub.delta_paths() == [] and "no global model" in caplog.text
    worker.stop()


def test_failed_delta_after_a_global_install_is_resent_with_its_own_base(server, tmp_path):
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True)
    worker.hub.retry_attempts = 1
    worker.start()
    gate = threading.Event()
    original = worker.hub.transport.commit

    def failing_commit(*args, **kwargs):
        gate.wait(30)
        raise TransportError("injected outage", transient=True)

    worker.hub.transport.commit = failing_commit
    train(master, master_net, master_opt, 4, seed=3)
    master.master.sync_once()
    train(
        worker, net, opt, 4, seed=1
    )  # boundary: delta queued (its upload blocked), then global 1 installed
    assert worker.last_global_step == 1
    failed = worker.state_dict()["pending_uploads"][0]["delta"]["weight"].clone()
    gate.set()
    worker.stop()
    assert worker.counters["upload_failures"] == 1
    worker.hub.transport.commit = original
    worker.start()
    installed = {k: v.clone() for k, v in net.state_dict().items()}
    train(worker, net, opt, 4, seed=2)
    worker.stop()
    sent = {
        (ref.local_step, ref.base_outer_step): from_safetensors_bytes(
            worker.hub.read_bytes(ref.path)
        )["weight"]
        for ref in map(parse_delta_ref, worker.hub.delta_paths())
        if ref.node_id == "w1"
    }
    # The failed delta keeps its name and older base; the next holds only the newer work.
    assert sorted(sent) == [(4, 0), (8, 1)]
    assert torch.equal(sent[4, 0], failed)
    assert torch.allclose(sent[8, 1], installed["weight"] - net.weight.detach(), atol=1e-6)
    master.stop()


def diloco_reference(rounds, delay):
    """Hand-computed DiLoCo for one node, as `train` feeds it (round r: 4 steps of seed r): the
    pseudo-gradient is the round's start minus its end, the outer step torch.optim.SGD(lr 0.7,
    momentum 0.9, nesterov) on it, the inner AdamW reset at each boundary. delay 0 is the paper's
    synchronous round (the node restarts from the global its delta made); with delay 1 the node
    installs, at a boundary, the global the round before made, which lacks the delta it just sent.
    Return (the global model's weight, the node's).
    """
    net = model(0)
    opt = torch.optim.AdamW(net.parameters(), lr=0.05)
    weight = torch.nn.Parameter(net.weight.detach().clone())
    outer = torch.optim.SGD([weight], lr=0.7, momentum=0.9, nesterov=True)
    start = weight.detach().clone()
    for index in range(rounds):
        gen = torch.Generator().manual_seed(index)
        for _ in range(4):
            x = torch.randn(16, 4, generator=gen)
            loss = torch.nn.functional.mse_loss(net(x), x @ TRUE_W.T)
            opt.zero_grad()
            loss.backward()
            opt.step()
        weight.grad = start - net.weight.detach()
        published = weight.detach().clone()  # the previous round's global
        outer.step()
        opt.state.clear()
        if delay == 0:
            published = weight.detach().clone()
        elif index == 0:  # outer step 0 is installed already: the node trains on
            published = net.weight.detach().clone()
        with torch.no_grad():
            net.weight.copy_(published)
        start = published
    return weight.detach(), net.weight.detach()


def test_a_lone_master_with_max_local_rounds_1_runs_the_papers_synchronous_rounds(server, tmp_path):
    # Each boundary waits for the round of the delta it sent: every round starts from the global
    # model the last one made, as in DiLoCo's algorithm (k = 1).
    master, net, opt = node(
        server,
        tmp_path,
        "master",
        max_local_rounds=1,
        global_wait_timeout=60.0,
        async_global_poll=True,  # the master's round stages its global for the waiting node
        poll_interval=0.1,  # the master's own thread runs the rounds
    )
    master.start()
    for index in range(3):
        train(master, net, opt, 4, seed=index)
    outer_step, state = master.master.snapshot()
    weight, inner = diloco_reference(3, delay=0)
    assert outer_step == 3 and master.last_global_step == 3
    assert torch.allclose(state["weight"], weight, rtol=0, atol=1e-6)
    assert torch.allclose(net.weight.detach(), inner, rtol=0, atol=1e-6)
    master.stop()


def test_a_lone_master_that_never_waits_applies_each_delta_one_round_late(server, tmp_path):
    # docs/diloco.md (tuning notes): with max_local_rounds null a node installs, at a boundary,
    # the global that lacks the delta it sends there, so even a master alone trains on a global
    # one outer step behind the one its delta is applied to. Each delta still counts once.
    master, net, opt = node(server, tmp_path, "master", staleness_limit=None)
    master.start()
    for index in range(3):
        train(master, net, opt, 4, seed=index)
        master.master.sync_once()  # a round right after each boundary
    outer_step, state = master.master.snapshot()
    weight, inner = diloco_reference(3, delay=1)
    assert outer_step == 3 and master.master.counters["applied"] == 3
    assert torch.allclose(state["weight"], weight, rtol=0, atol=1e-6)
    assert torch.allclose(net.weight.detach(), inner, rtol=0, atol=1e-6)
    assert not torch.allclose(weight, diloco_reference(3, delay=0)[0], rtol=0, atol=1e-3)
    master.stop()


def test_a_node_waits_after_max_local_rounds_until_a_newer_global_arrives(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    events = []
    worker, net, opt = node(
        server,
        tmp_path,
        "w1",
        max_local_rounds=2,
        global_wait_timeout=60.0,
        async_global_poll=True,
        poll_interval=0.05,
    )
    worker.events = lambda event, payload: events.append((event, payload))
    worker.start()
    training = threading.Thread(target=train, args=(worker, net, opt, 8, 1))
    training.start()
    wait_for(lambda: worker.local_step == 8, "the worker to reach its second boundary")
    training.join(0.5)
    assert (
        training.is_alive() and worker.last_global_step == 0
    )  # waiting instead of drifting further
    assert master.master.sync_once() == 1  # the worker's two deltas make outer step 1
    training.join(30)
    assert not training.is_alive() and worker.last_global_step == 1
    assert torch.equal(net.weight.detach(), master.master.snapshot()[1]["weight"])
    waits = [payload for event, payload in events if event == "diloco/global_wait"]
    assert (
        len(waits) == 1
        and waits[0]["installed"]
        and waits[0]["rounds"] == 2
        and waits[0]["seconds"] >= 0.5
    )
    worker.stop()
    master.stop()


def test_a_waiting_node_trains_on_after_global_wait_timeout_and_waits_again_later(
    server, tmp_path, caplog
):
    master, _, _ = node(server, tmp_path, "master")
    master.start()  # publishes outer step 0 and never runs a round
    worker, net, opt = node(server, tmp_path, "w1", max_local_rounds=2, global_wait_timeout=0.2)
    worker.start()
    train(worker, net, opt, 16, seed=1)  # boundaries 4, 8, 12, 16: waits at 8 and 16
    assert worker.local_step == 16 and worker.counters["global_waits"] == 2
    assert worker.counters["seconds_waited"] >= 0.4
    assert "no global model newer than outer step 0 after" in caplog.text
    unbounded, net2, opt2 = node(
        server, tmp_path, "w2", max_local_rounds=None, global_wait_timeout=60.0
    )
    unbounded.start()
    train(unbounded, net2, opt2, 16, seed=1)
    assert unbounded.counters["global_waits"] == 0
    for coordinator in (worker, unbounded, master):
        coordinator.stop()


def test_a_failed_delta_resent_during_a_wait_does_not_move_the_baseline_back(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()  # publishes outer step 0 and runs no round, so the worker's wait times out
    worker, net, opt = node(
        server, tmp_path, "w1", async_delta_upload=True, max_local_rounds=2, global_wait_timeout=3.0
    )
    worker.hub.retry_attempts = 1
    worker.start()
    weights = record_weights(worker)
    gate, calls = threading.Event(), []
    original = worker.hub.transport.commit

    def first_commit_fails(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            gate.wait(30)
            raise TransportError("injected outage", transient=True)
        return original(*args, **kwargs)

    worker.hub.transport.commit = first_commit_fails
    train(worker, net, opt, 4, seed=1)  # boundary 4: in flight, then fails
    wait_for(lambda: worker._inflight is not None, "the lane to take the step-4 upload")
    threading.Timer(0.3, gate.set).start()
    train(
        worker, net, opt, 4, seed=2
    )  # boundary 8: queued; waits: step 4 fails, step 8 lands, step 4 re-sent
    assert worker.counters["global_waits"] == 1 and worker.counters["upload_failures"] == 1
    train(worker, net, opt, 4, seed=3)  # boundary 12
    worker.stop()
    assert {delta_path("w1", step, 0) for step in (4, 8, 12)} <= set(worker.hub.delta_paths())
    sent = from_safetensors_bytes(worker.hub.read_bytes(delta_path("w1", 12, 0)))["weight"]
    assert torch.allclose(sent, weights[8] - weights[12], atol=1e-6)  # steps 5-8 are not sent twice
    master.stop()


def test_a_waiting_node_resends_a_failed_delta_at_once(server, tmp_path):
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(
        server,
        tmp_path,
        "w1",
        async_delta_upload=True,
        async_global_poll=True,
        poll_interval=0.05,
        max_local_rounds=1,
        global_wait_timeout=60.0,
    )
    worker.hub.retry_attempts = 1
    worker.start()
    server.faults.add("503", method="POST", path="/commit/", times=1)
    training = threading.Thread(target=train, args=(worker, net, opt, 4, 1))
    training.start()
    # Without the re-send the master would never see this node's work and the wait would time out.
    wait_for(lambda: worker.hub.delta_paths(), "the failed delta to be re-sent during the wait")
    assert training.is_alive() and worker.counters["upload_failures"] == 1
    assert master.master.sync_once() == 1
    training.join(30)
    assert worker.last_global_step == 1 and worker.counters["uploads"] == 1
    worker.stop()
    master.stop()


def test_events_reach_a_metric_logger_object(server, tmp_path):
    class Logger:
        def __init__(self):
            self.events = []

        def on_event(self, event, payload):
            self.events.append(event)

    sink = Logger()
    master, net, opt = node(server, tmp_path, "master")
    master.events = sink
    master.start()
    train(master, net, opt, 4, seed=1)
    master.master.sync_once()
    assert {"diloco/global_installed", "diloco/upload", "diloco/outer_round"} <= set(sink.events)
    master.stop()


def test_events_reach_an_emit_only_logger(server, tmp_path):
    class EmitLogger:  # the trainer's MetricLogger shape: emit(event, payload), not callable
        def __init__(self):
            self.events = []

        def emit(self, event, payload):
            self.events.append((event, payload))

    sink = EmitLogger()
    master, net, opt = node(server, tmp_path, "master")
    master.events = sink
    master.start()
    train(master, net, opt, 4, seed=1)
    master.master.sync_once()
    names = [event for event, _ in sink.events]
    assert {"diloco/global_installed", "diloco/upload", "diloco/outer_round"} <= set(names)
    assert all(payload["node_id"] == "master" for _, payload in sink.events)
    master.stop()


def test_a_metric_logger_passed_as_logger_gets_the_events(server, tmp_path):
    class MetricLogger:
        def __init__(self):
            self.events = []

        def on_event(self, event, payload):
            self.events.append(event)

    metrics = MetricLogger()
    coordinator = DumbDiLoCoCoordinator(
        section(role="master", node_id="master"),
        model(),
        hub=client(server, tmp_path, "m"),
        state_dir=tmp_path / "m",
        logger=metrics,
    )
    coordinator.start()
    assert (
        "diloco/global_installed" in metrics.events
        and coordinator.logger.name == "speedtronic_diloco.diloco"
    )
    coordinator.stop()


def test_a_refused_token_stops_the_node_with_the_fix_instead_of_training_alone(tmp_path):
    # A wrong token made a worker wait out global_wait_timeout and train without the run; a
    # read-only one kept every refused delta for retry, in memory and checkpoints, without end.
    with HubServer(tokens={"hf_write": "write", "hf_read": "read"}) as server:

        def joined(name, token, **overrides):
            transport = HfApiTransport(
                "org/run", token=token, endpoint=server.url, cache_dir=tmp_path / name
            )
            hub = HubClient("org/run", transport=transport, sleeper=lambda s: None)
            coordinator = DumbDiLoCoCoordinator(
                section(node_id=name, **overrides), model(), hub=hub, state_dir=tmp_path / name
            )
            return coordinator

        master = joined("master", "hf_write", role="master")
        master.start()
        # huggingface_hub 1.x has no huggingface-cli: the fix names the command it does have.
        with pytest.raises(HubRefused, match="401.*write access to org/run.*`hf auth login`"):
            joined("w1", "hf_wrong", global_wait_timeout=5.0).start()
        # No token at all: the Hub hides the private repository (401, RepositoryNotFoundError).
        with pytest.raises(HubRefused, match="401.*write access to org/run.*HF_TOKEN"):
            joined("w3", False, global_wait_timeout=5.0).start()
        # A read-only token: refused at start now, by the node id's claim, before a step.
        with pytest.raises(HubRefused, match="claim nodes/w2.json on org/run was refused.*403"):
            joined("w2", "hf_read").start()
        # A token that loses its write access mid-run: the refused delta is kept.
        revoked = joined("w4", "hf_write")
        revoked.start()
        revoked.hub.transport.api.token = "hf_read"
        net = revoked.model
        with pytest.raises(HubRefused, match="upload deltas/w4/.* on org/run was refused.*403"):
            train(revoked, net, torch.optim.AdamW(net.parameters()), 4, seed=1)
        assert [job["step"] for job in revoked.state_dict()["pending_uploads"]] == [4]
        master.stop()


def test_a_node_id_claimed_by_another_process_stops_the_first_one(server, tmp_path):
    # Deltas are named by node id and step: two workers left at one default node id overwrote
    # each other's deltas, and the master applied whichever landed last, without a word.
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    first, net, opt = node(server, tmp_path, "w1", seed=1)
    first.start()
    train(first, net, opt, 4, seed=1)  # its first delta claims w1
    # A requeued job resumed from the first one's checkpoint while the first still runs.
    second, net2, opt2 = node(server, tmp_path / "second", "w1", seed=2)
    net2.load_state_dict(net.state_dict())
    second.prepare_state(first.state_dict())
    second.start()
    train(second, net2, opt2, 4, seed=2)
    with pytest.raises(
        HubError, match="another process now runs node 'w1'.*own distributed.node_id"
    ):
        train(first, net, opt, 4, seed=3)
    train(second, net2, opt2, 4, seed=4)  # the newer claim trains on
    for coordinator in (first, second, master):
        coordinator.stop()


def test_a_worker_started_afresh_under_a_used_node_id_refuses_at_start(
    server, tmp_path, caplog, dead_pid, monkeypatch
):
    # Two workers left at one default node id (worker-<hostname>) started together: the id was
    # claimed only at the first delta, so both trained, the second's step-4 delta overwrote the
    # first's unread one (the master applied 1 of 2), and only then did the first stop.
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    first, net, opt = node(server, tmp_path, "w1", seed=1)
    first.start()  # claims w1 before its first step
    together, _, _ = node(server, tmp_path / "together", "w1", seed=2)
    # The first runs now, on this host: resuming would be a second process of w1 too.
    running = (
        rf"^node 'w1' runs now in process {os.getpid()} on this host \(nodes/w1.json in "
        r"org/run\): .*; give this node another distributed.node_id$"
    )
    with pytest.raises(HubError, match=running):
        together.start()
    # One whose claim at start failed claims before its first delta: it stops, sending nothing.
    third, net3, opt3 = node(server, tmp_path / "third", "w1", seed=3)
    claim = third.hub.claim_node

    def unavailable_once(*args, **kwargs):
        third.hub.claim_node = claim
        raise HubError("503 from the Hub")

    third.hub.claim_node = unavailable_once
    third.start()
    assert "could not claim node id 'w1' yet, claiming it before the first delta: 503" in (
        caplog.text
    )
    with pytest.raises(HubError, match=running):
        train(third, net3, opt3, 4, seed=3)
    assert third.counters["uploads"] == 0
    installed, weights = net.weight.detach().clone(), record_weights(first)
    train(first, net, opt, 4, seed=1)
    sent = from_safetensors_bytes(first.hub.read_bytes(delta_path("w1", 4, 0)))
    assert torch.equal(sent["weight"], installed - weights[4])  # the first node's own work
    first.stop()  # the process ends; its delta waits for the master's next round
    claim = first.hub.read_json("nodes/w1.json")
    assert (claim["host"], claim["pid"]) == (socket.gethostname(), os.getpid())
    first.hub.write_json("nodes/w1.json", {**claim, "pid": dead_pid})  # as its process died
    # Restarted without its checkpoint, a worker counted its steps from 0 again: its step-4
    # delta took the name of the earlier process's, unread by the master, and overwrote it.
    # The refusal told a node that wrote no checkpoint (it sent its delta first, then died) to
    # --resume, which finds none and starts afresh: refused again, with the same advice.
    used = (
        r"^node 'w1' already ran in org/run or runs there now \(nodes/w1.json\) and this process "
        r"starts without its checkpoint: .*; resume it from its checkpoint \(--resume, the same "
        r"run.output_dir\), or, where it wrote none, give this node a new distributed.node_id "
        r"\(deleting nodes/w1.json would let them collide\)$"
    )
    again, _, _ = node(server, tmp_path / "again", "w1", seed=2)
    with pytest.raises(HubError, match=used):
        again.start()
    # A pid this user may not signal (another user's process took it, or runs the node) was
    # said to run the node now: it is still not taken over, but it may have ended.
    with monkeypatch.context() as patched:

        def not_permitted(pid, signal):
            raise PermissionError(1, "Operation not permitted")

        patched.setattr(os, "kill", not_permitted)
        with pytest.raises(
            HubError,
            match=rf"^node 'w1' may still run in process {dead_pid} on this host \(nodes/w1.json "
            r"in org/run; whether it has ended cannot be checked\): .*another distributed.node_id$",
        ):
            node(server, tmp_path / "unknown", "w1", seed=2)[0].start()
    # A worker whose process died on this host before its first delta (a crash in its first
    # steps, a torchrun restart before its first checkpoint) left its claim and no delta:
    # restarted afresh, it was refused too, though no name of its could be taken. It trains.
    first.hub.write_json("nodes/w3.json", {**claim, "session": "dead", "pid": dead_pid})
    other, net3, opt3 = node(server, tmp_path / "other", "w3", seed=3)
    other.start()
    train(other, net3, opt3, 4, seed=2)
    assert other.hub.node_session("w3") == other._session
    assert master.master.sync_once() == 1  # the earlier w1's delta and w3's, both applied
    assert master.master.processed_filenames == {delta_path("w1", 4, 0), delta_path("w3", 4, 0)}
    assert delta_path("w1", 4, 0) not in master.hub.list_files()  # deleted, named in the manifest
    with pytest.raises(HubError, match=used):
        node(server, tmp_path / "applied", "w1", seed=2)[0].start()
    for coordinator in (other, third, master):
        coordinator.stop()


def test_a_master_started_afresh_under_a_used_node_id_refuses_and_a_resumed_one_loses_nothing(
    server, tmp_path, dead_pid
):
    # A master trains and sends deltas like a worker: restarted without its checkpoint (its outer
    # state still on disk), its step-4 delta overwrote the unread one of the process before it.
    first, net, opt = node(server, tmp_path, "master")
    first.start()
    train(first, net, opt, 4, seed=1)  # deltas/master/step-4-base-0, not read yet
    first.master.stop()  # the process dies: no last round
    claim = first.hub.read_json("nodes/master.json")
    first.hub.write_json("nodes/master.json", {**claim, "pid": dead_pid})
    again, _, _ = node(server, tmp_path, "master")
    with pytest.raises(HubError, match=r"node 'master' already ran in org/run or runs .*--resume"):
        again.start()
    resumed, net2, opt2 = node(server, tmp_path, "master")
    net2.load_state_dict(net.state_dict())
    resumed.prepare_state(first.state_dict())
    resumed.start()
    train(resumed, net2, opt2, 4, seed=2)
    assert resumed.master.sync_once() == 1  # the earlier process's delta and its own, both
    assert resumed.master.processed_filenames == {
        delta_path("master", 4, 0),
        delta_path("master", 8, 0),
    }
    resumed.stop()


def test_a_second_master_takes_over_and_the_first_publishes_nothing_more(server, tmp_path, caplog):
    # A requeued master job can start while the old one still runs: two masters publishing
    # forked the global model. The newer one claims the id at start; the older one stops.
    first, net, opt = node(server, tmp_path, "master")
    first.start()
    worker, wnet, wopt = node(server, tmp_path, "w1", seed=1)
    worker.start()
    train(worker, wnet, wopt, 4, seed=1)  # a delta for the next round
    # A requeued job resumed from the first one's checkpoint on another machine: its disk has no
    # outer state, and its model is not the published one.
    second, net2, opt2 = node(server, tmp_path / "second", "master", seed=2)
    second.prepare_state(first.state_dict())
    second.start()  # adopts outer step 0 and claims the id
    published = first.hub.global_metadata()
    assert published.outer_step == 0
    assert torch.equal(second.master.snapshot()[1]["weight"], net.weight)
    assert first.master.sync_once() == 1  # it applies the delta locally, but publishes nothing
    assert first.hub.global_metadata() == published and first.master.counters["publish_failures"]
    assert "another process now runs node 'master'" in caplog.text
    with pytest.raises(HubError, match="another process now runs node 'master'"):
        train(first, net, opt, 4, seed=3)
    first.stop()  # nor does its last round on the way out
    assert first.hub.global_metadata() == published
    assert second.master.sync_once() == 1  # the delta the first one did not consume
    assert second.hub.global_metadata().outer_step == 1
    train(worker, wnet, wopt, 4, seed=2)
    assert worker.last_global_step == 1
    for coordinator in (worker, second):
        coordinator.stop()


def test_token_never_in_logs_or_state(server, tmp_path, caplog):
    caplog.set_level("DEBUG")
    master, net, opt = node(server, tmp_path, "master")
    master.start()
    train(master, net, opt, 4, seed=1)
    assert "hf_SECRET_in_config" not in caplog.text + repr(master.state_dict()) + repr(master.hub)
    master.stop()


def test_shared_folder_transport_from_config(tmp_path):
    shared = tmp_path / "nfs"
    nodes, events = [], []
    for name, seed in [("master", 0), ("w1", 1)]:
        net = model(seed)
        cfg = SimpleNamespace(
            run=SimpleNamespace(output_dir=str(tmp_path / name)),
            distributed=section(
                role="master" if name == "master" else "worker",
                node_id=name,
                transport="filesystem",
                endpoint=str(shared),
                prune_after=1e-6,  # every version the latest files no longer use is old
            ),
        )
        coordinator = DumbDiLoCoCoordinator(cfg, net, events=lambda *event: events.append(event))
        coordinator.start()
        nodes.append((coordinator, net, torch.optim.AdamW(net.parameters(), lr=0.05)))
    (master, _, _), (worker, net, opt) = nodes
    assert (shared / "org" / "run" / "refs").is_dir()
    assert (
        tmp_path
        / "master"
        / ".speedtronic"
        / "diloco"
        / "master"
        / "outer"
        / "outer_state.safetensors"
    ).exists()
    train(worker, net, opt, 4, seed=1)
    objects = shared / "org" / "run" / "objects"
    before = {p.name for p in objects.iterdir()}
    assert master.master.sync_once() == 1
    # The master pruned after its round: outer step 0's model, metadata and manifest and the
    # consumed delta are gone; what the latest files use stays.
    transport = master.hub.transport
    latest = set(transport._tree(transport.head()).values())
    assert {p.name for p in objects.iterdir()} == latest and len(before - latest) == 4
    ((_, pruned),) = [event for event in events if event[0] == "diloco/pruned"]
    assert pruned["outer_step"] == 1 and pruned["files"] == 4 and pruned["bytes"] > 0
    train(worker, net, opt, 4, seed=2)
    assert worker.last_global_step == 1
    for coordinator, _, _ in nodes:
        coordinator.stop()


def test_an_upload_lane_error_outside_hub_errors_keeps_the_delta_and_the_lane(server, tmp_path):
    """A shared folder that is full (or any failure that is not a HubError) fails one upload: the
    delta is re-sent under its own name and the lane goes on. The lane thread died instead, the
    in-flight delta was in no retry list and no checkpoint, and no later delta left.
    """
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True)
    transport = worker.hub.transport
    commit, failed = transport.commit, []

    def full_disk_once(files, deletions, **kwargs):
        if not failed and any(path.startswith("deltas/") for path in files):
            failed.append(True)
            raise OSError(28, "No space left on device")
        return commit(files, deletions, **kwargs)

    transport.commit = full_disk_once
    worker.start()
    baseline = {k: v.clone() for k, v in net.state_dict().items()}
    train(worker, net, opt, 4, seed=1)
    wait_for(
        lambda: failed and worker._inflight is None and worker._uploads.empty(),
        "the first upload to fail",
    )
    train(worker, net, opt, 4, seed=2)
    worker.stop()
    assert worker.state_dict()["pending_uploads"] == []
    paths = sorted(worker.hub.delta_paths())
    assert paths == [delta_path("w1", 4, 0), delta_path("w1", 8, 0)]
    sent = sum(from_safetensors_bytes(worker.hub.read_bytes(p))["weight"] for p in paths)
    assert torch.allclose(sent, baseline["weight"] - net.weight.detach(), atol=1e-6)
    master.stop()


def test_a_poll_lane_error_outside_hub_errors_does_not_stop_polling(server, tmp_path):
    """One poll failing with something other than a HubError (a malformed step_count.json, an
    OSError of a shared folder) killed the poll lane: the node never installed a global again.
    """
    master, master_net, master_opt = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(
        server, tmp_path, "w1", async_global_poll=True, poll_interval=0.01, inner_steps=3
    )
    metadata, failed = worker.hub.global_metadata, []

    def broken_once():
        if not failed:
            failed.append(True)
            raise TypeError("'NoneType' object is not iterable")
        return metadata()

    worker.start()
    worker.hub.global_metadata = broken_once
    wait_for(lambda: failed, "the poll to fail")
    train(master, master_net, master_opt, 4, seed=5)
    master.master.sync_once()  # outer step 1 published
    wait_for(lambda: worker._candidate is not None, "the poll lane to fetch outer step 1")
    train(worker, net, opt, 3, seed=1)
    assert worker.last_global_step == 1
    worker.stop()
    master.stop()


def test_a_checkpoint_taken_before_a_failed_upload_is_collected_keeps_its_delta(server, tmp_path):
    """The lane's result of a failed upload waits until the training thread collects it; a
    checkpoint taken in between held the job in no list, and its steps were lost on resume."""
    master, _, _ = node(server, tmp_path, "master")
    master.start()
    worker, net, opt = node(server, tmp_path, "w1", async_delta_upload=True)
    worker.hub.retry_attempts = 1
    worker.start()
    server.faults.add("503", method="POST", path="/commit/", times=1)
    train(worker, net, opt, 4, seed=1)  # the step-4 delta is queued; its upload fails
    wait_for(lambda: not worker._results.empty(), "the upload to fail")
    state = worker.state_dict()
    assert [job["step"] for job in state["pending_uploads"]] == [4]
    worker.stop()
    master.stop()


def test_a_node_whose_data_has_another_tokenizer_refuses_the_global_model(server, tmp_path):
    # Nodes tokenized with different tokenizers of one vocabulary size build the same shapes:
    # the worker joined and its deltas, whose ids mean other text, were averaged in unnoticed.
    bpe = {"kind": "tokenizers", "vocab_size": 256, "name": "tokenizer.json", "sha256": "a" * 64}
    master = node(server, tmp_path, "master", tokenizer=bpe)[0]
    master.start()  # publishes outer step 0 with its tokenizer
    assert master.hub.global_metadata().tokenizer == bpe
    stranger = node(server, tmp_path, "w1", tokenizer={**bpe, "sha256": "b" * 64})[0]
    with pytest.raises(
        HubError,
        match=r"^global model at outer step 0 in org/run was trained on tokens of tokenizer.json "
        r"\(256 ids, sha256 aaaaaaaaaaaa\), but this node's data holds tokens of tokenizer.json "
        r"\(256 ids, sha256 bbbbbbbbbbbb\); prepare this node's data with the run's tokenizer, or "
        r"give it its own distributed.repo_id$",
    ):
        stranger.start()
    joined = node(server, tmp_path, "w2", tokenizer=dict(bpe))[0]  # the run's tokenizer joins
    joined.start()
    assert joined.last_global_step == 0
    for coordinator in (joined, master):
        coordinator.stop()


def test_a_worker_whose_outer_settings_differ_from_the_masters_says_the_masters_are_used(
    server, tmp_path, caplog
):
    # Only the master applies the outer step: a worker's own outer_lr was ignored without a word.
    master = node(server, tmp_path, "master")[0]
    master.start()
    assert master.hub.global_metadata().outer == {"outer_lr": 0.7, "outer_momentum": 0.9}
    with caplog.at_level("WARNING"):
        same = node(server, tmp_path, "w1")[0]
        same.start()
        assert not [r for r in caplog.records if "outer" in r.getMessage()]
        other = node(server, tmp_path, "w2", outer_lr=0.3)[0]
        other.start()
        other._fetch_global_candidate()  # a later poll of the same master warns no more
    (record,) = [r for r in caplog.records if "outer" in r.getMessage()]
    assert record.getMessage() == (
        "this node's outer_lr differs from the master's (outer_lr 0.3 here, 0.7 there): only the "
        "master applies the outer step, so the master's is used; set it on the master to change it"
    )
    for coordinator in (other, same, master):
        coordinator.stop()
