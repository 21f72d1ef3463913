"""The shared-folder transport (commits, compare-and-swap, races) and HTTP error classification."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from types import SimpleNamespace

import pytest

from speedtronic_diloco.transport import (
    Corrupt,
    FilesystemTransport,
    NotFound,
    Refused,
    StaleParent,
    TransportError,
    _classify_http,
)


@pytest.fixture
def repo(tmp_path):
    transport = FilesystemTransport(tmp_path / "repo")
    transport.create_repo(private=True)
    return transport


def test_commits_are_versioned_and_pinned_reads_stay_valid(repo):
    first = repo.commit({"a.txt": b"1", "b/c.bin": b"2"}, [], message="one")
    second = repo.commit({"a.txt": b"3"}, ["b/c.bin"], message="two")
    assert repo.head() == second != first
    assert repo.list_files(first) == ["a.txt", "b/c.bin"] and repo.list_files(second) == ["a.txt"]
    assert repo.read("a.txt", first) == b"1" and repo.read("a.txt", second) == b"3"
    assert repo.list_files("main") == ["a.txt"]
    with pytest.raises(NotFound):
        repo.read("b/c.bin", second)
    with pytest.raises(NotFound):
        repo.list_files("f" * 40)


def test_create_repo_is_idempotent_and_required(repo, tmp_path):
    head = repo.head()
    repo.create_repo(private=True)
    assert repo.head() == head
    # A node's log said `run create_repo first`: no command a CLI user has, and where the shared
    # folder is not mounted, not the fix. The master runs it at start.
    absent = (
        r"^no repository at .*absent: the master creates it when it starts \(create_repo\); "
        r"start it, or check distributed.endpoint and repo_id \(and that the shared folder is "
        r"mounted\)$"
    )
    with pytest.raises(NotFound, match=absent):
        FilesystemTransport(tmp_path / "absent").head()
    for sub in ("objects", "commits", "refs"):  # a create_repo cut short before its first commit
        (tmp_path / "half" / sub).mkdir(parents=True)
    with pytest.raises(NotFound, match=r"has no commits .*: the master completes it when it"):
        FilesystemTransport(tmp_path / "half").head()


def test_parent_compare_and_swap(repo):
    head = repo.head()
    repo.commit({"x": b"1"}, [], message="m", parent=head)
    with pytest.raises(StaleParent):
        repo.commit({"y": b"1"}, [], message="m", parent=head)
    assert "y" not in repo.list_files(repo.head())


def test_concurrent_writers_never_lose_a_commit(repo):
    barrier = threading.Barrier(8)

    def writer(index):
        barrier.wait()
        for round_index in range(5):
            repo.commit({f"deltas/n{index}/{round_index}": bytes([index])}, [], message="w")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(repo.list_files(repo.head())) == 40
    assert len(list((repo.root / "refs").iterdir())) == 41  # initial commit + one ref per commit
    assert not list((repo.root / "refs").glob(".*"))  # no temporary files left behind


def test_corrupt_object_is_detected(repo):
    rev = repo.commit({"a": b"payload"}, [], message="m")
    for obj in (repo.root / "objects").iterdir():
        obj.write_bytes(b"tampered")
    with pytest.raises(Corrupt, match="corrupt") as caught:
        repo.read("a", rev)
    assert not caught.value.transient  # the same bytes read again cannot help


@pytest.mark.parametrize(
    "status,kind,transient",
    [
        (412, StaleParent, False),
        (404, NotFound, False),
        (429, TransportError, True),
        (503, TransportError, True),
        (500, TransportError, True),
        (400, TransportError, False),
        (401, Refused, False),
        (403, Refused, False),
    ],
)
def test_http_errors_are_classified(status, kind, transient):
    error = _classify_http(type("HfHubHTTPError", (Exception,), {})("boom"))
    assert error.transient  # no response at all: connection trouble, retry
    exc = Exception("boom")
    exc.response = SimpleNamespace(status_code=status)
    error = _classify_http(exc)
    assert type(error) is kind and error.transient is transient


@pytest.mark.parametrize(
    ("status", "headers", "wait"),
    [
        (429, {"RateLimit": '"api";r=0;t=42', "Retry-After": "5"}, 42.0),
        (429, {"Retry-After": "5"}, 5.0),
        (503, {"RateLimit": '"api";r=99;t=42', "Retry-After": "5"}, 5.0),  # not rate limited
        (503, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, None),  # a date: use the backoff
        (503, {"Retry-After": "\xb2"}, None),  # garbled ("²" is a digit to str.isdigit)
        (429, {"RateLimit": '"api";r=0;t=\u0663'}, None),  # not ASCII digits
        (503, {}, None),
        (403, {"Retry-After": "5"}, None),  # not transient: no retry to wait for
    ],
)
def test_the_wait_a_response_asks_for_is_read(status, headers, wait):
    exc = Exception("boom")
    exc.response = SimpleNamespace(status_code=status, headers=headers)
    assert getattr(_classify_http(exc), "retry_after", None) == wait


def test_a_hub_that_never_answers_times_out_as_a_transient_error():
    import socket

    from huggingface_hub.utils import _http

    from speedtronic_diloco.transport import HfApiTransport, TransportError, bound_hub_http_timeouts

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(
        target=lambda: accepted.append(listener.accept()), daemon=True
    ).start()  # accept, never answer
    previous = _http._GLOBAL_CLIENT_FACTORY
    try:
        _http.set_client_factory(_http.default_client_factory)  # as a fresh process starts
        assert bound_hub_http_timeouts(0.5)
        assert not bound_hub_http_timeouts(
            0.5
        )  # once per process; a user's own factory is left alone
        transport = HfApiTransport(
            "org/run", endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}"
        )
        with pytest.raises(TransportError) as error:
            transport.head()
        assert error.value.transient and accepted
    finally:
        _http.set_client_factory(previous)
        listener.close()


def _age(*paths, seconds: float = 120.0) -> None:
    """Date files back as if written `seconds` ago."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def _object(repo, data: bytes):
    return repo.root / "objects" / hashlib.sha256(data).hexdigest()


