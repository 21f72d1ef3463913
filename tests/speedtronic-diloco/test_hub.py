"""HubClient over the real HfApi against the loopback server, and over the shared-folder
transport.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from types import SimpleNamespace

import pytest
import torch

from speedtronic_diloco.hub import (
    CAS_ATTEMPTS,
    GLOBAL_MANIFEST,
    GLOBAL_METADATA,
    GLOBAL_MODEL,
    GlobalMetadata,
    HubClient,
    HubError,
    HubRefused,
    HubUnavailable,
    build_hub_client,
)
from speedtronic_diloco.tensors import delta_path, from_safetensors_bytes
from speedtronic_diloco.testing.hub_server import HubServer
from speedtronic_diloco.transport import FilesystemTransport, HfApiTransport, TransportError


@pytest.fixture(params=["hub", "filesystem"])
def any_hub(request, tmp_path):
    """The same client contract over both transports."""
    if request.param == "hub":
        return request.getfixturevalue("hub")
    client = HubClient(
        "org/run",
        transport=FilesystemTransport(tmp_path / "shared" / "org" / "run"),
        sleeper=lambda s: None,
    )
    client.create_repo()
    return client


def _commits(server):
    import urllib.request

    return json.loads(urllib.request.urlopen(server.url + "/_test/log").read())


def test_file_operations(any_hub, tmp_path):
    any_hub.create_repo()  # idempotent
    assert any_hub.read_json("cfg.json", default={"none": 1}) == {"none": 1}
    any_hub.write_json("cfg.json", {"a": [1, 2]})
    assert any_hub.read_json("cfg.json") == {"a": [1, 2]} and any_hub.file_exists("cfg.json")
    source = tmp_path / "x.bin"
    source.write_bytes(b"payload")
    any_hub.upload(source, "folder/x.bin")
    assert any_hub.download("folder/x.bin", tmp_path / "out.bin").read_bytes() == b"payload"
    with pytest.raises(HubError, match="folder/missing.bin"):
        any_hub.read_bytes("folder/missing.bin")
    any_hub.write_json("bad.json", None)
    any_hub.upload_bytes(b"{not json", "bad.json")
    with pytest.raises(HubError, match="not JSON"):
        any_hub.read_json("bad.json")


def test_publish_is_one_commit_and_readers_pin_the_revision(any_hub):
    assert any_hub.global_metadata() is None
    first = any_hub.publish_global({"w": torch.zeros(3)}, outer_step=0)
    any_hub.upload_delta({"w": torch.ones(3)}, node_id="n1", local_step=10, base_outer_step=0)
    seen = any_hub.global_metadata()
    assert seen.outer_step == 0 and seen.revision is not None and seen.sha256 == first.sha256
    second = any_hub.publish_global(
        {"w": torch.full((3,), 2.0)}, outer_step=1, consumed=[delta_path("n1", 10, 0)]
    )
    # The metadata read before the second publish still downloads the model it describes.
    assert torch.equal(any_hub.download_global_state(seen)["w"], torch.zeros(3))
    latest = any_hub.global_metadata()
    assert latest.outer_step == 1 and latest.revision == second.revision
    assert torch.equal(any_hub.download_global_state()["w"], torch.full((3,), 2.0))
    assert any_hub.delta_paths() == []  # consumed in the publishing commit
    assert any_hub.read_manifest(latest)["processed"] == [delta_path("n1", 10, 0)]
    with pytest.raises(HubError, match="second master"):
        any_hub.publish_global({"w": torch.zeros(3)}, outer_step=1)


def test_publish_writes_model_metadata_and_manifest_together(hub, server):
    hub.publish_global({"w": torch.zeros(2)}, outer_step=0)
    last = _commits(server)[-1]
    assert sorted(last["added"]) == sorted([GLOBAL_MODEL, GLOBAL_METADATA, GLOBAL_MANIFEST])


def test_upload_retry_after_a_lost_response_commits_once(hub, server):
    server.faults.add("lost", method="POST", path="/commit/")
    path = hub.upload_delta({"w": torch.ones(2)}, node_id="n", local_step=3, base_outer_step=0)
    assert hub.delta_paths() == [path]
    assert [c["added"] for c in _commits(server)].count([path]) == 1


def test_publish_retry_after_lost_response_and_stale_parent(hub, server):
    hub.publish_global({"w": torch.zeros(2)}, outer_step=0)
    server.faults.add("stale", method="POST", path="/commit/")
    server.faults.add("lost", method="POST", path="/commit/")
    meta = hub.publish_global({"w": torch.ones(2)}, outer_step=1)
    assert hub.global_metadata().publish_id == meta.publish_id
    publishes = [c for c in _commits(server) if GLOBAL_MODEL in c["added"]]
    assert len(publishes) == 2  # step 0 and step 1, the retried one not duplicated


def test_publish_lands_while_every_attempt_loses_the_race_to_a_delta_commit(hub, server):
    hub.publish_global({"w": torch.zeros(2)}, outer_step=0)
    server.faults.add(
        "stale", method="POST", path="/commit/", times=1000
    )  # a worker's delta always lands first
    meta = hub.publish_global({"w": torch.ones(2)}, outer_step=1)
    server.faults.script.clear()
    assert (
        server.faults.injected["stale"] == CAS_ATTEMPTS + 1
    )  # bounded rebasing, then one commit without CAS
    assert (
        hub.global_metadata().publish_id == meta.publish_id
        and hub.global_metadata().outer_step == 1
    )
    assert [GLOBAL_MODEL in c["added"] for c in _commits(server)].count(True) == 2


def test_of_two_processes_claiming_a_free_node_id_at_once_exactly_one_wins(any_hub, monkeypatch):
    # Two fresh nodes under one id both read the claim as free before either wrote it, and both
    # went on to send deltas under the same names: the claim is read and written in one CAS.
    read, rival = any_hub.read_json, []

    def rival_claims_after_this_read(path, **kwargs):
        claim = read(path, **kwargs)
        if not rival:  # another process claims the id between this read and this write
            rival.append("B")
            assert any_hub.claim_node("w1", "B", take_over=False) is None
        return claim

    monkeypatch.setattr(any_hub, "read_json", rival_claims_after_this_read)
    assert any_hub.claim_node("w1", "A", take_over=False)["session"] == "B"  # B's claim
    assert any_hub.node_session("w1") == "B"
    assert any_hub.claim_node("w1", "B", take_over=False) is None  # its own: claimed again
    assert any_hub.claim_node("w1", "C") is None and any_hub.node_session("w1") == "C"  # resumed


# The Hub transport's listing is covered by test_diloco's restart test; the folder is faster.
@pytest.mark.parametrize("any_hub", ["filesystem"], indirect=True)
def test_a_fresh_claim_takes_over_only_a_dead_process_of_this_host_that_sent_no_delta(
    any_hub, monkeypatch, dead_pid
):
    # A node restarted afresh after its process died before its first delta (a crash in its
    # first steps, a torchrun restart before the first checkpoint) was refused at start, though
    # no delta of its id could take a new one's name.
    any_hub.upload_delta({"w": torch.ones(2)}, node_id="w10", local_step=4, base_outer_step=0)
    any_hub.claim_node("w1", "old")  # by this process: its host, pid namespace and pid
    claim = any_hub.read_json("nodes/w1.json")
    assert (claim["host"], claim["pid"]) == (socket.gethostname(), os.getpid())

    def left(**fields):
        any_hub.write_json("nodes/w1.json", {**claim, **fields})

    # Two such restarts at once: the take-over is a compare-and-swap too, one of them wins.
    left(pid=dead_pid)
    read = any_hub.read_json

    def rival_takes_over_after_this_read(path, **kwargs):
        monkeypatch.setattr(any_hub, "read_json", read)
        held = read(path, **kwargs)
        assert any_hub.claim_node("w1", "B", take_over=False) is None  # w10's delta is not w1's
        return held

    monkeypatch.setattr(any_hub, "read_json", rival_takes_over_after_this_read)
    assert any_hub.claim_node("w1", "A", take_over=False)["session"] == "B"
    assert any_hub.node_session("w1") == "B"
    # Refused: alive (this process), on another host or in another pid namespace (a container
    # with the host's network), from a run that recorded no host and pid, or possibly alive
    # (another user's process: os.kill raises PermissionError).
    elsewhere = {"host": "elsewhere", "pid": dead_pid}
    # A live process of another machine of this hostname (an image's default, `localhost`: then
    # the default node id worker-<hostname> is the same too) was taken for a dead one here: its
    # pid is no process of this machine, and outside containers its pid namespace is this one's
    # (the kernel gives every machine's first pid namespace one inode, pid:[4026531836]).
    machine = {"boot_id": "another machine's boot", "pid": dead_pid}
    for fields in ({}, elsewhere, {"pid_namespace": "pid:[1]", "pid": dead_pid}, machine):
        left(**fields)
        assert any_hub.claim_node("w1", "new", take_over=False)["session"] == "old"
    any_hub.write_json("nodes/w1.json", {"session": "old", "claimed_at": claim["claimed_at"]})
    assert any_hub.claim_node("w1", "new", take_over=False)["session"] == "old"
    left(pid=dead_pid)
    with monkeypatch.context() as patched:

        def not_permitted(pid, signal):
            raise PermissionError(1, "Operation not permitted")

        patched.setattr(os, "kill", not_permitted)
        assert any_hub.claim_node("w1", "new", take_over=False)["session"] == "old"
    # Dead, but it sent a delta: unread at deltas/, or applied and deleted by the master.
    path = any_hub.upload_delta({"w": torch.ones(2)}, node_id="w1", local_step=4, base_outer_step=0)
    assert any_hub.claim_node("w1", "new", take_over=False)["session"] == "old"
    any_hub.publish_global({"w": torch.zeros(2)}, outer_step=0, consumed=[path])
    assert path not in any_hub.list_files()
    assert any_hub.claim_node("w1", "new", take_over=False)["session"] == "old"
    assert any_hub.node_session("w1") == "old"


def test_delta_steps_lists_waiting_and_consumed_deltas_of_one_node(any_hub):
    """A resumed node asks which of its steps the repository holds: at deltas/ or, once the
    master deleted them, in the manifest's ledger.
    """
    assert any_hub.delta_steps("w1") == set()
    ones = {"w": torch.ones(2)}
    any_hub.upload_delta(ones, node_id="w1", local_step=4, base_outer_step=0)
    consumed = any_hub.upload_delta(ones, node_id="w1", local_step=12, base_outer_step=0)
    any_hub.upload_delta(ones, node_id="w10", local_step=8, base_outer_step=0)
    assert any_hub.delta_steps("w1") == {4, 12}
    any_hub.publish_global({"w": torch.zeros(2)}, outer_step=0, consumed=[consumed])
    assert consumed not in any_hub.list_files()
    assert any_hub.delta_steps("w1") == {4, 12} and any_hub.delta_steps("w10") == {8}


def test_republishing_a_step_that_already_landed_is_a_no_op(hub, server):
    """A publish whose commit landed but whose call failed is retried next round with the same
    model.
    """
    hub.publish_global({"w": torch.ones(2)}, outer_step=3)
    commits = len(_commits(server))
    hub.publish_global({"w": torch.ones(2)}, outer_step=3)
    assert len(_commits(server)) == commits and hub.global_metadata().outer_step == 3
    with pytest.raises(
        HubError, match="second master"
    ):  # a different model at that step is another master's
        hub.publish_global({"w": torch.zeros(2)}, outer_step=3)


def test_publish_retries_each_read_on_its_own(server, tmp_path):
    """Retried as a whole, a publish (head, list, read, commit) under a failure on each request
    would need every request to succeed in one attempt; each one retrying alone, two attempts
    suffice."""
    transport = HfApiTransport("org/run", endpoint=server.url, cache_dir=tmp_path / "cache")
    client = HubClient(
        "org/run",
        transport=transport,
        retry_initial=0.01,
        retry_max=0.01,
        retry_attempts=2,
        sleeper=lambda s: None,
    )
    client.create_repo()
    client.publish_global({"w": torch.zeros(2)}, outer_step=0)
    for method, path in (
        ("GET", "/revision/main"),
        ("GET", "/tree/"),
        ("HEAD", "step_count.json"),
        ("POST", "/commit/"),
    ):
        server.faults.add("503", method=method, path=path)
    client.publish_global({"w": torch.ones(2)}, outer_step=1)
    assert client.global_metadata().outer_step == 1 and not server.faults.script


def test_reads_leave_no_files_behind_in_the_cache_folder(hub, tmp_path):
    """Each delta is read once and each global version is superseded: nothing may pile up on
    disk.
    """
    hub.publish_global({"w": torch.zeros(1000)}, outer_step=0)
    path = hub.upload_delta({"w": torch.ones(1000)}, node_id="n", local_step=1, base_outer_step=0)
    hub.read_bytes(path)
    hub.download_global_state()
    assert [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file()] == []


def test_transient_failures_back_off_then_succeed_or_give_up(server, tmp_path, token):
    sleeps = []
    client = HubClient(
        "org/run",
        transport=HfApiTransport("org/run", endpoint=server.url, token=token, cache_dir=tmp_path),
        retry_initial=0.5,
        retry_max=1.5,
        retry_attempts=4,
        sleeper=sleeps.append,
    )
    client.create_repo()
    server.faults.add("503", method="POST", path="/commit/", times=2)
    client.write_json("a.json", 1)
    assert client.read_json("a.json") == 1 and sleeps == [0.5, 1.0]
    sleeps.clear()
    server.faults.add("500", method="POST", path="/commit/", times=10)
    with pytest.raises(HubUnavailable, match="failed 4 times"):
        client.write_json("b.json", 2)
    assert sleeps == [0.5, 1.0, 1.5]


def test_a_429_on_a_delta_upload_and_a_503_on_its_download_back_off_with_a_warning(
    server, tmp_path, caplog
):
    sleeps = []
    client = HubClient(
        "org/run",
        transport=HfApiTransport("org/run", endpoint=server.url, cache_dir=tmp_path),
        retry_initial=0.5,
        sleeper=sleeps.append,
    )
    client.create_repo()
    server.faults.add("429", method="POST", path="/commit/")
    path = client.upload_delta({"w": torch.ones(3)}, node_id="n", local_step=1, base_outer_step=0)
    server.faults.add("503", method="GET", path="/resolve/")  # the file's bytes, not its HEAD
    assert torch.equal(from_safetensors_bytes(client.read_bytes(path))["w"], torch.ones(3))
    assert sleeps == [0.5, 0.5] and not server.faults.script
    assert caplog.text.count("(attempt 1/6), retrying in 0.50s") == 2


def test_an_outage_is_one_warning_and_one_when_the_hub_answers_again(hub, server, caplog):
    """A node logged every failed attempt and every request given up on (and huggingface_hub's
    own retries besides): about a hundred warnings from one worker in a 45-second outage.
    """
    server.faults.add("503", path="/revision/", times=20)  # three heads give up, a fourth lands
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with pytest.raises(HubUnavailable, match="head on org/run failed 6 times"):
                hub.head()
        assert hub.outage.active
        hub.write_json("a.json", 1)  # an upload that never failed does not end the outage
        assert hub.outage.active
        hub.head()  # two more failures, then the head that ends it
        assert "a.json" in hub.list_files()
    assert not hub.outage.active and not server.faults.script
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned
    assert warned[0].startswith("org/run is not answering (head failed (attempt 1/6)")
    assert warned[1].startswith("org/run answers again after")
    assert warned[1].endswith("(20 failed requests, retried)")
    # Every failed attempt is still there for whoever asks for DEBUG.
    assert sum("head failed (attempt" in r.getMessage() for r in caplog.records) == 17


def recorded_http_client(server, tmp_path, sleeps, *, retry_max):
    """A HubClient over HTTP to the loopback server, its repository created, recording its waits."""
    client = HubClient(
        "org/run",
        transport=HfApiTransport("org/run", endpoint=server.url, cache_dir=tmp_path),
        retry_initial=0.5,
        retry_max=retry_max,
        sleeper=sleeps.append,
    )
    client.create_repo()
    return client


@pytest.mark.parametrize("status", ["429", "503"])
def test_a_server_that_says_when_to_retry_is_waited_for_up_to_retry_max(server, tmp_path, status):
    sleeps = []
    client = recorded_http_client(server, tmp_path, sleeps, retry_max=30.0)
    for seconds in (7, 0, 3600):  # a rate-limit window, a plain retry, one longer than retry_max
        server.faults.add(status, method="POST", path="/commit/", retry_after=seconds)
    client.write_json("a.json", 1)
    assert client.read_json("a.json") == 1
    assert sleeps == [7.0, 1.0, 30.0]  # the server's wait, else the backoff; never past retry_max


@pytest.mark.parametrize("path", ["/tree/", "/preupload/", "/resolve/"])
def test_huggingface_hubs_own_retries_do_not_outwait_retry_max(server, tmp_path, path):
    """huggingface_hub retries a 429/5xx of a tree listing, a preupload or a file's metadata
    itself, waiting as long as Retry-After says, past retry_max, five times an attempt.
    """
    sleeps = []
    client = recorded_http_client(server, tmp_path, sleeps, retry_max=2.0)
    client.write_json("a.json", 1)
    server.faults.add("429", path=path, retry_after=5)
    server.faults.add("503", path=path)
    if path == "/preupload/":
        client.write_json("b.json", 2)
    else:
        assert "a.json" in client.list_files() and client.read_json("a.json") == 1
    # Both faults reached HubClient: huggingface_hub slept 6 s, then 1 s, and retried unseen.
    assert sleeps == [2.0, 1.0] and not server.faults.script


def test_huggingface_hubs_own_retries_of_a_dropped_connection_are_left_to_hubclient(
    server, tmp_path
):
    """huggingface_hub retried a connection error (refused, dropped) of a preupload itself, five
    times an attempt, sleeping up to 23 s past retry_max.
    """
    sleeps = []
    client = recorded_http_client(server, tmp_path, sleeps, retry_max=2.0)
    client.write_json("a.json", 1)
    server.faults.add("drop", method="POST", path="/preupload/")
    client.write_json("b.json", 2)
    # The drop reached HubClient, whose backoff retried it; huggingface_hub did not.
    assert sleeps == [0.5] and not server.faults.script


@pytest.mark.parametrize("operation", ["read", "commit"])
def test_a_refused_connection_costs_hubclients_backoff_not_huggingface_hubs(tmp_path, operation):
    # Two attempts with retry_initial 0.01 took 46.6 s: 23 s of huggingface_hub's retries each.
    port = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()  # nothing listens there: every connection is refused
    transport = HfApiTransport("org/run", endpoint=url, cache_dir=tmp_path)
    started = time.monotonic()
    with pytest.raises(TransportError) as error:
        if operation == "read":
            transport.read("a.json", "main")
        else:
            transport.commit({"a.json": b"1"}, [], message="m")
    # At most huggingface_hub's first 1 s wait before its retry is stopped.
    assert error.value.transient and time.monotonic() - started < 10


def test_a_node_without_a_token_is_refused_not_told_the_repository_is_missing(tmp_path):
    # The Hub hides a private repository from a request without a token: a 401 that
    # huggingface_hub raises as RepositoryNotFoundError. Taken for "not created yet", a worker
    # waited for a first global model that it could never read, then trained alone.
    with HubServer(tokens={"hf_write": "write"}) as server:
        HubClient(
            "org/run", transport=HfApiTransport("org/run", endpoint=server.url, token="hf_write")
        ).create_repo()
        anonymous = HubClient(
            "org/run",
            transport=HfApiTransport("org/run", endpoint=server.url, token=False),
            sleeper=lambda s: pytest.fail("a refusal is not retried"),
        )
        with pytest.raises(HubRefused, match="global_metadata on org/run was refused.*HF_TOKEN"):
            anonymous.global_metadata()
        with pytest.raises(HubRefused, match="upload a.json on org/run was refused"):
            anonymous.write_json("a.json", 1)


def test_permanent_errors_are_not_retried(server, tmp_path):
    sleeps = []
    client = HubClient(
        "org/absent",
        transport=HfApiTransport("org/absent", endpoint=server.url, cache_dir=tmp_path),
        sleeper=sleeps.append,
    )
    with pytest.raises(HubError, match="org/absent"):
        client.write_json("a.json", 1)  # 404 RepoNotFound: retrying cannot help
    assert sleeps == []


@pytest.mark.parametrize("repo_id", ["org/run/extra", "my org/run"])
def test_a_repo_id_the_hub_cannot_hold_fails_at_once(server, tmp_path, repo_id):
    sleeps = []
    client = HubClient(
        repo_id,
        transport=HfApiTransport(repo_id, endpoint=server.url, cache_dir=tmp_path),
        sleeper=sleeps.append,
    )
    with pytest.raises(HubError, match="HFValidationError: Repo id") as error:
        client.create_repo()  # huggingface_hub refuses it before any request: no outage
    assert sleeps == [] and not isinstance(error.value, HubUnavailable)


@pytest.mark.parametrize("path", ["../escape", "/abs", "a//b", "a/./b", ""])
def test_unsafe_repository_paths_are_rejected(any_hub, path):
    with pytest.raises(ValueError, match="repository path"):
        any_hub.upload_bytes(b"x", path)


def test_sha_mismatch_is_refused(any_hub, tmp_path):
    meta = any_hub.publish_global({"w": torch.zeros(2)}, outer_step=0)
    forged = GlobalMetadata(**{**meta.__dict__, "sha256": "0" * 64})
    with pytest.raises(HubError, match="sha256"):
        any_hub.download_global_state(forged)
    with pytest.raises(HubError, match="sha256"):  # nor written to disk
        any_hub.download_global(tmp_path / "global.safetensors", forged)
    assert not (tmp_path / "global.safetensors").exists()


def test_malformed_metadata_is_a_clear_error(any_hub):
    any_hub.write_json(GLOBAL_METADATA, {"updated_at": "x"})
    with pytest.raises(HubError, match="malformed"):
        any_hub.global_metadata()


def test_token_never_logged_or_shown(server, tmp_path, caplog, token):
    caplog.set_level(logging.DEBUG)
    client = HubClient(
        "org/run",
        transport=HfApiTransport("org/run", endpoint=server.url, token=token, cache_dir=tmp_path),
        retry_initial=0.01,
        retry_max=0.01,
        retry_attempts=2,
        sleeper=lambda s: None,
    )
    client.create_repo()
    server.faults.add("503", method="POST", path="/commit/", times=5)
    with pytest.raises(HubUnavailable) as info:
        client.write_json("a.json", 1)
    assert token not in caplog.text and token not in str(info.value)
    assert token not in repr(client) and token not in repr(client.transport)


def test_add_collaborator_warns_instead_of_pretending(any_hub):
    with pytest.warns(UserWarning, match="organisation"):
        assert any_hub.add_collaborator("alice") is False


def test_build_hub_client_from_a_config_section(tmp_path, server, token):
    fs = build_hub_client(
        SimpleNamespace(
            transport="filesystem", endpoint=str(tmp_path), repo_id="org/run", retry_attempts=2
        )
    )
    fs.create_repo()
    assert (tmp_path / "org" / "run" / "refs").is_dir() and fs.retry_attempts == 2
    hub = build_hub_client(
        SimpleNamespace(
            repo_id="org/run", endpoint=server.url, token=token, cache_dir=str(tmp_path / "c")
        )
    )
    hub.create_repo()
    assert hub.list_files() == [".gitattributes"]
    with pytest.raises(ValueError, match="distributed.repo_id"):
        build_hub_client(SimpleNamespace(repo_id=None))
    with pytest.raises(ValueError, match="distributed.endpoint"):
        build_hub_client(SimpleNamespace(repo_id="a/b", transport="filesystem"))
    with pytest.raises(ValueError, match="distributed.transport"):
        build_hub_client(SimpleNamespace(repo_id="a/b", transport="s3"))
    with pytest.raises(ValueError, match="retry"):
        HubClient("a/b", transport=fs.transport, retry_initial=2.0, retry_max=1.0)


@pytest.mark.parametrize(
    "repo_id",
    ["run", "org/run", "a/b", "Org_1/run-2.x", "o" * 96 + "/" + "r" * 96, "org/name/extra",
     "org/my--run", "org/a..b", "org/run.git", "-org/run", "org/run-", ".org/run", "org/_run_",
     "org/" + "r" * 97, "org//run", "/run", "org/ru n", "org/rün"],
)  # fmt: skip
def test_config_accepts_exactly_the_hub_repo_ids_huggingface_hub_does(repo_id):
    # speedtronic-config cannot import huggingface_hub: its own check must agree with it.
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from speedtronic_config import ConfigError, DistributedConfig

    try:
        validate_repo_id(repo_id)
        hub_accepts = True
    except HFValidationError:
        hub_accepts = False
    if hub_accepts and not repo_id.isascii():
        pytest.skip("this huggingface_hub's local check lets non-ASCII through; the Hub does not")
    try:
        DistributedConfig(repo_id=repo_id, transport="hub")
        config_accepts = True
    except ConfigError:
        config_accepts = False
    assert config_accepts == hub_accepts
