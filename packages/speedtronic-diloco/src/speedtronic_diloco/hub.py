"""HubClient: the DumbDiLoCo synchronization bus over a Transport, with retries and idempotent
commits.

Repository layout: global/model.safetensors, global/step_count.json and global/manifest.json are
always written in one commit; deltas/<node>/step-<n>-base-<b>.safetensors are one commit each;
nodes/<node>.json names the process that last claimed a node id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import torch

from speedtronic_config import ConfigError, resolve_section
from speedtronic_config.atomic import atomic_write_bytes
from speedtronic_diloco.outage import OutageLog
from speedtronic_diloco.tensors import (
    DeltaRef,
    delta_path,
    from_safetensors_bytes,
    parse_delta_ref,
    to_safetensors_bytes,
)
from speedtronic_diloco.transport import (
    Corrupt,
    FilesystemTransport,
    HfApiTransport,
    NotFound,
    Refused,
    StaleParent,
    Transport,
    TransportError,
)

LOGGER = logging.getLogger("speedtronic_diloco.hub")
GLOBAL_MODEL = "global/model.safetensors"
GLOBAL_METADATA = "global/step_count.json"
GLOBAL_MANIFEST = "global/manifest.json"
# The Hub rejects very large commits; consumed deltas beyond this are deleted by later rounds.
MAX_DELETIONS_PER_COMMIT = 50
# Workers commit deltas to the same branch, so the head can move faster than a publish attempt
# takes; after this many stale parents the publish commits without compare-and-swap, right after
# checking that global/ is still the master's own previous step (only a second master could race
# it).
CAS_ATTEMPTS = 4
# A claim has no unsafe fallback (committed without compare-and-swap it could overwrite another
# process's), so it tries longer; it is made once per process.
CLAIM_ATTEMPTS = 20
COLLABORATOR_WARNING = (
    "huggingface_hub has no API to grant a user write access to a repository, so "
    "distributed.collaborators cannot be applied. Create the repository under an organisation the "
    "workers belong to, and give each worker a fine-grained token with write access to that "
    "repository."
)


class HubError(RuntimeError):
    """A Hub operation failed permanently (bad request, conflict, corrupt data)."""


class HubRefused(HubError):
    """The Hub refused this node's token (wrong, expired or read-only): no retry can help."""


class HubCorrupt(HubError):
    """A stored file is damaged (its bytes no longer match their digest): no retry can help."""


class HubUnavailable(HubError):
    """A Hub operation kept failing transiently until the retry budget ran out."""


def failure_level(exc: BaseException) -> int:
    """Return the level to log a failed network step at: INFO for HubUnavailable, whose outage
    its HubClient announced in one warning (OutageLog), else WARNING.
    """
    return logging.INFO if isinstance(exc, HubUnavailable) else logging.WARNING


