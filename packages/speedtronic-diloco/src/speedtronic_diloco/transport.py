"""The transport interface and its two backends: the Hugging Face Hub and a shared folder.

A transport stores a versioned file tree. Every write is one commit whose files appear together
(readers pin a revision, so they never see half a commit), and a commit can require that the head
is still `parent` (compare-and-swap).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from speedtronic_config.atomic import atomic_write_bytes


class TransportError(RuntimeError):
    """A transport operation failed; `transient` says whether retrying can help.

    `retry_after`: the seconds the server asked to wait before a retry (None: it did not say).
    """

    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


class NotFound(TransportError):
    """The file, revision or repository does not exist."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class StaleParent(TransportError):
    """A commit's parent is no longer the head (another writer committed first)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class Corrupt(TransportError):
    """A stored file no longer matches its recorded digest: reading it again cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class Refused(TransportError):
    """The server refused the credentials (HTTP 401) or the permission (403), or a shared folder
    refused this process's writes; `fix` says what grants them (None: a Hub write token).
    """

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message, transient=False)
        self.fix = fix


# A shared folder that refuses writes (mounted read-only, owned by another user) refuses every
# later one too: a node retrying it would hold a model-sized delta per boundary, for ever.
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def _writable(root: Path):
    """Turn an OSError that says the shared folder refuses writes into Refused."""
    try:
        yield
    except OSError as error:
        if error.errno not in _UNWRITABLE:
            raise
        raise Refused(
            f"the shared folder {root} refuses this process's writes ({error.strerror})",
            fix=f"mount {root} read-write and let this user write to it",
        ) from None


class Transport(Protocol):
    """What HubClient needs from a storage backend."""

    def create_repo(self, *, private: bool) -> None: ...
    def head(self) -> str: ...
    def list_files(self, revision: str) -> list[str]: ...
    def read(self, path: str, revision: str) -> bytes: ...
    def commit(
        self,
        files: Mapping[str, bytes],
        deletions: list[str],
        *,
        message: str,
        parent: str | None = None,
    ) -> str: ...


def _retry_after(response: Any) -> float | None:
    """Return the seconds a response asks to wait (a 429's RateLimit reset `t=`, or a numeric
    Retry-After), or None when it does not say.
    """
    headers = getattr(response, "headers", None) or {}
    # The Hub sends RateLimit on every response: only a 429 means its window is spent.
    rate_limit = headers.get("RateLimit") if response.status_code == 429 else None
    limit = re.search(r"(?:^|;)\s*t=(\d+)", rate_limit or "")
    value = limit.group(1) if limit else (headers.get("Retry-After") or "").strip()
    # isdigit alone passes "²", which float refuses: a garbled header would escape as a traceback.
    # An HTTP date (or other text): fall back to the backoff.
    return float(value) if value.isascii() and value.isdigit() else None


def _classify_http(exc: Exception) -> TransportError:
    """Map a huggingface_hub / HTTP-library exception onto NotFound, StaleParent, Refused or
    TransportError.
    """
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    name = type(exc).__name__
    text = f"{name}: {exc}".splitlines()[0][:300]
    if status == 412:
        return StaleParent(text)
    if status in {401, 403}:
        # Before the names: huggingface_hub raises RepositoryNotFoundError for a 401 too (the Hub
        # hides a private repository from a request without a token), and that is no absence.
        return Refused(text)
    if status == 404 or name in {
        "EntryNotFoundError",
        "RepositoryNotFoundError",
        "RevisionNotFoundError",
        "RemoteEntryNotFoundError",
    }:
        return NotFound(text)
    if status is not None:
        transient = status in {408, 425, 429} or status >= 500
        return TransportError(
            text, transient=transient, retry_after=_retry_after(response) if transient else None
        )
    if name == "HFValidationError":
        # Raised before any request (a repo_id the Hub cannot hold): retrying cannot help.
        return TransportError(text, transient=False)
    # No response at all: connection refused/reset/dropped, timeouts, protocol errors.
    return TransportError(text, transient=True)


