"""A loopback Hugging Face Hub server speaking the subset of the HTTP API that HfApi uses.

It stores repositories in memory as chains of commits with 40-hex oids, honours `parentCommit`
(412 when it is not the head), answers "regular" upload mode so contents travel inline, and
injects faults on request: 5xx, 429, dropped connections (request not applied), lost responses
(request applied, answer never sent) and stale parents (another writer commits first). A README.md
upload is preceded by POST /api/validate-yaml, answered here for a closed metadata block. Given
tokens, it answers an unknown one with 401, a request without one with 401 RepoNotFound (a private
repository), and a commit or repository creation with a read-only one with 403, as the Hub does.

    python -m speedtronic_diloco.testing.hub_server --port 8765 [--fault-rate 0.3 --seed 1]
        [--token hf_write --token hf_read:read]

A 429 or 5xx says when to retry (Retry-After, and RateLimit's reset for a 429): 0 seconds, or a
scripted fault's "retry_after".

Test hooks (never faulted): POST /_test/faults {"rate", "kinds", "seed"} or {"script": [...]},
GET /_test/log (every commit: repo, oid, added and deleted paths, request bytes), GET /_test/stats.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import random
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LOGGER = logging.getLogger("speedtronic_diloco.testing.hub_server")
FAULT_KINDS = ("500", "503", "429", "drop", "lost", "stale")
_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass
class Commit:
    """One commit: its oid, parent and the complete file tree it leaves."""

    oid: str
    parent: str | None
    tree: dict[str, bytes]
    message: str


@dataclass
class Repo:
    """A repository: an append-only list of commits; the last one is the head of main."""

    repo_id: str
    repo_type: str
    private: bool
    commits: list[Commit] = field(default_factory=list)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def at(self, revision: str) -> Commit | None:
        """Return the commit a revision names (main, or a full or abbreviated oid)."""
        if revision in {"main", "HEAD"}:
            return self.head
        for commit in reversed(self.commits):
            if len(revision) >= 7 and commit.oid.startswith(revision):
                return commit
        return None

    def commit(self, tree: dict[str, bytes], message: str) -> Commit:
        """Append a commit with a fresh oid and return it."""
        parent = self.commits[-1].oid if self.commits else None
        seed = f"{self.repo_id}\0{parent}\0{len(self.commits)}\0{message}".encode()
        oid = hashlib.sha1(
            seed + b"".join(hashlib.sha1(v).digest() for v in tree.values())
        ).hexdigest()
        self.commits.append(Commit(oid, parent, tree, message))
        return self.commits[-1]


class FaultPlan:
    """Which requests fail and how: a scripted queue first, then a seeded random rate."""

    def __init__(
        self, rate: float = 0.0, kinds: tuple[str, ...] = FAULT_KINDS, seed: int = 0
    ) -> None:
        self.lock = threading.Lock()
        self.injected: dict[str, int] = {}
        self.configure(rate=rate, kinds=kinds, seed=seed)

    def configure(
        self,
        *,
        rate: float = 0.0,
        kinds: tuple[str, ...] | list[str] = FAULT_KINDS,
        seed: int = 0,
        script: list[dict[str, Any]] | None = None,
    ) -> None:
        """Replace the plan. script items: {"kind", "method"?, "path"? (substring), "times"?,
        "retry_after"? (seconds)}.
        """
        unknown = set(kinds) - set(FAULT_KINDS) | {s["kind"] for s in script or []} - set(
            FAULT_KINDS
        )
        if unknown or not 0 <= rate <= 1:
            raise ValueError(
                f"bad fault plan: unknown kinds {sorted(unknown)} or rate {rate} outside [0, 1]"
            )
        with self.lock:
            self.rate, self.kinds, self.rng = rate, tuple(kinds), random.Random(seed)
            self.script = [dict(item, times=int(item.get("times", 1))) for item in script or []]

    def add(
        self,
        kind: str,
        *,
        method: str | None = None,
        path: str | None = None,
        times: int = 1,
        retry_after: int = 0,
    ) -> None:
        """Queue a scripted fault for the next matching request(s); a 429 or 5xx asks the client
        to wait retry_after seconds.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; use one of {FAULT_KINDS}")
        with self.lock:
            self.script.append(
                {
                    "kind": kind,
                    "method": method,
                    "path": path,
                    "times": times,
                    "retry_after": retry_after,
                }
            )

    def pick(self, method: str, path: str, *, mutating: bool) -> str | None:
        """Return the fault to inject into this request, or None."""
        return self.choose(method, path, mutating=mutating)[0]

    def choose(self, method: str, path: str, *, mutating: bool) -> tuple[str | None, int]:
        """Return (the fault to inject into this request or None, its Retry-After seconds)."""
        with self.lock:
            for item in self.script:
                if item.get("method") not in (None, method) or (item.get("path") or "") not in path:
                    continue
                item["times"] -= 1
                if item["times"] <= 0:
                    self.script.remove(item)
                return self._count(item["kind"]), int(item.get("retry_after", 0))
            if self.rate and self.rng.random() < self.rate:
                usable = [k for k in self.kinds if mutating or k not in {"lost", "stale"}]
                return (self._count(self.rng.choice(usable)) if usable else None), 0
        return None, 0

    def _count(self, kind: str) -> str:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return kind


