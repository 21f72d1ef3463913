"""Who a DiLoCo node is: its role, its node id and where it keeps its local state."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic_config import resolve_section


@dataclass(frozen=True)
class NodeIdentity:
    """The resolved role (single means master), node id and state folder of one node."""

    role: str
    node_id: str
    state_dir: Path


def resolve_identity(config: Any, state_dir: str | Path | None = None) -> NodeIdentity:
    """Return the node identity of a whole config or a bare distributed section.

    A relative distributed.state_dir sits under run.output_dir, then the node id; an explicit
    `state_dir` argument is used as it is.
    """
    section = resolve_section(config, "distributed")
    role = "master" if section.role == "single" else section.role  # 2.0: single means master
    node_id = section.node_id or _default_node_id(role)
    if state_dir is None:
        root = Path(section.state_dir)
        if not root.is_absolute():
            root = Path(resolve_section(config, "run").output_dir) / root
        state_dir = root / node_id
    return NodeIdentity(role, node_id, Path(state_dir))


def _default_node_id(role: str) -> str:
    """Return role-hostname, made path-safe (set distributed.node_id when one host runs several
    nodes).
    """
    if role == "master":
        return "master"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"worker-{socket.gethostname()}")


__all__ = ["NodeIdentity", "resolve_identity"]