# huggingface_hub >= 1.0 sends every request with timeout=None: one answer that never comes (a
# half-open TCP connection, a stuck proxy) would block a DiLoCo lane forever. A request hook bounds
# each network operation (not the whole transfer, so large uploads are not cut short).
HTTP_TIMEOUT_S = 60.0


# While a thread is inside HfApiTransport._call (a DiLoCo request), `unanswered` holds the
# (method, url) of that call's requests not answered yet; None or unset outside a call.
_IN_CALL = threading.local()
# The statuses huggingface_hub retries on its own for some requests (tree listings, preuploads,
# file metadata), sleeping as long as a Retry-After says, unbounded, up to 5 times per attempt.
_HF_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


class HubBusy(Exception):
    """A retryable answer inside a DiLoCo request, raised before huggingface_hub retries it."""

    def __init__(self, response: Any) -> None:
        super().__init__(f"{response.status_code} for url '{response.request.url}'")
        self.response = response


class HubNoAnswer(Exception):
    """A DiLoCo request sent again after a try got no answer, by huggingface_hub's own retry.

    Raised to stop that retry of a network error, so that HubClient retries it within its bounds.
    """

    def __init__(self, request: Any) -> None:
        super().__init__(
            f"no answer from {request.method} {request.url} (connection failed or timed out)"
        )


def _request_key(request: Any) -> tuple[str, str]:
    return request.method, str(request.url)


def _no_hf_retries(response: Any) -> None:
    # HubClient retries with its own bounds (retry_max, retry_attempts); huggingface_hub's retry
    # under it waited out any Retry-After (an hour's rate-limit window, say) past retry_max, and
    # multiplied each attempt into six requests. Other requests of the process keep theirs.
    unanswered = getattr(_IN_CALL, "unanswered", None)
    if unanswered is None:
        return
    unanswered.discard(_request_key(response.request))
    if response.status_code in _HF_RETRIED_STATUSES:
        raise HubBusy(response)


def _no_hf_reconnects(request: Any) -> None:
    # httpx sends a request once, so one sent again in a DiLoCo call while its last try got no
    # answer is huggingface_hub's retry of a network error (connection refused, a timeout): it
    # slept 1+2+4+8+8 s over five of them per HubClient attempt, 23 s past retry_max each.
    unanswered = getattr(_IN_CALL, "unanswered", None)
    if unanswered is None:
        return
    key = _request_key(request)
    if key in unanswered:
        raise HubNoAnswer(request)
    unanswered.add(key)


def bound_hub_http_timeouts(seconds: float = HTTP_TIMEOUT_S) -> bool:
    """Make huggingface_hub's shared HTTP client time out stalled requests, and leave the retry of
    a DiLoCo request's 429/5xx to HubClient, unless the user set a factory.
    """
    try:
        from huggingface_hub.utils import _http
    except ImportError:
        return False
    default = getattr(_http, "default_client_factory", None)
    if default is None or getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) is not default:
        # an older (requests-based) huggingface_hub, or the user's own client: leave it alone
        return False

    def bound(request: Any) -> None:
        limits = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            kind: seconds if limits.get(kind) is None else limits[kind]
            for kind in ("connect", "read", "write", "pool")
        }

    def bounded_client() -> Any:
        client = default()
        client.event_hooks["request"].extend([bound, _no_hf_reconnects])
        client.event_hooks["response"].append(_no_hf_retries)
        return client

    _http.set_client_factory(bounded_client)
    return True


# huggingface_hub retries some requests itself and warns at every try; inside a transport call
# HubClient retries and reports the failure (once an outage: OutageLog), so those lines only
# repeated it, a few per request, for as long as an outage lasted.
_HF_RETRY_LOGGER = "huggingface_hub.utils._http"


