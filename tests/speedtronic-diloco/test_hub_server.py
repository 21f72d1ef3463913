"""The loopback server, driven by the real huggingface_hub client."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

from speedtronic_diloco.testing.hub_server import FaultPlan


@pytest.fixture
def api(server):
    client = HfApi(endpoint=server.url, token="hf_x")
    client.create_repo("org/r", exist_ok=True)
    return client


def _add(api, path, data=b"1", **kwargs):
    return api.create_commit(
        "org/r", operations=[CommitOperationAdd(path, data)], commit_message="m", **kwargs
    )


def test_create_commit_list_download_delete(api, server, tmp_path):
    assert api.create_repo("org/r", exist_ok=True).endswith("/org/r")  # 409 still carries "url"
    first = _add(api, "dir/a.bin", b"\x00\x01\x02")
    assert len(first.oid) == 40 and api.repo_info("org/r").sha == first.oid
    assert api.list_repo_files("org/r") == [".gitattributes", "dir/a.bin"]
    assert api.file_exists("org/r", "dir/a.bin") and not api.file_exists("org/r", "dir/b.bin")
    second = api.create_commit(
        "org/r", operations=[CommitOperationDelete("dir/a.bin")], commit_message="rm"
    )
    assert "dir/a.bin" not in api.list_repo_files("org/r")
    # The old revision still serves the deleted file: readers pin revisions.
    path = api.hf_hub_download("org/r", "dir/a.bin", revision=first.oid, cache_dir=tmp_path)
    assert open(path, "rb").read() == b"\x00\x01\x02"
    assert api.repo_info("org/r", revision=second.oid).sha == second.oid
    log = json.loads(urllib.request.urlopen(server.url + "/_test/log").read())
    assert [e["added"] for e in log] == [["dir/a.bin"], []]
    assert log[0]["bytes"] > len(b"\x00\x01\x02") and all(
        e["bytes"] > 0 for e in log
    )  # request sizes


def test_missing_repo_revision_and_entry_map_to_client_errors(api, tmp_path):
    from huggingface_hub.errors import (
        EntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("org/absent")
    with pytest.raises(RevisionNotFoundError):
        api.hf_hub_download("org/r", ".gitattributes", revision="f" * 40, cache_dir=tmp_path)
    with pytest.raises(EntryNotFoundError):
        api.hf_hub_download("org/r", "nope.bin", cache_dir=tmp_path)


def test_parent_commit_compare_and_swap(api):
    head = _add(api, "a").oid
    _add(api, "b", parent_commit=head)
    with pytest.raises(Exception) as info:
        _add(api, "c", parent_commit=head)
    assert info.value.response.status_code == 412
    assert "c" not in api.list_repo_files("org/r")


def test_injected_faults_reach_the_client(api, server):
    server.faults.add("503", method="POST", path="/commit/")
    with pytest.raises(Exception) as info:
        _add(api, "x")
    assert info.value.response.status_code == 503 and "x" not in api.list_repo_files("org/r")
    server.faults.add("drop", method="POST", path="/commit/")
    # A dropped connection surfaces as whatever the HTTP library raises; only failure matters here.
    with pytest.raises(Exception):  # noqa: B017
        _add(api, "dropped")
    assert "dropped" not in api.list_repo_files("org/r")  # dropped: never applied
    server.faults.add("lost", method="POST", path="/commit/")
    with pytest.raises(Exception):  # noqa: B017
        _add(api, "lost")
    assert "lost" in api.list_repo_files("org/r")  # lost response: applied all the same
    head = api.repo_info("org/r").sha
    server.faults.add("stale", method="POST", path="/commit/")
    with pytest.raises(Exception) as info:
        _add(api, "s", parent_commit=head)
    assert info.value.response.status_code == 412
    server.faults.add("429", method="GET", path="/api/models/org/r")
    with pytest.raises(Exception) as info:
        api.repo_info("org/r")
    assert info.value.response.status_code == 429
    assert server.faults.injected == {"503": 1, "drop": 1, "lost": 1, "stale": 1, "429": 1}


def test_random_fault_plan_is_seeded_and_validated():
    def sequence(seed):
        plan = FaultPlan(0.5, seed=seed)
        return [plan.pick("POST", "/x", mutating=True) for _ in range(40)]

    assert sequence(3) == sequence(3) != sequence(4)
    assert 5 < sum(pick is None for pick in sequence(3)) < 35
    plan = FaultPlan(1.0, seed=1)
    assert {plan.pick("GET", "/x", mutating=False) for _ in range(50)} <= {
        "500",
        "503",
        "429",
        "drop",
    }
    with pytest.raises(ValueError, match="unknown"):
        FaultPlan(0.1, kinds=("teapot",))
    with pytest.raises(ValueError, match="rate"):
        FaultPlan(1.5)


def test_fault_hook_configures_a_running_server(server):
    request = urllib.request.Request(
        server.url + "/_test/faults",
        data=json.dumps({"rate": 1.0, "kinds": ["503"]}).encode(),
        method="POST",
    )
    assert json.loads(urllib.request.urlopen(request).read()) == {"ok": True}
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.url + "/api/whoami-v2")
    assert info.value.code == 503
    bad = urllib.request.Request(server.url + "/_test/faults", data=b'{"rate": 2}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad)
    assert info.value.code == 400


def test_command_line_entry_point_serves(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "speedtronic_diloco.testing.hub_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("hub server listening on http://127.0.0.1:")
        url = line.split()[-1]
        api = HfApi(endpoint=url, token="hf_x")
        api.create_repo("org/cli")
        assert api.list_repo_files("org/cli") == [".gitattributes"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_readme_metadata_is_validated_before_upload(api, server):
    card = b"---\nlibrary_name: transformers\n---\n# model\n"
    _add(api, "README.md", card)
    assert server.files("org/r")["README.md"] == card
    with pytest.raises(ValueError, match="Invalid metadata in README.md"):
        _add(api, "README.md", b"---\nlibrary_name: transformers\n")