class HubStore:
    """Every repository, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.log: list[dict[str, Any]] = []


class _Reply(Exception):
    """Raised inside a handler to send an error response."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # route through logging, not stderr
        LOGGER.debug("%s " + format, self.address_string(), *args)

    # -- plumbing ------------------------------------------------------------------------------
    def _body(self) -> bytes:
        """Read the whole request body (always, so an error reply cannot desync keep-alive)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(value).encode(), headers)

    def _hang_up(self) -> None:
        """Close the connection without answering (a dropped connection or a lost response)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        body = self._body()
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts[:1] == ["_test"]:
            return self._test_hook(parts[1:], body)
        mutating = self.command == "POST" and (
            "commit" in parts or parts[:3] == ["api", "repos", "create"]
        )
        refusal = self._refusal(mutating)
        if refusal is not None:
            status, message, code = refusal
            headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
            return self._json(status, {"error": message}, headers)
        fault, wait = self.server.faults.choose(self.command, url.path, mutating=mutating)
        if fault == "drop":
            return self._hang_up()
        if fault in {"500", "503", "429"}:
            headers = {"Retry-After": str(wait)}
            if fault == "429":
                headers["RateLimit"] = f'"api";r=0;t={wait}'
            return self._json(int(fault), {"error": f"injected fault {fault}"}, headers)
        try:
            reply = self._route(parts, parse_qs(url.query), body, stale=fault == "stale")
        except _Reply as exc:
            headers = {
                "X-Error-Message": exc.message,
                **({"X-Error-Code": exc.code} if exc.code else {}),
            }
            return self._json(exc.status, {"error": exc.message}, headers)
        if fault == "lost":
            return self._hang_up()
        reply()

    def _refusal(self, mutating: bool) -> tuple[int, str, str | None] | None:
        """Return (status, message, error code) when the request's token may not do this, else
        None.
        """
        tokens = self.server.tokens
        if tokens is None:
            return None
        if "Authorization" not in self.headers:
            # The Hub hides a private repository from a request without a token (a 401 that
            # huggingface_hub raises as RepositoryNotFoundError).
            return 401, "Repository not found", "RepoNotFound"
        access = tokens.get(self.headers["Authorization"].removeprefix("Bearer "))
        if access is None:
            return 401, "Invalid credentials in Authorization header", None
        if mutating and access != "write":
            return 403, "You don't have the rights to create a commit in this repository", None
        return None

    # -- the Hub API ---------------------------------------------------------------------------
    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.server.store.repos.get((repo_type, repo_id))
        if repo is None:
            raise _Reply(
                404, f"Repository Not Found for url: {repo_type}s/{repo_id}", "RepoNotFound"
            )
        return repo

    def _revision(self, repo: Repo, revision: str) -> Commit:
        commit = repo.at(revision)
        if commit is None:
            raise _Reply(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _route(self, parts: list[str], query: dict[str, list[str]], body: bytes, *, stale: bool):
        """Apply the request under the store lock and return a callable that sends the answer."""
        store = self.server.store
        with store.lock:
            if self.command == "POST" and parts == ["api", "repos", "create"]:
                return self._create(json.loads(body or b"{}"))
            if self.command == "GET" and parts == ["api", "whoami-v2"]:
                return lambda: self._json(200, {"name": "user", "type": "user", "orgs": []})
            if self.command == "POST" and parts == ["api", "validate-yaml"]:
                return self._validate_yaml(json.loads(body or b"{}").get("content", ""))
            if len(parts) >= 4 and parts[0] == "api" and parts[1] in _TYPES:
                repo = self._repo(_TYPES[parts[1]], f"{parts[2]}/{parts[3]}")
                rest = parts[4:]
                if self.command == "POST" and rest[:1] == ["preupload"]:
                    files = json.loads(body or b"{}").get("files", [])
                    answer = {
                        "files": [
                            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                            for f in files
                        ],
                        "commitOid": repo.head.oid,
                    }
                    return lambda: self._json(200, answer)
                if self.command == "POST" and rest[:1] == ["commit"]:
                    return self._commit(repo, body, stale=stale)
                if self.command == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
                    return self._tree(repo, rest[1], "/".join(rest[2:]), query)
                if self.command == "GET" and (not rest or rest[:1] == ["revision"]):
                    commit = self._revision(repo, rest[1] if len(rest) > 1 else "main")
                    info = {
                        "id": repo.repo_id,
                        "sha": commit.oid,
                        "private": repo.private,
                        "siblings": [{"rfilename": p} for p in sorted(commit.tree)],
                    }
                    return lambda: self._json(200, info)
            if self.command in {"GET", "HEAD"} and "resolve" in parts:
                return self._resolve(parts)
        raise _Reply(404, f"no such endpoint: {self.command} /{'/'.join(parts)}")

    def _create(self, payload: dict[str, Any]):
        name, org = payload.get("name"), payload.get("organization") or "user"
        repo_type = payload.get("type") or "model"
        if not name or repo_type not in _TYPES.values():
            raise _Reply(400, f"bad create request: {payload!r}")
        repo_id = f"{org}/{name}"
        url = {"url": f"{self.server.base_url}/{repo_id}", "name": repo_id}
        if (repo_type, repo_id) in self.server.store.repos:
            return lambda: self._json(409, {**url, "error": "You already created this model repo"})
        repo = Repo(
            repo_id, repo_type, bool(payload.get("private", payload.get("visibility") == "private"))
        )
        repo.commit({".gitattributes": b""}, "initial commit")
        self.server.store.repos[(repo_type, repo_id)] = repo
        return lambda: self._json(200, url)

    def _validate_yaml(self, content: str):
        """Check a README.md's metadata block is closed (the Hub also checks its schema)."""
        if content.startswith("---\n") and "\n---" not in content[3:]:
            errors = [{"message": "the metadata block opened by --- is never closed"}]
            return lambda: self._json(400, {"errors": errors, "warnings": []})
        return lambda: self._json(200, {"errors": [], "warnings": []})

    def _commit(self, repo: Repo, body: bytes, *, stale: bool):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if header is None:
            raise _Reply(400, "commit payload has no header line")
        if stale:  # another writer wins the race just before this commit lands
            repo.commit(dict(repo.head.tree), "concurrent commit (injected)")
        parent = header.get("parentCommit")
        if parent is not None and parent != repo.head.oid:
            raise _Reply(
                412,
                "A commit has happened since. Please refresh and try again. "
                f"(head {repo.head.oid})",
            )
        tree = dict(repo.head.tree)
        added, deleted = [], []
        for line in lines:
            key, value = line.get("key"), line.get("value", {})
            if key == "file":
                tree[value["path"]] = base64.b64decode(value["content"])
                added.append(value["path"])
            elif key == "deletedFile":
                if tree.pop(value["path"], None) is not None:
                    deleted.append(value["path"])
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                deleted += [
                    p for p in list(tree) if p.startswith(prefix) and tree.pop(p) is not None
                ]
            elif key == "lfsFile":
                raise _Reply(400, "this test server accepts inline (regular) uploads only, not LFS")
        commit = repo.commit(tree, header.get("summary", ""))
        self.server.store.log.append(
            {
                "repo": repo.repo_id,
                "oid": commit.oid,
                "added": added,
                "deleted": deleted,
                "bytes": len(body),
            }
        )  # the commit's size on the wire
        answer = {
            "commitUrl": f"{self.server.base_url}/{repo.repo_id}/commit/{commit.oid}",
            "commitOid": commit.oid,
            "pullRequestUrl": None,
        }
        return lambda: self._json(200, answer)

    def _tree(self, repo: Repo, revision: str, prefix: str, query: dict[str, list[str]]):
        commit = self._revision(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        base = prefix.rstrip("/") + "/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, data in sorted(commit.tree.items()):
            if not path.startswith(base):
                continue
            rest = path[len(base) :].split("/")
            for depth in range(1, len(rest)):
                folder = base + "/".join(rest[:depth])
                if recursive or depth == 1:
                    entries.setdefault(
                        folder, {"type": "directory", "oid": commit.oid, "size": 0, "path": folder}
                    )
            if recursive or len(rest) == 1:
                entries[path] = {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data),
                    "path": path,
                }
        if prefix and not entries:
            raise _Reply(404, f"{prefix} does not exist on {revision}", "EntryNotFound")
        listing = list(entries.values())
        return lambda: self._json(200, listing)

    def _resolve(self, parts: list[str]):
        prefix = 1 if parts[0] in {"datasets", "spaces"} else 0
        repo_type = {"datasets": "dataset", "spaces": "space"}.get(parts[0], "model")
        index = parts.index("resolve")
        repo = self._repo(repo_type, "/".join(parts[prefix:index]))
        commit = self._revision(repo, parts[index + 1])
        path = "/".join(parts[index + 2 :])
        if path not in commit.tree:
            raise _Reply(404, f"Entry not found: {path}", "EntryNotFound")
        data = commit.tree[path]
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
        return lambda: self._send(200, data, headers, content_type="application/octet-stream")

    # -- test hooks ----------------------------------------------------------------------------
    def _test_hook(self, parts: list[str], body: bytes) -> None:
        server = self.server
        if self.command == "POST" and parts == ["faults"]:
            try:
                server.faults.configure(**json.loads(body or b"{}"))
            except (TypeError, ValueError) as exc:
                return self._json(400, {"error": str(exc)})
            return self._json(200, {"ok": True})
        with server.store.lock:
            if parts == ["log"]:
                return self._json(200, list(server.store.log))
            if parts == ["stats"]:
                return self._json(
                    200,
                    {
                        "injected": dict(server.faults.injected),
                        "repos": {
                            r.repo_id: {
                                "head": r.head.oid,
                                "commits": len(r.commits),
                                "files": sorted(r.head.tree),
                            }
                            for r in server.store.repos.values()
                        },
                    },
                )
        self._json(404, {"error": f"unknown test hook {parts}"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        store: HubStore,
        faults: FaultPlan,
        tokens: dict[str, str] | None,
    ) -> None:
        super().__init__(address, _Handler)
        self.store, self.faults, self.tokens = store, faults, tokens

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class HubServer:
    """The loopback Hub on a background thread; use as a context manager or start()/stop().

    `tokens` maps each accepted token to "write" or "read"; None (the default) accepts anything.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        faults: FaultPlan | None = None,
        tokens: dict[str, str] | None = None,
    ) -> None:
        self.store = HubStore()
        self.faults = faults or FaultPlan()
        self._server = _Server((host, port), self.store, self.faults, tokens)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Return the endpoint to pass as HfApi(endpoint=...)."""
        return self._server.base_url

    def start(self) -> HubServer:
        """Serve on a daemon thread and return self."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Return the file tree of a repository at a revision (a test convenience)."""
        with self.store.lock:
            commit = self.store.repos[("model", repo_id)].at(revision)
            return dict(commit.tree) if commit else {}


def main(argv: list[str] | None = None) -> None:
    """Run the server in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--fault-rate", type=float, default=0.0, help="fraction of requests that fail"
    )
    parser.add_argument(
        "--fault-kinds", default=",".join(FAULT_KINDS), help=f"comma-separated from {FAULT_KINDS}"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--token",
        action="append",
        help="accept only these tokens (repeatable); TOKEN:read may read but not write",
    )
    args = parser.parse_args(argv)
    faults = FaultPlan(
        args.fault_rate, tuple(k for k in args.fault_kinds.split(",") if k), args.seed
    )
    tokens = None
    if args.token:
        tokens = dict((t.split(":", 1) + ["write"])[:2] for t in args.token)
    server = HubServer(args.host, args.port, faults=faults, tokens=tokens)
    print(f"hub server listening on {server.url}", flush=True)
    try:
        server._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._server.server_close()


if __name__ == "__main__":
    main()
