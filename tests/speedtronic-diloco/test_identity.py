from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from speedtronic_diloco.identity import resolve_identity


def test_state_dir_sits_under_output_dir_then_node_id():
    config = SimpleNamespace(
        run=SimpleNamespace(output_dir="out"),
        distributed=SimpleNamespace(role="worker", node_id="gpu-7", state_dir="st"),
    )
    identity = resolve_identity(config)
    assert identity.state_dir == Path("out/st/gpu-7") and identity.role == "worker"
    absolute = resolve_identity(SimpleNamespace(state_dir="/abs", node_id="n"))
    assert absolute.state_dir == Path("/abs/n")
    assert resolve_identity(SimpleNamespace(), state_dir="here").state_dir == Path("here")


def test_single_role_means_master():
    identity = resolve_identity(SimpleNamespace(role="single"))
    assert (identity.role, identity.node_id) == ("master", "master")


def test_default_worker_node_id_is_path_safe():
    node_id = resolve_identity(SimpleNamespace(role="worker")).node_id
    assert node_id.startswith("worker-") and "/" not in node_id
