"""The shared-folder transport (commits, compare-and-swap, races) and HTTP error classification."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from speedtronic_diloco.transport import (
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
    with pytest.raises(NotFound, match="create_repo"):
        FilesystemTransport(tmp_path / "absent").head()


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
    with pytest.raises(TransportError, match="corrupt"):
        repo.read("a", rev)


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
