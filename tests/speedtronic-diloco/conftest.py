from __future__ import annotations

import subprocess

import pytest

from speedtronic_diloco.hub import HubClient
from speedtronic_diloco.testing.hub_server import HubServer
from speedtronic_diloco.transport import HfApiTransport

TOKEN = "hf_test_SECRET_token_value"


@pytest.fixture
def token():
    """A fake Hub token that must never appear in logs, reprs or errors."""
    return TOKEN


@pytest.fixture
def dead_pid():
    """The pid of a process of this host that has ended (reaped, so no longer signalable)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def server():
    with HubServer() as running:
        yield running


@pytest.fixture
def hub(server, tmp_path):
    """A HubClient driving the real huggingface_hub HfApi against the loopback server."""
    transport = HfApiTransport(
        "org/run", token=TOKEN, endpoint=server.url, cache_dir=tmp_path / "hf-cache"
    )
    client = HubClient(
        "org/run", transport=transport, retry_initial=0.01, retry_max=0.02, sleeper=lambda s: None
    )
    client.create_repo()
    return client
