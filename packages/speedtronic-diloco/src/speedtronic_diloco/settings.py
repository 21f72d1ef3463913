"""The distributed settings the coordinator reads, from any config object (duck-typed, with
defaults).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic_diloco.outer import DEFAULT_STALENESS_LIMIT
from speedtronic_diloco.tensors import check_node_id

OVERFLOW_POLICIES = ("skip", "block")
# Inner rounds a node trains on one global version before it waits for a newer one: four rounds of
# the default 500 steps is the longest drift the DiLoCo paper shows converging (H = 2000).
DEFAULT_MAX_LOCAL_ROUNDS = 4


@dataclass(frozen=True)
class DistributedSettings:
    """Everything DumbDiLoCoCoordinator needs; defaults are the 2.0 defaults (spec/03, spec/05)."""

    role: str = "master"
    node_id: str = "master"
    inner_steps: int = 500
    poll_interval: float = 60.0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    reset_inner_optimizer: bool = True
    async_delta_upload: bool = True
    async_global_poll: bool = True
    delta_upload_queue_size: int = 1
    delta_upload_overflow: str = "skip"
    delta_upload_shutdown_timeout: float = 5.0
    staleness_limit: int | None = DEFAULT_STALENESS_LIMIT
    max_local_rounds: int | None = DEFAULT_MAX_LOCAL_ROUNDS
    global_wait_timeout: float = 300.0
    state_dir: Path = Path("runs/.speedtronic/diloco/master")
    collaborators: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in {"master", "worker"}:
            raise ValueError(
                f"distributed.role={self.role!r} is not supported here: use 'master' or 'worker'"
            )
        if self.inner_steps < 1:
            raise ValueError(f"distributed.inner_steps must be >= 1, got {self.inner_steps}")
        if self.max_local_rounds is not None and self.max_local_rounds < 1:
            raise ValueError(
                f"distributed.max_local_rounds must be >= 1 or null, got {self.max_local_rounds}"
            )
        if self.delta_upload_queue_size < 1:
            raise ValueError(
                "distributed.delta_upload_queue_size must be >= 1, got "
                f"{self.delta_upload_queue_size}"
            )
        if self.delta_upload_overflow not in OVERFLOW_POLICIES:
            raise ValueError(
                f"distributed.delta_upload_overflow={self.delta_upload_overflow!r}: "
                f"use one of {OVERFLOW_POLICIES}"
            )
        if (
            not self.poll_interval > 0
            or self.delta_upload_shutdown_timeout < 0
            or self.global_wait_timeout < 0
        ):
            raise ValueError(
                "distributed.poll_interval must be > 0 and the timeouts >= 0, got "
                f"{self.poll_interval}, {self.delta_upload_shutdown_timeout}, "
                f"{self.global_wait_timeout}"
            )
        check_node_id(self.node_id)

    @classmethod
    def from_config(
        cls, config: Any, *, state_dir: str | Path | None = None
    ) -> DistributedSettings:
        """Return settings from a full config (with .distributed and .run) or a bare distributed
        section.
        """
        section = getattr(config, "distributed", config)
        run = getattr(config, "run", None)
        role = getattr(section, "role", "master") or "master"
        role = "master" if role == "single" else role  # 2.0: enabled + single means master
        node_id = getattr(section, "node_id", None) or _default_node_id(role)
        check_node_id(node_id)
        if state_dir is None:
            root = Path(
                getattr(section, "state_dir", ".speedtronic/diloco") or ".speedtronic/diloco"
            )
            if not root.is_absolute():
                root = Path(getattr(run, "output_dir", "runs") or "runs") / root
            state_dir = root / node_id
        limit = getattr(section, "staleness_limit", DEFAULT_STALENESS_LIMIT)
        rounds = getattr(section, "max_local_rounds", DEFAULT_MAX_LOCAL_ROUNDS)
        return cls(
            role=role,
            node_id=node_id,
            inner_steps=int(getattr(section, "inner_steps", 500)),
            poll_interval=float(getattr(section, "poll_interval", 60.0)),
            outer_lr=float(getattr(section, "outer_lr", 0.7)),
            outer_momentum=float(getattr(section, "outer_momentum", 0.9)),
            reset_inner_optimizer=bool(getattr(section, "reset_inner_optimizer", True)),
            async_delta_upload=bool(getattr(section, "async_delta_upload", True)),
            async_global_poll=bool(getattr(section, "async_global_poll", True)),
            delta_upload_queue_size=int(getattr(section, "delta_upload_queue_size", 1)),
            delta_upload_overflow=str(getattr(section, "delta_upload_overflow", "skip")),
            delta_upload_shutdown_timeout=float(
                getattr(section, "delta_upload_shutdown_timeout", 5.0)
            ),
            staleness_limit=None if limit is None else int(limit),
            max_local_rounds=None if rounds is None else int(rounds),
            global_wait_timeout=float(getattr(section, "global_wait_timeout", 300.0)),
            state_dir=Path(state_dir),
            collaborators=tuple(getattr(section, "collaborators", ()) or ()),
        )


def _default_node_id(role: str) -> str:
    """Return role-hostname, made path-safe (set distributed.node_id when one host runs several
    nodes).
    """
    if role == "master":
        return "master"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"worker-{socket.gethostname()}")


__all__ = ["DEFAULT_MAX_LOCAL_ROUNDS", "OVERFLOW_POLICIES", "DistributedSettings"]