def _ref(repo, revision: str):
    return next(r for r in (repo.root / "refs").iterdir() if r.read_text().strip() == revision)


@pytest.fixture
def pruned_repo(tmp_path):
    transport = FilesystemTransport(tmp_path / "repo", prune_after=60.0)
    transport.create_repo(private=True)
    return transport


def test_prune_deletes_old_versions_that_nothing_recent_or_current_uses(pruned_repo):
    repo = pruned_repo
    old = repo.commit({"global/model": b"v1", "deltas/a": b"delta a"}, [], message="old")
    recent = repo.commit({"global/model": b"v2"}, ["deltas/a"], message="recent")
    head = repo.commit({"global/model": b"v3", "deltas/b": b"delta b"}, [], message="head")
    _age(*(repo.root / "objects").iterdir(), *(repo.root / "refs").iterdir(), seconds=600.0)
    _age(_ref(repo, recent), seconds=300.0)  # `old` stopped being the head 300 s ago
    _age(_ref(repo, head), seconds=30.0)  # `recent` was the head until 30 s ago: a reader may
    # still read it (prune_after is 60 s)
    (repo.root / "objects" / ("f" * 64)).write_bytes(b"being written")  # no commit yet: kept
    assert repo.prune() == (2, len(b"v1") + len(b"delta a"))
    assert not _object(repo, b"v1").exists() and not _object(repo, b"delta a").exists()
    assert repo.read("global/model", recent) == b"v2"
    assert (
        repo.read("deltas/b", head) == b"delta b" and (repo.root / "objects" / ("f" * 64)).exists()
    )
    with pytest.raises(TransportError, match="pruned .*; read it at a newer revision") as error:
        repo.read("global/model", old)
    assert not error.value.transient  # it never comes back at this revision
    assert repo.prune() == (0, 0)  # nothing more to delete; the history stays listable
    assert repo.list_files(old) == ["deltas/a", "global/model"]
    _age(_ref(repo, head), seconds=1e4)  # long the head: what it uses stays, `recent` goes
    assert repo.prune() == (1, len(b"v2")) and repo.read("global/model", head) == b"v3"


def test_a_reader_of_a_pruned_revision_fails_at_once_and_reads_the_newer_one(pruned_repo):
    import torch

    from speedtronic_diloco.hub import HubClient, HubError, HubUnavailable

    sleeps = []
    client = HubClient("org/run", transport=pruned_repo, sleeper=sleeps.append)
    client.publish_global({"w": torch.zeros(3)}, outer_step=0)
    seen = client.global_metadata()  # a worker's poll, which then stalls for a long time
    client.publish_global({"w": torch.ones(3)}, outer_step=1)
    _age(
        *(pruned_repo.root / "objects").iterdir(),
        *(pruned_repo.root / "refs").iterdir(),
        seconds=600.0,
    )
    assert pruned_repo.prune()[0] == 3  # step 0's model, metadata and manifest
    with pytest.raises(HubError, match="was pruned") as error:
        client.download_global_state(seen)
    assert sleeps == [] and not isinstance(error.value, HubUnavailable)  # no retry at `seen`
    assert torch.equal(client.download_global_state(client.global_metadata())["w"], torch.ones(3))
    # An object the head uses and a reader misses is out of sight for a moment: retried.
    _object(pruned_repo, client.read_bytes("global/model.safetensors")).rename(
        pruned_repo.root / "aside"
    )
    with pytest.raises(HubUnavailable, match="is missing from"):
        client.download_global_state()
    assert len(sleeps) == client.retry_attempts - 1


