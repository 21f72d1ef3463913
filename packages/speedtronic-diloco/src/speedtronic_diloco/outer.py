"""The outer loop: Nesterov SGD over pseudo-gradients and the master's aggregation thread."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speedtronic_config.atomic import atomic_write_bytes
from speedtronic_diloco.hub import HubClient, HubCorrupt, HubError, failure_level
from speedtronic_diloco.tensors import (
    DeltaRef,
    average_deltas,
    cpu_state_dict,
    delta_problem,
    floating_state,
    from_safetensors_bytes,
    identical_deltas,
    state_nbytes,
    to_safetensors_bytes,
)

LOGGER = logging.getLogger("speedtronic_diloco.outer")
# safetensors adds a JSON header; anything far beyond the payload size is not a delta of this model.
_HEADER_ALLOWANCE = 1 << 20
# Deltas a master round downloads concurrently (and at most holds in memory at once).
DOWNLOAD_THREADS = 8
# The settings of the outer step, which only the master applies (published with its model).
OUTER_SETTINGS = ("outer_lr", "outer_momentum")
EventSink = Callable[[str, dict[str, Any]], None]


class NesterovOuterOptimizer:
    """Nesterov momentum SGD over a floating-point model state."""

    def __init__(self, state: Mapping[str, torch.Tensor], lr: float, momentum: float = 0.9) -> None:
        if not lr > 0:
            raise ValueError(f"distributed.outer_lr must be > 0, got {lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"distributed.outer_momentum must be in [0, 1), got {momentum!r}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.buffers = {
            name: torch.zeros_like(value) for name, value in floating_state(state).items()
        }

    def step(self, state: dict[str, torch.Tensor], delta: Mapping[str, torch.Tensor]) -> None:
        """Apply one outer update in place on CPU state tensors."""
        for name, buf in self.buffers.items():
            grad = delta[name].to(buf.dtype)
            if not grad.any():
                # No node changed it (frozen everywhere): skipped, as torch's SGD skips a
                # parameter without a gradient, so momentum from before the freeze moves it
                # no further.
                continue
            # The same operations in the same order as torch.optim.SGD(nesterov=True, dampening=0),
            # so both give bit-identical results.
            buf.mul_(self.momentum).add_(grad)
            state[name].add_(grad.add(buf, alpha=self.momentum), alpha=-self.lr)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Return the momentum buffers (CPU copies)."""
        return cpu_state_dict(self.buffers)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore momentum buffers; names and shapes must match the model."""
        problem = delta_problem(state, self.buffers)
        if problem is not None:
            raise ValueError(f"outer momentum does not match the model: {problem}")
        self.buffers = cpu_state_dict(state)

    def reset(self) -> None:
        """Zero the momentum (used after adopting a global state whose momentum is unknown)."""
        for buf in self.buffers.values():
            buf.zero_()


@dataclass
class OuterState:
    """The master's persistent state: global model, outer step, ledger and momentum."""

    global_state: dict[str, torch.Tensor]
    outer_step: int = 0
    processed_deltas: dict[str, str] = field(
        default_factory=dict
    )  # path -> "applied" or skip reason
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    last_error: str | None = None
    published_step: int = -1


@dataclass
class RoundReport:
    """What one outer round found and did."""

    outer_step: int
    applied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    published: bool = False