@dataclass(frozen=True)
class GlobalMetadata:
    """The published global/step_count.json, plus the revision it was read at."""

    outer_step: int
    updated_at: str
    model_file: str = GLOBAL_MODEL
    sha256: str | None = None
    publish_id: str | None = None
    revision: str | None = None
    # The tokenizer the master's data was tokenized with (its recorded identity), when known.
    tokenizer: Mapping[str, Any] | None = None
    # The master's outer_lr and outer_momentum (only it applies them), when it published them.
    outer: Mapping[str, float] | None = None

    @classmethod
    def from_dict(cls, value: Mapping[str, Any], *, revision: str | None = None) -> GlobalMetadata:
        """Return metadata parsed from JSON; raise HubError when it is malformed."""
        try:
            return cls(
                outer_step=int(value["outer_step"]),
                updated_at=str(value.get("updated_at", "")),
                model_file=str(value.get("model_file", GLOBAL_MODEL)),
                sha256=value.get("sha256"),
                publish_id=value.get("publish_id"),
                revision=revision,
                tokenizer=value["tokenizer"] if isinstance(value.get("tokenizer"), dict) else None,
                outer=value["outer"] if isinstance(value.get("outer"), dict) else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # repr, not dict(value): the value may be JSON that is no object at all ([1], null).
            raise HubError(f"{GLOBAL_METADATA} is malformed ({exc!r}): {value!r:.200}") from None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (the revision is where it was read, not part of the file)."""
        value = {
            "outer_step": self.outer_step,
            "updated_at": self.updated_at,
            "model_file": self.model_file,
            "sha256": self.sha256,
            "publish_id": self.publish_id,
        }
        # Optional keys are left out when unknown; nodes that predate them ignore them.
        optional = {"tokenizer": self.tokenizer, "outer": self.outer}
        return {**value, **{k: dict(v) for k, v in optional.items() if v is not None}}


def check_repo_path(path: str) -> str:
    """Return path when it is a relative repository path without '..' segments, else raise
    ValueError.
    """
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in {"", ".", ".."} for p in parts):
        raise ValueError(
            f"repository path {path!r} must be relative, use '/' separators and contain no '.' or "
            "'..'"
        )
    return path


def _pid_namespace() -> str | None:
    """Return this process's pid namespace (Linux; None elsewhere): containers with the host's
    network share its hostname, not its pids.
    """
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _boot_id() -> str | None:
    """Return this machine's boot id, random at each boot (Linux; None elsewhere): machines
    share hostnames (`localhost`, an image's default) and, outside containers, their pid
    namespace's name (the kernel gives every machine's first one the same inode).
    """
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _this_host() -> dict[str, str | None]:
    """Return what a claim records of the host its process runs on: only a process of the same
    host, boot and pid namespace can be found running, or not, by its pid.
    """
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid_namespace": _pid_namespace()}


def _made_here(claim: Mapping[str, Any]) -> int | None:
    """Return the pid of the process that made `claim` (see HubClient.claim_node) when it was
    made on this host (see _this_host), else None.
    """
    pid = claim.get("pid")
    elsewhere = any(claim.get(key) != value for key, value in _this_host().items())
    return None if elsewhere or type(pid) is not int else pid


def running_here(claim: Mapping[str, Any]) -> tuple[int, bool] | None:
    """Return (pid, known) of the process that made `claim` when it runs on this host (known) or
    might (not known: see _alive), else None.
    """
    pid = _made_here(claim)
    if pid is None:
        return None
    alive = _alive(pid)
    return None if alive is False else (pid, alive is True)


def _alive(pid: int) -> bool | None:
    """Return whether process pid runs on this host, or None when that cannot be told."""
    if pid <= 0 or os.name != "posix":  # Windows' os.kill(pid, 0) sends CTRL_C_EVENT
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: this node's, or one that took its pid
        return None
    return True


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class HubClient:
    """A small retrying client for the DiLoCo repository over any Transport."""

    def __init__(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        api: Any | None = None,
        retry_initial: float = 1.0,
        retry_max: float = 60.0,
        retry_attempts: int = 6,
        sleeper: Callable[[float], None] = time.sleep,
        transport: Transport | None = None,
        endpoint: str | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if not retry_initial > 0 or retry_max < retry_initial or retry_attempts < 1:
            raise ValueError(
                f"bad retry settings: retry_initial={retry_initial} (> 0), retry_max={retry_max} "
                f"(>= retry_initial), retry_attempts={retry_attempts} (>= 1)"
            )
        self.repo_id = repo_id
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.transport: Transport = transport or HfApiTransport(
            repo_id, token=token, endpoint=endpoint, cache_dir=cache_dir, api=api
        )
        self.retry_initial, self.retry_max, self.retry_attempts = (
            retry_initial,
            retry_max,
            retry_attempts,
        )
        self.sleeper = sleeper
        self.logger = logger or LOGGER
        self.outage = OutageLog(repo_id, self.logger)

    def __repr__(self) -> str:  # the token lives only inside the transport's HTTP client
        return f"HubClient({self.repo_id!r}, transport={self.transport!r})"

    @property
    def api(self) -> Any:
        """Return the underlying HfApi (None for a filesystem transport)."""
        return getattr(self.transport, "api", None)

    def _retry(self, operation: str, callback: Callable[[], Any]) -> Any:
        """Run callback, retrying transient failures with exponential backoff; a wait the server
        asks for (a rate limit's reset) replaces a shorter one, up to retry_max.

        Compound operations retry each idempotent request on its own: retried as a whole, an
        operation of k requests under a per-request failure rate p succeeds only with (1 - p) ** k.
        """
        delay = self.retry_initial
        for attempt in range(1, self.retry_attempts + 1):
            try:
                result = callback()
            except TransportError as exc:
                if not exc.transient:  # an answer, if a refusal: the Hub is up
                    self.outage.answered(operation)
                    raise
                if attempt == self.retry_attempts:
                    self.outage.failed(operation, f"{operation} gave up: {exc}")
                    raise HubUnavailable(
                        f"{operation} on {self.repo_id} failed {attempt} times; last error: {exc}"
                    ) from None
                # Retried sooner, a rate-limited node spends its attempts inside the limit's window.
                wait = min(max(delay, exc.retry_after or 0.0), self.retry_max)
                self.outage.failed(
                    operation,
                    f"{operation} failed (attempt {attempt}/{self.retry_attempts}), retrying in "
                    f"{wait:.2f}s: {exc}",
                )
                self.sleeper(wait)
                delay = min(delay * 2, self.retry_max)
            else:
                self.outage.answered(operation)
                return result
        raise AssertionError("unreachable")

    def _call(self, operation: str, callback: Callable[[], Any]) -> Any:
        """Like _retry, with permanent transport errors (other than NotFound) turned into
        HubError.
        """
        try:
            return self._retry(operation, callback)
        except Refused as exc:
            fix = exc.fix or (
                f"give this node a token with write access to {self.repo_id} (HF_TOKEN, or "
                "`hf auth login`; `huggingface-cli login` before huggingface_hub 0.34)"
            )
            raise HubRefused(f"{operation} on {self.repo_id} was refused ({exc}): {fix}") from None
        except Corrupt as exc:
            raise HubCorrupt(f"{operation} on {self.repo_id} failed: {exc}") from None
        except TransportError as exc:
            raise HubError(f"{operation} on {self.repo_id} failed: {exc}") from None

    # -- plain file operations -----------------------------------------------------------------
    def create_repo(self, *, private: bool = True) -> None:
        """Create the repository if it does not exist yet."""
        self._call("create_repo", lambda: self.transport.create_repo(private=private))

    def add_collaborator(self, username: str, permission: str = "write") -> bool:
        """Warn that write access cannot be granted through the API; always return False."""
        warnings.warn(
            f"{COLLABORATOR_WARNING} (requested: {username!r} with {permission!r})", stacklevel=2
        )
        self.logger.warning(
            "cannot grant %s access to %r: %s", permission, username, COLLABORATOR_WARNING
        )
        return False

    def head(self) -> str:
        """Return the current head revision."""
        return self._call("head", self.transport.head)

    def list_files(self, revision: str | None = None) -> list[str]:
        """Return every file path at revision (default: the head)."""
        return self._call(
            "list_files", lambda: self.transport.list_files(revision or self.transport.head())
        )

    def file_exists(self, remote_path: str) -> bool:
        """Return whether remote_path exists at the head."""
        return remote_path in self.list_files()

    def read_bytes(self, remote_path: str, revision: str | None = None) -> bytes:
        """Return the contents of remote_path at revision (default: the head); raise HubError when
        absent.
        """
        return self._call(
            f"read {remote_path}",
            lambda: self.transport.read(remote_path, revision or self.transport.head()),
        )

    def _commit(
        self, operation: str, files: Mapping[str, bytes], *, already_done: Callable[[], bool]
    ) -> None:
        """Commit files; a retry first checks already_done, so a commit whose response was lost is
        not redone.
        """
        state = {"retrying": False}

        def attempt() -> None:
            if state["retrying"] and already_done():
                return
            state["retrying"] = True
            self.transport.commit(files, [], message=operation)

        self._call(operation, attempt)

    def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Upload one local file to remote_path (idempotent under retries)."""
        self.upload_bytes(Path(local_path).read_bytes(), remote_path)

    def upload_bytes(self, data: bytes, remote_path: str) -> None:
        """Upload bytes to remote_path (idempotent under retries)."""
        check_repo_path(remote_path)
        self._commit(
            f"upload {remote_path}",
            {remote_path: data},
            already_done=lambda: self._holds(remote_path, data),
        )

    def _head(self) -> str:
        """One head request, retried on its own."""
        return self._retry("head", self.transport.head)

    def _read_at(self, remote_path: str, revision: str) -> bytes:
        """One read request, retried on its own (NotFound passes through)."""
        return self._retry(
            f"read {remote_path}", lambda: self.transport.read(remote_path, revision)
        )

    def _metadata_at(self, revision: str) -> GlobalMetadata | None:
        """Return global/step_count.json at revision, or None before the first publish."""
        try:
            raw = self._read_at(GLOBAL_METADATA, revision)
        except NotFound:
            return None
        try:
            return GlobalMetadata.from_dict(json.loads(raw), revision=revision)
        except ValueError as exc:
            raise HubError(f"{GLOBAL_METADATA} is not JSON: {exc}") from None

    def _holds(self, remote_path: str, data: bytes) -> bool:
        try:
            return self._read_at(remote_path, self._head()) == data
        except NotFound:
            return False

    def download(self, remote_path: str, local_path: str | os.PathLike[str] | None = None) -> Path:
        """Download remote_path at the head into local_path (default: under cache_dir)
        atomically.
        """
        if local_path is None:
            if self.cache_dir is None:
                raise ValueError("download needs local_path when the client has no cache_dir")
            local_path = self.cache_dir / self.repo_id.replace("/", "--") / remote_path
        return atomic_write_bytes(Path(local_path), self.read_bytes(remote_path))

    def read_json(
        self, remote_path: str, *, default: Any = None, revision: str | None = None
    ) -> Any:
        """Return parsed JSON at remote_path, or default when the file does not exist."""

        def read() -> bytes | None:
            try:
                return self.transport.read(remote_path, revision or self.transport.head())
            except NotFound:
                return None

        raw = self._call(f"read {remote_path}", read)
        if raw is None:
            return default
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise HubError(f"{remote_path} in {self.repo_id} is not JSON: {exc}") from None

    def write_json(self, remote_path: str, value: Any) -> None:
        """Write value as JSON to remote_path."""
        self.upload_bytes(json.dumps(value, sort_keys=True).encode(), remote_path)

    # -- DiLoCo layout ------------------------------------------------------------------------
    def global_metadata(self) -> GlobalMetadata | None:
        """Return the published metadata with the revision it was read at, or None before the first
        publish (also before the master created the repository: a worker started first waits).
        """

        def read() -> GlobalMetadata | None:
            try:
                head = self._head()
            except NotFound:
                return None
            return self._metadata_at(head)

        return self._call("global_metadata", read)

    def read_manifest(self, metadata: GlobalMetadata) -> dict[str, Any]:
        """Return global/manifest.json at the metadata's revision (empty when absent)."""
        return self.read_json(GLOBAL_MANIFEST, default={}, revision=metadata.revision)

    def _read_global(self, metadata: GlobalMetadata | None) -> bytes:
        """Return the global model's bytes pinned to the metadata's revision (the newest when
        None), checked against its published sha256.
        """
        metadata = metadata or self.global_metadata()
        if metadata is None:
            raise HubError(f"{self.repo_id} has no published global model yet")
        data = self.read_bytes(metadata.model_file, revision=metadata.revision)
        if metadata.sha256 is not None and hashlib.sha256(data).hexdigest() != metadata.sha256:
            raise HubError(
                f"{metadata.model_file} at {metadata.revision} does not match its published sha256"
            )
        return data

    def download_global_state(
        self, metadata: GlobalMetadata | None = None
    ) -> dict[str, torch.Tensor]:
        """Return the global model pinned to the metadata's revision, checked against its sha256."""
        return from_safetensors_bytes(self._read_global(metadata))

    def download_global(
        self, local_path: str | os.PathLike[str], metadata: GlobalMetadata | None = None
    ) -> Path:
        """Download the global model (pinned and checked like download_global_state) to
        local_path.
        """
        return atomic_write_bytes(Path(local_path), self._read_global(metadata))

    def publish_global(
        self,
        state: Mapping[str, torch.Tensor],
        *,
        outer_step: int,
        work_dir: str | os.PathLike[str] | None = None,
        updated_at: str | None = None,
        metadata_extra: dict[str, str] | None = None,
        consumed: list[str] | tuple = (),
        tokenizer: Mapping[str, Any] | None = None,
        outer: Mapping[str, float] | None = None,
    ) -> GlobalMetadata:
        """Publish model, step_count.json and manifest in one compare-and-swap commit; delete
        consumed deltas. `tokenizer` (the identity of the tokenizer of the master's data) goes
        into step_count.json, so nodes trained on other token ids refuse the model; so does
        `outer` (the master's outer_lr and outer_momentum), so a node set otherwise says so.
        """
        del work_dir  # 2.0 staged files on disk; contents now travel from memory
        model = to_safetensors_bytes(
            state, metadata={"outer_step": str(outer_step), **(metadata_extra or {})}
        )
        metadata = GlobalMetadata(
            outer_step,
            updated_at or _utc_now(),
            GLOBAL_MODEL,
            hashlib.sha256(model).hexdigest(),
            uuid.uuid4().hex,
            tokenizer=tokenizer,
            outer=outer,
        )
        manifest = {
            "outer_step": outer_step,
            "publish_id": metadata.publish_id,
            "processed": list(consumed),
            "files": {GLOBAL_MODEL: {"sha256": metadata.sha256, "size": len(model)}},
        }
        files = {
            GLOBAL_MODEL: model,
            GLOBAL_METADATA: json.dumps(metadata.to_dict()).encode(),
            GLOBAL_MANIFEST: json.dumps(manifest).encode(),
        }
        consumed_set = set(consumed)

        def attempt() -> str:  # the reads retry on their own; a failed commit retries the attempt
            head = self._head()
            # Only the master deletes, so deltas present now are still present at any later head.
            listed = self._retry("list_files", lambda: self.transport.list_files(head))
            deletions = [p for p in listed if p in consumed_set][:MAX_DELETIONS_PER_COMMIT]
            for rebase in range(CAS_ATTEMPTS + 1):
                current = self._metadata_at(head)
                if current is not None and (
                    current.publish_id == metadata.publish_id
                    or (current.outer_step, current.sha256) == (outer_step, metadata.sha256)
                ):
                    # an earlier attempt (or call) published this model; its answer was lost
                    return head
                if current is not None and current.outer_step >= outer_step:
                    raise HubError(
                        f"{self.repo_id} already holds outer step {current.outer_step} >= "
                        f"{outer_step} "
                        "from another publisher: is a second master running?"
                    )
                try:
                    return self.transport.commit(
                        files,
                        deletions,
                        message=f"outer step {outer_step}",
                        parent=head if rebase < CAS_ATTEMPTS else None,
                    )
                # Mostly a worker's delta landed meanwhile: check global/ again, retry.
                except StaleParent:
                    head = self._head()
            raise AssertionError("unreachable: the last attempt commits without a parent")

        revision = self._call(f"publish outer step {outer_step}", attempt)
        return GlobalMetadata(**{**metadata.__dict__, "revision": revision})

    def upload_delta(
        self,
        state: Mapping[str, torch.Tensor],
        *,
        node_id: str,
        local_step: int,
        base_outer_step: int,
        work_dir: str | os.PathLike[str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Upload one node delta at its deterministic path and return the path (safe to retry)."""
        del work_dir  # 2.0 staged files on disk; contents now travel from memory
        path = delta_path(node_id, local_step, base_outer_step)
        header = {
            "node_id": node_id,
            "local_step": str(local_step),
            "base_outer_step": str(base_outer_step),
        }
        self.upload_bytes(
            to_safetensors_bytes(state, metadata={**(metadata or {}), **header}), path
        )
        return path

    def prune(self) -> tuple[int, int]:
        """Delete what the transport keeps but no longer needs (a shared folder's old objects,
        with distributed.prune_after); return the files and bytes deleted. A failure only warns:
        nothing depends on it.
        """
        prune = getattr(self.transport, "prune", None)
        if prune is None:
            return 0, 0
        try:
            return prune()
        except (OSError, TransportError) as exc:
            self.logger.warning("pruning old versions of %s failed: %s", self.repo_id, exc)
            return 0, 0

    def claim_node(
        self, node_id: str, session: str, *, take_over: bool = True
    ) -> dict[str, Any] | None:
        """Record that process `session` (this host and pid) now runs node_id
        (nodes/<node_id>.json); return None.

        With take_over False the claim is made only while no other process holds it, else that
        process's claim is returned: the claim is read and written in one compare-and-swap
        commit, so of two processes claiming at once exactly one wins and the other sees it. A
        claim left by a process that sent no delta and is dead counts as free (see _abandoned).
        """
        path = f"nodes/{node_id}.json"
        claim = {"session": session, "claimed_at": _utc_now(), **_this_host(), "pid": os.getpid()}
        if take_over:
            self.write_json(path, claim)
            return None
        data = json.dumps(claim, sort_keys=True).encode()

        def attempt() -> dict[str, Any] | None:
            for _ in range(CLAIM_ATTEMPTS):
                head = self._head()
                held = self.read_json(path, revision=head) or {}
                holder = held.get("session")
                if holder == session:  # an earlier attempt landed; its answer was lost
                    return None
                if holder is not None and not self._abandoned(node_id, held, head):
                    return held
                commit = partial(
                    self.transport.commit, {path: data}, [], message=f"claim {path}", parent=head
                )
                try:
                    self._retry(f"claim {path}", commit)
                    return None
                except StaleParent:  # another commit landed between the read and the write
                    continue
            raise HubError(
                f"could not claim {path}: the head of {self.repo_id} moved under each of "
                f"{CLAIM_ATTEMPTS} attempts"
            )

        return self._call(f"claim {path}", attempt)

    def _abandoned(self, node_id: str, claim: Mapping[str, Any], revision: str) -> bool:
        """Return whether a claim of node_id may be taken over by a process starting afresh: it
        was made on this host (its name, boot and pid namespace) by a process that is dead (a
        crash, or a torchrun restart, before its first checkpoint) and no delta of node_id exists
        at revision, at deltas/ or applied (listed in the manifest once the master deleted it), so
        none can take a new one's name. A claim without them (before they were recorded) is never
        abandoned.
        """
        pid = _made_here(claim)
        if pid is None or _alive(pid) is not False:  # an unknown one may run: never taken
            return False
        return not self._node_deltas(node_id, revision)

    def _node_deltas(self, node_id: str, revision: str) -> list[DeltaRef]:
        """Return node_id's deltas at revision: those at deltas/ and those the master consumed
        (listed in the manifest once it deleted them).
        """
        listed = self._retry("list_files", lambda: self.transport.list_files(revision))
        manifest = self.read_json(GLOBAL_MANIFEST, default={}, revision=revision)
        refs = map(parse_delta_ref, [*listed, *manifest.get("processed", [])])
        return [ref for ref in refs if ref is not None and ref.node_id == node_id]

    def delta_steps(self, node_id: str) -> set[int]:
        """Return the local steps of node_id's deltas in the repository, waiting or consumed
        (none when there is no repository yet).
        """

        def read() -> set[int]:
            try:
                head = self._head()
            except NotFound:
                return set()
            return {ref.local_step for ref in self._node_deltas(node_id, head)}

        return self._call(f"list the deltas of node {node_id!r}", read)

    def node_session(self, node_id: str) -> str | None:
        """Return the session that last claimed node_id, or None when none did."""
        claim = self.read_json(f"nodes/{node_id}.json")
        return None if claim is None else claim.get("session")

    def delta_paths(self) -> list[str]:
        """Return every delta path at the head."""
        return [p for p in self.list_files() if parse_delta_ref(p) is not None]

    def delta_refs(self, revision: str | None = None) -> list[DeltaRef]:
        """Return every delta at revision (default: the head), parsed from its path."""
        return [ref for ref in map(parse_delta_ref, self.list_files(revision)) if ref is not None]


def build_hub_client(
    section: Any,
    *,
    logger: logging.Logger | None = None,
    sleeper: Callable[[float], None] = time.sleep,
) -> HubClient:
    """Return a HubClient for a distributed section (or a whole config): the Hub or a shared
    folder, with the section's retry policy.
    """
    section = resolve_section(section, "distributed")
    if not section.repo_id:
        raise ConfigError(
            "distributed.repo_id", "is required to reach the Hub", allowed="e.g. my-org/run-1"
        )
    if section.transport == "filesystem":
        if not section.endpoint:
            raise ConfigError(
                "distributed.endpoint", "must name a shared folder when transport is filesystem"
            )
        transport: Transport = FilesystemTransport(
            Path(section.endpoint) / section.repo_id, prune_after=section.prune_after
        )
    else:
        transport = HfApiTransport(
            section.repo_id,
            token=section.token,
            endpoint=section.endpoint,
            cache_dir=section.cache_dir,
        )
    return HubClient(
        section.repo_id,
        transport=transport,
        cache_dir=section.cache_dir,
        sleeper=sleeper,
        logger=logger,
        retry_initial=section.retry_initial,
        retry_max=section.retry_max,
        retry_attempts=section.retry_attempts,
    )


__all__ = [
    "COLLABORATOR_WARNING",
    "GLOBAL_MANIFEST",
    "GLOBAL_METADATA",
    "GLOBAL_MODEL",
    "GlobalMetadata",
    "HubClient",
    "HubError",
    "HubCorrupt",
    "HubRefused",
    "HubUnavailable",
    "build_hub_client",
    "check_repo_path",
    "failure_level",
    "running_here",
]