def test_without_prune_after_every_version_stays(repo):
    repo.commit({"global/model": b"v1"}, [], message="one")
    repo.commit({"global/model": b"v2"}, [], message="two")
    _age(*(repo.root / "objects").iterdir(), *(repo.root / "refs").iterdir(), seconds=1e6)
    assert repo.prune() == (0, 0) and _object(repo, b"v1").exists()


@pytest.mark.parametrize("prune_at", ["after the refresh", "between the refresh and the link"])
def test_a_commit_reusing_an_old_object_keeps_it_through_a_concurrent_prune(
    pruned_repo, monkeypatch, prune_at
):
    repo = pruned_repo
    repo.commit({"global/model": b"same"}, [], message="first")
    repo.commit({"global/model": b"other"}, [], message="second")
    _age(*(repo.root / "objects").iterdir(), *(repo.root / "refs").iterdir())
    link = repo._link_ref

    def prune_then_link(sequence, oid):
        if prune_at == "after the refresh":  # the reused object's time is new: prune keeps it
            assert repo.prune() == (0, 0) and _object(repo, b"same").exists()
        else:  # a prune that read the object's time before the commit refreshed it
            _object(repo, b"same").unlink()
        return link(sequence, oid)

    monkeypatch.setattr(repo, "_link_ref", prune_then_link)
    third = repo.commit({"global/model": b"same"}, [], message="third, reusing first's object")
    assert repo.read("global/model", third) == b"same"


def test_prune_puts_back_what_an_interrupted_prune_set_aside(pruned_repo):
    repo = pruned_repo
    head = repo.commit({"global/model": b"kept"}, [], message="head")
    repo.commit({"x": b"1"}, [], message="unrelated")
    used, unused = _object(repo, b"kept"), repo.root / "objects" / ("e" * 64 + ".pruning")
    used.rename(used.with_name(used.name + ".pruning"))  # set aside, then the pruner died
    unused.write_bytes(b"old and unused")
    _age(unused)
    assert repo.prune() == (1, len(b"old and unused"))
    assert repo.read("global/model", head) == b"kept" and not unused.exists()


def test_an_object_refreshed_while_prune_sets_it_aside_goes_back(pruned_repo, monkeypatch):
    repo = pruned_repo
    repo.commit({"global/model": b"reused"}, [], message="one")
    repo.commit({"global/model": b"head"}, [], message="two")
    _age(*(repo.root / "objects").iterdir(), *(repo.root / "refs").iterdir())
    move = os.replace

    def refreshed_first(source, target):  # a commit reusing it refreshes it just before the move
        if str(source).endswith(hashlib.sha256(b"reused").hexdigest()):
            os.utime(source)
        move(source, target)

    monkeypatch.setattr("speedtronic_diloco.transport.os.replace", refreshed_first)
    assert repo.prune() == (0, 0)
    assert _object(repo, b"reused").read_bytes() == b"reused"
    assert not list((repo.root / "objects").glob("*.pruning"))


def test_prune_deletes_what_a_dead_writer_left_half_written(pruned_repo):
    repo = pruned_repo
    repo.commit({"global/model": b"v1"}, [], message="one")
    dead, live = (repo.root / "objects" / f".{c * 64}.0a1b2c.tmp" for c in "ab")
    dead.write_bytes(b"half a model")
    live.write_bytes(b"being written")
    _age(dead)
    assert repo.prune() == (1, len(b"half a model"))
    assert not dead.exists() and live.exists() and repo.read("global/model", repo.head()) == b"v1"


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_shared_folder_that_refuses_writes_is_refused_with_its_fix(repo, monkeypatch, code):
    """A read-only mount refuses every later write too: retried, a node would keep a delta per
    boundary for ever. It stops the node like a refused token, naming the folder's fix.
    """
    from speedtronic_diloco.hub import HubClient, HubRefused

    def failing(number):
        def write(*args, **kwargs):
            raise OSError(number, os.strerror(number))

        return write

    monkeypatch.setattr(repo, "_write_objects", failing(code))
    with pytest.raises(Refused, match="refuses this process's writes"):
        repo.commit({"a.txt": b"1"}, [], message="one")
    hub = HubClient("org/run", transport=repo, sleeper=lambda seconds: pytest.fail("retried"))
    with pytest.raises(
        HubRefused, match=r"was refused \(the shared folder .*: mount .* read-write"
    ):
        hub.upload_bytes(b"1", "nodes/w1.json")
    monkeypatch.setattr(repo, "_write_objects", failing(errno.EIO))
    with pytest.raises(OSError) as other:  # any other error is not a refusal: raised as it is
        repo.commit({"a.txt": b"1"}, [], message="one")
    assert other.value.errno == errno.EIO and not isinstance(other.value, Refused)