class _QuietInsideCalls(logging.Filter):
    """Drop huggingface_hub's retry lines logged by a thread inside HfApiTransport._call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(_IN_CALL, "unanswered", None) is None


def _quiet_hf_retries() -> None:
    logger = logging.getLogger(_HF_RETRY_LOGGER)
    if not any(isinstance(f, _QuietInsideCalls) for f in logger.filters):
        logger.addFilter(_QuietInsideCalls())


class HfApiTransport:
    """A Hub model repository through huggingface_hub.HfApi (any endpoint: hf.co or a local
    server).
    """

    def __init__(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        endpoint: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        api: Any | None = None,
    ) -> None:
        if api is None:
            from huggingface_hub import HfApi

            bound_hub_http_timeouts()
            api = HfApi(endpoint=endpoint, token=token)
        _quiet_hf_retries()
        self.api = api
        self.repo_id = repo_id
        self._token = token
        self.cache_dir = cache_dir

    def __repr__(self) -> str:  # never show the token
        return f"HfApiTransport({self.repo_id!r}, endpoint={getattr(self.api, 'endpoint', None)!r})"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        _IN_CALL.unanswered = set()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _classify_http(exc) from None
        finally:
            _IN_CALL.unanswered = None

    def create_repo(self, *, private: bool) -> None:
        self._call(
            self.api.create_repo, self.repo_id, private=private, exist_ok=True, repo_type="model"
        )

    def head(self) -> str:
        return self._call(self.api.repo_info, self.repo_id, revision="main").sha

    def list_files(self, revision: str) -> list[str]:
        return list(self._call(self.api.list_repo_files, self.repo_id, revision=revision))

    def read(self, path: str, revision: str) -> bytes:
        # Every delta is read once and every global version is superseded by the next, so the
        # huggingface_hub cache would only grow (a model-sized file per delta and per outer step).
        # Each file lands in a temporary folder under cache_dir instead and is gone once read.
        if self.cache_dir is not None:
            Path(self.cache_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache_dir, prefix="read-") as folder:
            local = self._call(
                self.api.hf_hub_download, self.repo_id, path, revision=revision, local_dir=folder
            )
            return Path(local).read_bytes()

    def commit(
        self,
        files: Mapping[str, bytes],
        deletions: list[str],
        *,
        message: str,
        parent: str | None = None,
    ) -> str:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        operations: list[Any] = [
            CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p, data in files.items()
        ]
        operations += [CommitOperationDelete(path_in_repo=p) for p in deletions]
        info = self._call(
            self.api.create_commit,
            self.repo_id,
            operations=operations,
            commit_message=message,
            parent_commit=parent,
        )
        return info.oid


_REF_RE = re.compile(r"^\d{12}$")


_OBJECT_RE = re.compile(r"^[0-9a-f]{64}$")
_OBJECT_TEMP_RE = re.compile(r"^\.[0-9a-f]{64}\.[0-9a-f]+\.tmp$")  # an atomic write's way there
_PRUNING = ".pruning"  # an object set aside by prune(), deleted once its time is read again


class FilesystemTransport:
    """A versioned file tree in a shared folder (NFS, Lustre, local disk) with atomic commits.

    Layout under root: objects/<sha256> (file contents), commits/<oid>.json (a full path -> object
    map), refs/<sequence> (one file per commit, created with os.link so exactly one writer wins a
    sequence number even on NFS). The head is the highest sequence number.

    With prune_after (seconds), prune() deletes the objects that no revision that was the head in
    the last prune_after seconds uses and that were written before then; None keeps every
    version.
    """

    def __init__(self, root: str | os.PathLike[str], *, prune_after: float | None = None) -> None:
        self.root = Path(root)
        self.prune_after = prune_after

    def __repr__(self) -> str:
        return f"FilesystemTransport({str(self.root)!r})"

    def _refs(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root / "refs") if _REF_RE.match(n))
        except FileNotFoundError:
            raise NotFound(
                f"no repository at {self.root}: the master creates it when it starts "
                "(create_repo); start it, or check distributed.endpoint and repo_id (and that the "
                "shared folder is mounted)"
            ) from None

    def create_repo(self, *, private: bool) -> None:
        with _writable(self.root):
            for sub in ("objects", "commits", "refs"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not self._refs():
                self._link_ref(0, self._write_commit({}, parent=None, message="initial commit"))

    def head(self) -> str:
        refs = self._refs()
        if not refs:
            raise NotFound(
                f"repository at {self.root} has no commits (its creation was cut short, or is "
                "under way): the master completes it when it starts (create_repo)"
            )
        return (self.root / "refs" / refs[-1]).read_text().strip()

    def _tree(self, revision: str) -> dict[str, str]:
        path = self.root / "commits" / f"{revision}.json"
        if not re.fullmatch(r"[0-9a-f]{40}", revision) or not path.exists():
            if revision == "main":
                return self._tree(self.head())
            raise NotFound(f"revision {revision!r} not found in {self.root}")
        return json.loads(path.read_text())["tree"]

    def list_files(self, revision: str) -> list[str]:
        return sorted(self._tree(revision))

    def read(self, path: str, revision: str) -> bytes:
        tree = self._tree(revision)
        if path not in tree:
            raise NotFound(f"{path} not found at revision {revision}")
        try:
            data = (self.root / "objects" / tree[path]).read_bytes()
        except FileNotFoundError:
            # A prune keeps what the head uses: missing there, the object is out of sight for a
            # moment (set aside by a prune, an NFS client's cached lookup) and a retry finds it.
            # Else it is pruned for good, and a retry at this revision cannot help.
            if self._tree(self.head()).get(path) == tree[path]:
                raise TransportError(
                    f"{path} at revision {revision} is missing from {self.root / 'objects'}",
                    transient=True,
                ) from None
            raise TransportError(
                f"{path} at revision {revision} was pruned (older than distributed.prune_after); "
                "read it at a newer revision",
                transient=False,
            ) from None
        if hashlib.sha256(data).hexdigest() != tree[path]:
            # Objects are named by their digest and written atomically: a mismatch is damage on
            # disk, which the same bytes read again (the next round's retry) would repeat.
            raise Corrupt(f"object for {path} is corrupt on disk (sha256 mismatch)")
        return data

    def _write_commit(self, tree: dict[str, str], *, parent: str | None, message: str) -> str:
        oid = uuid.uuid4().hex + uuid.uuid4().hex[:8]
        atomic_write_bytes(
            self.root / "commits" / f"{oid}.json",
            json.dumps({"tree": tree, "parent": parent, "message": message}).encode(),
        )
        return oid

    def _write_objects(self, objects: Mapping[str, bytes], *, reuse: bool = True) -> None:
        """Write each digest's object unless it is there; refresh a reused one's time (a prune
        keeps recently written objects). With reuse=False, only write the missing ones.
        """
        for digest, data in objects.items():
            target = self.root / "objects" / digest
            try:
                if reuse:
                    os.utime(target)
                elif not target.exists():
                    raise FileNotFoundError(target)
            except FileNotFoundError:
                atomic_write_bytes(target, data)

    def prune(self) -> tuple[int, int]:
        """Delete the objects that no revision that was the head in the last prune_after seconds
        uses and that were written before then; return how many files and bytes went.
        """
        if self.prune_after is None:
            return 0, 0
        # The shared folder's clock, not this node's: a file written now carries the server's time.
        clock = self.root / ".prune-clock"
        atomic_write_bytes(clock, b"")
        before = clock.stat().st_mtime - self.prune_after
        # A reader pins a revision while it is the head: keep every revision that was the head
        # since `before`, i.e. the head and each one whose successor came after `before`.
        kept: set[str] = set()
        succeeded_at = None  # when the newer ref was made: the end of this one's time as head
        for name in reversed(self._refs()):
            if succeeded_at is not None and succeeded_at < before:
                break
            ref = self.root / "refs" / name
            with contextlib.suppress(FileNotFoundError):
                kept.update(self._tree(ref.read_text().strip()).values())
                succeeded_at = ref.stat().st_mtime
        files = size = 0
        for entry in os.scandir(self.root / "objects"):
            name = entry.name.removesuffix(_PRUNING)
            if _OBJECT_RE.match(name) and name not in kept:
                with contextlib.suppress(FileNotFoundError):  # another pruner took it
                    gone = self._prune_object(Path(entry.path), before)
                    if gone is not None:
                        files, size = files + 1, size + gone
            elif entry.name.endswith(_PRUNING) and _OBJECT_RE.match(name):
                # A prune that stopped midway set aside an object a kept commit references.
                with contextlib.suppress(FileNotFoundError):
                    os.replace(entry.path, self.root / "objects" / name)
            elif _OBJECT_TEMP_RE.match(entry.name):
                # Left by a writer that died mid-write: a live one wrote to it since `before`.
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat()
                    if stat.st_mtime < before:
                        os.unlink(entry.path)
                        files, size = files + 1, size + stat.st_size
        return files, size

    @staticmethod
    def _prune_object(path: Path, before: float) -> int | None:
        """Delete an unreferenced object written before `before`; return its size, or None when
        it stays.

        A commit reusing an object refreshes its time before linking its ref and checks the object
        is there after. So the object is first set aside and its time read again: a refresh from
        before the move shows, and the object goes back.
        """
        name = path.name.removesuffix(_PRUNING)
        aside = path.with_name(name + _PRUNING)
        if path != aside:
            if path.stat().st_mtime >= before:
                return None
            os.replace(path, aside)
        stat = aside.stat()
        if stat.st_mtime >= before:
            os.replace(aside, path.with_name(name))
            return None
        aside.unlink()
        return stat.st_size

    def _link_ref(self, sequence: int, oid: str) -> bool:
        """Claim refs/<sequence> for oid; return False when another writer claimed it first."""
        tmp = self.root / "refs" / f".{oid}.tmp"
        atomic_write_bytes(tmp, oid.encode())
        try:
            os.link(tmp, self.root / "refs" / f"{sequence:012d}")
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def commit(
        self,
        files: Mapping[str, bytes],
        deletions: list[str],
        *,
        message: str,
        parent: str | None = None,
    ) -> str:
        with _writable(self.root):
            return self._commit(files, deletions, message=message, parent=parent)

    def _commit(
        self,
        files: Mapping[str, bytes],
        deletions: list[str],
        *,
        message: str,
        parent: str | None,
    ) -> str:
        digests = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
        objects = {digests[path]: data for path, data in files.items()}
        self._write_objects(objects)
        while True:
            refs = self._refs()
            head = (self.root / "refs" / refs[-1]).read_text().strip()
            if parent is not None and parent != head:
                raise StaleParent(f"parent {parent} is not the head {head}")
            tree = dict(self._tree(head))
            for path in deletions:
                tree.pop(path, None)
            tree.update(digests)
            oid = self._write_commit(tree, parent=head, message=message)
            if self._link_ref(int(refs[-1]) + 1, oid):
                # A prune that began before the refresh above may have deleted a reused object.
                self._write_objects(objects, reuse=False)
                return oid
            # Lost the race for the sequence number: rebase onto the new head (or fail the CAS).
            (self.root / "commits" / f"{oid}.json").unlink(missing_ok=True)


__all__ = [
    "Corrupt",
    "FilesystemTransport",
    "HfApiTransport",
    "HubBusy",
    "HubNoAnswer",
    "NotFound",
    "Refused",
    "StaleParent",
    "Transport",
    "TransportError",
]