class MasterOuterLoop:
    """Poll and aggregate deltas without coupling polling to inner training.

    The loop owns a CPU copy of the global state and publishes a complete model plus metadata after
    every successful round. Local state (model, momentum, ledger) is saved atomically in one file
    before the round is published, so a crash can lose a publication (re-sent on restart) but never
    applies a delta twice.
    """

    def __init__(
        self,
        hub: HubClient,
        state: Mapping[str, torch.Tensor],
        *,
        node_state_dir: str | Path,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        poll_interval: float = 60.0,
        # A delta computed against outer step b is applied at step s when s - b <= the limit;
        # None (2.0's behaviour) applies every delta.
        staleness_limit: int | None = None,
        on_global_update: Callable[[dict[str, torch.Tensor], int], None] | None = None,
        events: EventSink | None = None,
        logger: logging.Logger | None = None,
        # Raises HubError when this process may no longer publish (another master took over).
        check_owner: Callable[[], None] | None = None,
        # The identity of the tokenizer of the master's data, published with every global model.
        tokenizer: Mapping[str, Any] | None = None,
    ) -> None:
        if staleness_limit is not None and staleness_limit < 0:
            raise ValueError(
                f"distributed.staleness_limit must be >= 0 or null, got {staleness_limit!r}"
            )
        if not poll_interval > 0:
            raise ValueError(f"distributed.poll_interval must be > 0, got {poll_interval!r}")
        self.hub = hub
        self.node_state_dir = Path(node_state_dir)
        self.poll_interval = float(poll_interval)
        self.staleness_limit = staleness_limit
        self.on_global_update = on_global_update
        self.check_owner = check_owner
        self.tokenizer = tokenizer
        self.events = events
        self.logger = logger or LOGGER
        self.optimizer = NesterovOuterOptimizer(state, outer_lr, outer_momentum)
        self._state = OuterState(global_state=cpu_state_dict(state))
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_identical: set[frozenset[str]] = set()
        self._resumed = False  # its state file was loaded
        self.counters = {
            "rounds": 0,
            "applied": 0,
            "skipped_stale": 0,
            "skipped_invalid": 0,
            "publish_failures": 0,
        }
        self._load_local_state()

    # -- local persistence -------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        """Return the file holding the master's global state, momentum and ledger."""
        return self.node_state_dir / "outer_state.safetensors"

    @property
    def metadata_path(self) -> Path:
        """Return the file holding the outer step and ledger: 2.0 kept them in a JSON file beside
        the state; they now live in the state file's safetensors header, written with it.
        """
        return self.state_path

    @property
    def outer_settings(self) -> dict[str, float]:
        """Return the outer_lr and outer_momentum this master applies (published with the model)."""
        return {"outer_lr": self.optimizer.lr, "outer_momentum": self.optimizer.momentum}

    @property
    def outer_step(self) -> int:
        """Return the current outer step."""
        return self._state.outer_step

    @property
    def processed_filenames(self) -> set[str]:
        """Return every delta path already applied or deliberately skipped."""
        with self._lock:
            return set(self._state.processed_deltas)

    def _load_local_state(self) -> None:
        if not self.state_path.exists():
            return
        from safetensors import safe_open

        with safe_open(str(self.state_path), framework="pt") as handle:
            header = json.loads((handle.metadata() or {})["outer"])
        tensors = from_safetensors_bytes(self.state_path.read_bytes())
        global_state = {
            k[len("global/") :]: v for k, v in tensors.items() if k.startswith("global/")
        }
        momentum = {
            k[len("momentum/") :]: v for k, v in tensors.items() if k.startswith("momentum/")
        }
        problem = delta_problem(floating_state(global_state), self._state.global_state)
        if problem is not None:
            # Deleting it alone does not do for a changed model: the repository holds the other
            # model too (adopt_global_state refuses it next).
            raise ValueError(
                f"{self.state_path} does not match the model ({problem}): give this master the "
                "model.* settings it was written with, or, for a new run (its own "
                "distributed.repo_id), delete it or point distributed.state_dir elsewhere"
            )
        self.optimizer.load_state_dict(momentum)
        self._warn_changed_settings(header)
        # Totals span the master's whole run, not one process: a resumed one restarting them at 0
        # made a plotted total jump back. States written before they were saved start at 0.
        self.counters.update({k: int(v) for k, v in header.get("counters", {}).items()})
        self._state = OuterState(
            global_state=global_state,
            outer_step=int(header["outer_step"]),
            processed_deltas=dict(header["processed"]),
            momentum=momentum,
            published_step=int(header["published_step"]),
        )
        self._resumed = True
        self.logger.info(
            "master resumed local outer state at outer step %d", self._state.outer_step
        )

    def _warn_changed_settings(self, header: Mapping[str, Any]) -> None:
        """Warn when this master resumes with an outer_lr or outer_momentum other than its saved
        state's: the new values apply from the next round, which a changed config did silently.
        """
        saved = {k: header.get(k) for k in OUTER_SETTINGS}
        now = self.outer_settings
        changed = [k for k in now if saved[k] is not None and float(saved[k]) != now[k]]
        if changed:
            self.logger.warning(
                "master resumed with other outer settings than its saved state %s: %s; using %s "
                "from the next round",
                self.state_path,
                ", ".join(f"{k} {saved[k]:g} -> {now[k]:g}" for k in changed),
                " and ".join(f"{now[k]:g}" for k in changed),
            )

    def _save_local_state(self) -> None:
        """Persist global state, momentum and ledger together, atomically (caller holds the
        lock).
        """
        tensors = {f"global/{k}": v for k, v in self._state.global_state.items()}
        tensors.update({f"momentum/{k}": v for k, v in self.optimizer.buffers.items()})
        header = {
            "outer_step": self._state.outer_step,
            "processed": self._state.processed_deltas,
            "published_step": self._state.published_step,
            "counters": self.counters,
            **self.outer_settings,
        }
        atomic_write_bytes(
            self.state_path, to_safetensors_bytes(tensors, metadata={"outer": json.dumps(header)})
        )

    # -- one round ---------------------------------------------------------------------------
    def _fetch_delta(
        self, ref: DeltaRef, outer_step: int, revision: str
    ) -> tuple[dict[str, torch.Tensor] | None, str | None]:
        """Return (delta, None) when usable or (None, reason) when it must be skipped for good."""
        if ref.base_outer_step > outer_step:
            return (
                None,
                f"base outer step {ref.base_outer_step} is ahead of the master's {outer_step}",
            )
        age = outer_step - ref.base_outer_step
        if self.staleness_limit is not None and age > self.staleness_limit:
            return None, f"stale: {age} outer steps old, limit {self.staleness_limit}"
        data = self.hub.read_bytes(ref.path, revision=revision)
        limit = state_nbytes(self._state.global_state) + _HEADER_ALLOWANCE
        if len(data) > limit:
            return None, f"implausible size {len(data)} bytes, expected at most {limit}"
        try:
            delta = from_safetensors_bytes(data)
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            return None, f"not a valid safetensors file ({exc})"
        problem = delta_problem(delta, self._state.global_state)
        return (None, problem) if problem else (delta, None)

    def _fetch_deltas(
        self, refs: list[DeltaRef], outer_step: int, revision: str
    ) -> Iterator[tuple[DeltaRef, tuple]]:
        """Yield (ref, (delta, reason)) in order, downloading DOWNLOAD_THREADS at a time.

        Downloads are latency-bound, and a round that fetched them one by one fell further behind
        the more deltas piled up. A failed download yields its HubError as the reason. At most
        DOWNLOAD_THREADS deltas are held at once.
        """

        def fetch(ref: DeltaRef) -> tuple:
            try:
                return self._fetch_delta(ref, outer_step, revision)
            except HubCorrupt as exc:  # the same damaged bytes every round: skipped for good
                return None, f"corrupt: {exc}"
            except HubError as exc:
                return None, exc

        with ThreadPoolExecutor(
            max_workers=DOWNLOAD_THREADS, thread_name_prefix="diloco-fetch"
        ) as pool:
            for start in range(0, len(refs), DOWNLOAD_THREADS):
                chunk = refs[start : start + DOWNLOAD_THREADS]
                yield from zip(chunk, pool.map(fetch, chunk), strict=True)

    def sync_once(self) -> int:
        """Run one outer round and return the resulting outer step.

        Hub listing and downloads happen outside the state lock. Only the short in-memory commit and
        local-state write are serialized, so a training-thread checkpoint never waits for the
        network.
        """
        self._publish_pending()
        with self._lock:
            outer_step = self._state.outer_step
            processed = set(self._state.processed_deltas)
        report = RoundReport(outer_step)
        # One pseudo-gradient per node and global version it trained from: a node's successive
        # deltas against one global are consecutive progress (each from the previous one's end),
        # so they add up to its whole displacement from that global. Displacements from different
        # globals are averaged like different nodes': each was measured from its own starting
        # point, and summing them moved the global several rounds' worth in one step (under 30%
        # faults the published model's loss climbed back past its first version's).
        chains: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        revision = (
            self.hub.head()
        )  # list and read one revision: consistent, and one request fewer per delta
        pending = [
            ref for ref in sorted(self.hub.delta_refs(revision)) if ref.path not in processed
        ]
        for ref, (delta, reason) in self._fetch_deltas(pending, outer_step, revision):
            # Transient: the delta stays unprocessed and is retried next round.
            if isinstance(reason, HubError):
                self.logger.log(
                    failure_level(reason),
                    "could not download %s, retrying next round: %s",
                    ref.path,
                    reason,
                )
                continue
            if delta is None:
                self.logger.warning("skipping delta %s: %s", ref.path, reason)
                report.skipped[ref.path] = reason or "invalid"
            else:
                key = (ref.node_id, ref.base_outer_step)
                total = chains.get(key)
                chains[key] = (
                    delta if total is None else {k: v.add(delta[k]) for k, v in total.items()}
                )
                report.applied.append(ref.path)
        if not chains and not report.skipped:
            return outer_step
        self._warn_identical(chains)
        with self._lock:
            if self._state.outer_step != outer_step:  # adopted a newer global meanwhile: redo later
                return self._state.outer_step
            if chains:
                self.optimizer.step(self._state.global_state, average_deltas(list(chains.values())))
                self._state.outer_step += 1
            self._state.processed_deltas.update({p: "applied" for p in report.applied})
            self._state.processed_deltas.update(report.skipped)
            report.outer_step = self._state.outer_step
            self._count(report)  # before the save, which keeps the totals
            self._save_local_state()
        if chains:
            report.published = self._publish_pending()
        # This round's counts, then the running totals under total_* (a plain **counters would
        # overwrite this round's "applied" with the total).
        self._emit(
            "diloco/outer_round",
            {
                "outer_step": report.outer_step,
                "applied": len(report.applied),
                "skipped": len(report.skipped),
                "published": report.published,
                **{f"total_{k}": v for k, v in self.counters.items()},
            },
        )
        return report.outer_step

    def _warn_identical(self, chains: Mapping[tuple[str, int], Mapping[str, torch.Tensor]]) -> None:
        """Warn once per set of nodes whose pseudo-gradients are equal: they trained on the same
        batches (one run.seed and no data.seed of their own), so averaging them is one node's work.
        """
        for group in identical_deltas(chains):
            nodes = frozenset(node for node, _ in group)
            if len(nodes) < 2 or nodes in self._warned_identical:
                continue
            self._warned_identical.add(nodes)
            self.logger.warning(
                "nodes %s sent identical pseudo-gradients from outer step %s: they trained on the "
                "same batches; give each node its own data.seed (or data.shard_path)",
                ", ".join(sorted(nodes)),
                ", ".join(str(base) for base in sorted({base for _, base in group})),
            )

    def _count(self, report: RoundReport) -> None:
        self.counters["rounds"] += bool(report.applied)
        self.counters["applied"] += len(report.applied)
        stale = sum(reason.startswith("stale") for reason in report.skipped.values())
        self.counters["skipped_stale"] += stale
        self.counters["skipped_invalid"] += len(report.skipped) - stale

    def _publish_pending(self) -> bool:
        """Publish the local global state when the Hub lags behind it; return whether it is
        published.
        """
        with self._publish_lock:
            with self._lock:
                if self._state.published_step >= self._state.outer_step:
                    return True
                step = self._state.outer_step
                state = cpu_state_dict(self._state.global_state)
                ledger = dict(self._state.processed_deltas)
            try:
                if self.check_owner is not None:
                    self.check_owner()
                self.hub.publish_global(
                    state,
                    outer_step=step,
                    consumed=sorted(ledger),
                    tokenizer=self.tokenizer,
                    outer=self.outer_settings,
                )
            # A shared folder's OSError (full, remounted read-only) too: raised, it ended the round
            # unreported (no event, no count) and logged a traceback every round.
            except (HubError, OSError) as exc:
                self.counters["publish_failures"] += 1
                with self._lock:
                    self._state.last_error = str(exc)
                self.logger.log(
                    failure_level(exc),
                    "publishing outer step %d failed, retrying next round: %s",
                    step,
                    exc,
                )
                return False
            with self._lock:
                self._state.published_step = max(self._state.published_step, step)
                self._save_local_state()
            if self.on_global_update is not None:
                self.on_global_update(state, step)
            # One pruner per repository: the master, after each publish.
            files, size = self.hub.prune()
            if files:
                self._emit("diloco/pruned", {"outer_step": step, "files": files, "bytes": size})
            return True

    def recover(self) -> None:
        """Reconcile local state with the Hub at startup: adopt a newer global, or publish ours;
        then say which in a `diloco/master_start` event.
        """
        metadata = self.hub.global_metadata()
        source = "local" if self._resumed else "new"
        # The published version at this master's own step is not its own when this state never
        # published (its disk lost, or a new node id, at outer step 0): the nodes trained from
        # the published model, so it is adopted, not replaced by this process's initialization.
        if metadata is not None and (
            metadata.outer_step > self.outer_step
            or (metadata.outer_step == self.outer_step and self._state.published_step < 0)
        ):
            state = self.hub.download_global_state(metadata)
            self.adopt_global_state(
                state,
                metadata.outer_step,
                reset_momentum=True,
                processed=self.hub.read_manifest(metadata).get("processed", []),
            )
            source = "published"
        elif metadata is not None and metadata.outer_step == self.outer_step:
            with self._lock:
                self._state.published_step = max(self._state.published_step, metadata.outer_step)
        # A restarted master logged its outer state at INFO only, which the CLI does not show: a
        # master killed between saving a round and publishing it said nothing of either.
        republish = self._resumed and self._state.published_step < self.outer_step
        published = self._publish_pending()
        self._emit(
            "diloco/master_start",
            {
                "outer_step": self.outer_step,
                "source": source,
                "republished": republish and published,
                "ledger": len(self.processed_filenames),
            },
        )

    def adopt_global_state(
        self,
        state: Mapping[str, torch.Tensor],
        outer_step: int,
        *,
        reset_momentum: bool = False,
        processed: list[str] | None = None,
    ) -> None:
        """Recover a newer remotely published global state after a crash."""
        problem = delta_problem(floating_state(state), self._state.global_state)
        if problem is not None:
            raise ValueError(
                f"published global state at outer step {outer_step} in {self.hub.repo_id} does "
                f"not match the model ({problem}): it belongs to a different model; give this "
                "master the run's model.* settings or its own distributed.repo_id"
            )
        with self._lock:
            self._state.global_state = cpu_state_dict(state)
            self._state.outer_step = outer_step
            self._state.published_step = outer_step
            self._state.processed_deltas.update({p: "applied" for p in processed or []})
            if reset_momentum:
                self.optimizer.reset()
            self._save_local_state()
        self.logger.warning(
            "master adopted the published global state at outer step %d", outer_step
        )

    def snapshot(self) -> tuple[int, dict[str, torch.Tensor]]:
        """Return (outer_step, an independent copy of the global state)."""
        with self._lock:
            return self._state.outer_step, cpu_state_dict(self._state.global_state)

    # -- thread ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background polling thread (idempotent; restartable after stop)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="diloco-master", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.sync_once()
            except HubError as exc:
                # The Hub still unreachable after the client's retries (an outage): expected, and
                # retried next round. A traceback a round buried the log for as long as it lasted.
                self._state.last_error = str(exc)
                self.logger.log(
                    failure_level(exc),
                    "outer round failed, retrying in %.0fs: %s",
                    self.poll_interval,
                    exc,
                )
            except Exception as exc:  # the outer loop must survive anything a round throws
                self._state.last_error = str(exc)
                self.logger.exception("outer round failed; continuing")

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the polling thread and wait for the round in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def finish(self, warn_after: float = 30.0) -> None:
        """Stop the polling thread, then apply in one last round every delta that has landed.

        Without it the deltas sent since the last round (the master's own final one always among
        them) stayed out of the published model until the master was started again. A round in
        progress is waited for, however long the Hub's retries take (saying so after
        `warn_after` seconds): the last round must not run beside it, and the process must not
        exit in its middle, with its ledger saved and its event never logged.
        """
        thread = self._thread
        self.stop(warn_after)
        if thread is not None and thread.is_alive():
            self.logger.warning(
                "the outer round in progress is still retrying the Hub after %.0f s; "
                "waiting for it before the last round",
                warn_after,
            )
            thread.join()
        try:
            self.sync_once()
        except Exception as exc:  # stopping must not fail: the next start applies what is left
            self.logger.warning(
                "final outer round failed, its deltas are applied when the master resumes: %s", exc
            )

    def state_dict(self) -> dict[str, Any]:
        """Return the small part of the master state a trainer checkpoint carries (no tensors)."""
        with self._lock:
            return {
                "outer_step": self._state.outer_step,
                "published_step": self._state.published_step,
                "processed": len(self._state.processed_deltas),
                "counters": dict(self.counters),
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Accept a checkpointed summary; the authoritative master state is the local state file."""
        if int(state.get("outer_step", 0)) > self.outer_step:
            self.logger.warning(
                "checkpoint says outer step %s but local master state is at %d; "
                "the Hub copy is adopted by recover()",
                state.get("outer_step"),
                self.outer_step,
            )

    def _emit(self, event: str, payload: dict[str, Any]) -> None:
        if self.events is None:
            return
        try:
            self.events(event, payload)
        except Exception:  # a metric hook must never break the outer loop
            self.logger.warning("event hook failed for %s", event, exc_info=True)


__all__ = [
    "OUTER_SETTINGS",
    "MasterOuterLoop",
    "NesterovOuterOptimizer",
    "OuterState",
    "RoundReport",
]
