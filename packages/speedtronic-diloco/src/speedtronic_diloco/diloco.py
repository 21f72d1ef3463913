"""DumbDiLoCoCoordinator: the trainer's SyncCoordinator for DiLoCo over a HubClient.

Each local optimizer step calls after_optimizer_step. At an inner boundary (local_step %
inner_steps == 0) the pseudo-gradient baseline - current goes to a bounded background upload lane,
and a newer global model, fetched in the background, is installed - always on the training thread
and only at a boundary, so no local step is ever thrown away. The master additionally runs a
MasterOuterLoop thread that aggregates every node's deltas (its own included). A node may be a
data-parallel group (DDP or FSDP2): rank 0 alone talks to the Hub and decides each boundary, and
every rank follows that decision (speedtronic_diloco.group).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from speedtronic_config import resolve_section
from speedtronic_config.tokenizer_identity import describe_apart, encode_alike
from speedtronic_diloco.group import NodeGroup
from speedtronic_diloco.hub import (
    GlobalMetadata,
    HubClient,
    HubError,
    HubRefused,
    build_hub_client,
    failure_level,
    running_here,
)
from speedtronic_diloco.identity import resolve_identity
from speedtronic_diloco.outer import OUTER_SETTINGS, MasterOuterLoop
from speedtronic_diloco.tensors import compute_pseudo_gradient, cpu_state_dict
from speedtronic_systems.parallel import SINGLE, ParallelContext

LOGGER = logging.getLogger("speedtronic_diloco.diloco")
_STOP = object()
T = TypeVar("T")
StateReader = Callable[[], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class SyncResult:
    """What one boundary did."""

    pushed: bool
    loaded_global: bool
    outer_step: int


@dataclass(frozen=True)
class DeltaUploadJob:
    """Immutable CPU snapshot dispatched to the asynchronous uploader."""

    step: int
    base_outer_step: int
    generation: int
    delta: dict[str, torch.Tensor]
    target_state: dict[str, torch.Tensor]

    def to_state(self) -> dict[str, Any]:
        """Return a checkpointable form (tensors and ints only)."""
        return {"step": self.step, "base_outer_step": self.base_outer_step, "delta": self.delta}


@dataclass(frozen=True)
class GlobalCandidate:
    """A newer global model waiting for the training thread."""

    outer_step: int
    state: dict[str, torch.Tensor]
    tokenizer: Mapping[str, Any] | None = None  # of the master's data, where it published one


def _failure(exc: Exception) -> str:
    """Return a failed network step's error for a log line: a HubError's own message, else with
    its type (an OSError's text alone does not say what it is).
    """
    return str(exc) if isinstance(exc, HubError) else f"{type(exc).__name__}: {exc}"


class DumbDiLoCoCoordinator:
    """Coordinate local inner loops and a Hub-backed outer loop (implements SyncCoordinator).

    With `parallel` (the node's data-parallel group) every rank calls every method; only rank 0
    builds the Hub client, runs the lanes and the outer loop, and keeps the baseline. `tokenizer`
    is the recorded identity of the tokenizer of this node's data: a master publishes it, and a
    node refuses a global model whose data was tokenized otherwise.
    """

    def __init__(
        self,
        config: Any,
        model: torch.nn.Module,
        *,
        hub: HubClient | None = None,
        state_dir: str | Path | None = None,
        logger: logging.Logger | Any | None = None,
        events: Callable[[str, dict[str, Any]], None] | Any | None = None,
        parallel: ParallelContext = SINGLE,
        tokenizer: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = resolve_section(config, "distributed")
        self.tokenizer = dict(tokenizer) if tokenizer is not None else None
        self.group = NodeGroup(parallel)
        self.identity = resolve_identity(config, state_dir)
        self.model = model
        self.hub = hub
        if logger is not None and not isinstance(logger, logging.Logger):
            # A metric logger passed as `logger` (2.0 call sites do) receives the events instead.
            events, logger = events if events is not None else logger, None
        self.logger = logger or LOGGER
        self.events = events
        self.master: MasterOuterLoop | None = None
        self.counters = {
            "uploads": 0,
            "upload_failures": 0,
            "uploads_skipped": 0,
            "globals_installed": 0,
            "bytes_uploaded": 0,
            "global_waits": 0,
            "seconds_waited": 0.0,
        }
        self._local_step = 0
        self._last_global_step = (
            -1
        )  # -1: no global installed yet, so no base to compute deltas against
        self._generation = 0
        self._baseline: dict[str, torch.Tensor] | None = None
        # Uploads that did not leave or failed: the baseline already moved past their work, so
        # they are re-sent under their own names. Merging one into a newer delta would count its
        # work twice when it had landed after all (a lost answer, a kill before the checkpoint
        # saw the acknowledgement); a repeated name the master has consumed is skipped.
        self._retries: list[DeltaUploadJob] = []
        self._prepared: dict[str, Any] | None = None
        self._prepared_pending: list[
            DeltaUploadJob
        ] = []  # restored uploads, sent once the lanes run
        self._lock = threading.Lock()
        self._candidate: GlobalCandidate | None = None
        self._staged = threading.Event()  # set whenever a candidate is staged
        self._rounds_on_global = 0  # boundaries passed since the installed global version
        self._results: queue.Queue[tuple[DeltaUploadJob, bool]] = queue.Queue()
        self._uploads: queue.Queue[Any] | None = None
        self._inflight: DeltaUploadJob | None = None
        self._threads: list[threading.Thread] = []
        self._stop_event = threading.Event()
        self._last_poll = 0.0
        self._started = False
        # Set by a lane when no retry or wait can help (a refused token: a read-only one kept every
        # delta for retry, forever; another process with this node id); the training thread raises.
        self._fatal: HubError | None = None
        # Deltas are named by node id and step, so two processes with one node id overwrote each
        # other's deltas unnoticed. Each claims the id (nodes/<id>.json) when it starts (a worker
        # once the repository exists), at the latest before its first upload: a resumed node takes
        # it over, a fresh one only while no other process holds it (or the holder died on this
        # host before its first delta: a restart). The poll lane, and a master before each
        # publish, check the claim is still its own.
        self._session = uuid.uuid4().hex
        self._claimed = False
        self._resumed = False  # DiLoCo state came from a checkpoint (checked at start)
        # A resumed node's local steps with a delta in the repository: an earlier process may have
        # sent them after the checkpoint, then died. Those boundaries send nothing again, and the
        # boundaries before the last of them install no global (docs/diloco.md).
        self._sent_steps: set[int] = set()
        self._replay_through = -1
        self._warned_outer: Mapping[str, float] | None = None  # the master's, last warned of
        # From note_checkpoint: (the run's checkpoint folder, its checkpoint this process did not
        # resume from or None); None while unknown.
        self._checkpoints: tuple[Path, Path | None] | None = None
        # Set from a signal handler (interrupt), so a plain flag: an Event's lock could be held by
        # the very code the handler interrupted.
        self._interrupted = False
        # Set by start(): it installed a global over the module, so (with reset_inner_optimizer)
        # the trainer clears the inner optimizer, as after a boundary install. A resumed node's
        # checkpointed moments belong to the weights the install discarded.
        self.reset_after_start = False

    # -- read-only views ---------------------------------------------------------------------
    @property
    def local_step(self) -> int:
        """Return the last local step seen."""
        return self._local_step

    @property
    def last_global_step(self) -> int:
        """Return the outer step of the global model last installed (-1 before the first)."""
        return self._last_global_step

    @property
    def outer_step(self) -> int:
        """Return the newest outer step known to this node."""
        master = self.master.outer_step if self.master is not None else -1
        return max(self._last_global_step, master)

    def _emit_event(self, event: str, payload: dict[str, Any]) -> None:
        sink = _event_sink(self.events)
        if sink is None:
            return
        try:
            sink(event, {"node_id": self.identity.node_id, **payload})
        except Exception:  # metric hooks never break training (docs/architecture.md)
            self.logger.warning("metric hook failed for %s", event, exc_info=True)

    def note_checkpoint(self, folder: str | Path, unused: str | Path | None) -> None:
        """Record the run's checkpoint folder and the checkpoint there this process did not resume
        from (None: it holds none, or a resume found none it could use), so that a refusal of a
        used node id names the one fix that applies; without this call it names both.
        """
        self._checkpoints = (Path(folder), None if unused is None else Path(unused))

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Connect, recover or publish the global model, install it on every rank and start the
        I/O lanes (rank 0).
        """
        self.reset_after_start = False
        if self._started:
            return
        self._interrupted = False  # a stop requested during an earlier fit() is over
        self._apply_prepared_state()
        read_state = self.group.state_reader(self.model)

        def connect() -> tuple[bool, GlobalCandidate | None]:
            candidate = self._connect(read_state)
            return candidate is not None, candidate

        installed = self._agree(connect)
        self.reset_after_start = installed and self.settings.reset_inner_optimizer
        if self.group.is_lead:
            self._start_lanes(read_state)
        self._started = True

    def _connect(self, read_state: StateReader) -> GlobalCandidate | None:
        """Reach the Hub, start the outer loop on a master; return the global model to install."""
        if self.hub is None:
            self.hub = build_hub_client(self.settings, logger=self.logger)
        if self.identity.role == "master":
            self._start_master(read_state)  # creates the repository and claims the id in it
        if self._last_global_step < 0:
            candidate = self._first_global()
        else:
            # resumed: a restart begins from the latest global version it can read (docs/diloco.md)
            self._sent_steps = self._read_sent_steps()
            self._replay_through = max(self._sent_steps, default=-1)
            # A restored upload that landed after the checkpoint leaves no second time.
            self._prepared_pending = [
                job for job in self._prepared_pending if job.step not in self._sent_steps
            ]
            candidate = self._take_candidate() or self._fetch_global_candidate()
            if candidate is not None and self._replay_through > self._local_step:
                # The checkpoint's work left in a later delta: the node trains its steps again as
                # the earlier process did, and installs the global at the last boundary it sent.
                self._stage(candidate)
                candidate = None
            elif candidate is not None:
                self._keep_local_work(read_state)
        if candidate is not None or self._last_global_step >= 0:
            self._claim_at_start()  # the repository exists; before any step, so none is lost
        return candidate

    def _claim_at_start(self) -> None:
        """Claim the node id before training, so a node started under a used id stops before it
        trains (a claim that fails for a Hub error is made again before the first delta).
        """
        try:
            self._claim()
        except (HubError, OSError) as exc:
            if isinstance(exc, HubRefused) or exc is self._fatal:
                raise
            self.logger.warning(
                "could not claim node id %r yet, claiming it before the first delta: %s",
                self.identity.node_id,
                _failure(exc),
            )

    def _used_node_id(self, held: Mapping[str, Any]) -> HubError:
        """Return the refusal of a node started without its checkpoint under a node id another
        process claimed (`held`: its claim). Where that process runs now (or might) on this host,
        resuming would only be a second process of the node: it needs another id.

        Its local steps count from 0 again, so its deltas take that process's names
        (deltas/<id>/step-N-base-B): one the master had not read yet was overwritten, and one it
        had applied made the new delta look applied, and it was never read. Two such nodes
        started together (two workers left at the default worker-<hostname>) overwrote each
        other's first deltas. A master too: it trains and sends deltas like a worker (its outer
        state on disk does not hold its step count), and a requeued master takes over its id only
        when resumed.
        """
        node = self.identity.node_id
        running = running_here(held)
        if running is not None:
            pid, known = running
            # Fail-safe: a process this user may not signal (or on a platform without the check)
            # is never taken over, but it is not said to run either: it may have ended.
            runs = "runs now" if known else "may still run"
            unsure = "" if known else "; whether it has ended cannot be checked"
            return HubError(
                f"node {node!r} {runs} in process {pid} on this host (nodes/{node}.json in "
                f"{self.hub.repo_id}{unsure}): two processes of one node id overwrite each other's "
                "deltas; give this node another distributed.node_id"
            )
        # Whether this node has a checkpoint is the caller's to know (note_checkpoint), and a
        # --resume that finds none starts afresh like this: unknown, the fix must hold for both.
        # Deleting the claim is none: a delta of the same step and base, unread or applied,
        # would still take the name.
        if self._checkpoints is None:
            fix = (
                "resume it from its checkpoint (--resume, the same run.output_dir), or, where it "
                "wrote none, give this node a new distributed.node_id"
            )
        elif self._checkpoints[1] is not None:
            fix = f"resume it from its checkpoint {self._checkpoints[1]} (--resume)"
        else:
            fix = (
                f"{self._checkpoints[0]} holds no checkpoint of this node to resume from, so "
                "give it a new distributed.node_id"
            )
        return HubError(
            f"node {node!r} already ran in {self.hub.repo_id} or runs there now "
            f"(nodes/{node}.json) and this process starts without its checkpoint: its deltas "
            f"would take that process's names (deltas/{node}/step-N-...), overwriting them or "
            f"being mistaken for them; {fix} (deleting nodes/{node}.json would let them collide)"
        )

    def _read_sent_steps(self) -> set[int]:
        """Return the local steps of this node's deltas in the repository; say so when one is past
        the checkpoint (none when they cannot be read: the steps trained again are sent again).
        """
        try:
            sent = self.hub.delta_steps(self.identity.node_id)
        except HubRefused:
            raise  # no retry helps: the node stops with the fix
        except Exception as exc:  # a HubError, or a shared folder's OSError
            self.logger.warning(
                "could not list this node's deltas in %s, so steps trained again after the "
                "checkpoint are sent again: %s",
                self.hub.repo_id,
                _failure(exc),
            )
            return set()
        later = sorted(step for step in sent if step > self._local_step)
        if later:
            self.logger.info(
                "resumed at local step %d, but an earlier process sent the deltas of steps %s: "
                "those boundaries are trained again and not sent again",
                self._local_step,
                later,
            )
        return sent

    def _keep_local_work(self, read_state: StateReader) -> None:
        """Before a resumed node installs a newer global over its checkpointed model, queue the
        work no delta carried yet (the steps since its last boundary; a checkpoint between
        boundaries holds them): the installed global would erase it, and the data loader resumes
        past its batches. It leaves with the restored uploads, under this step's name.
        """
        if self._baseline is None or self._local_step <= 0:
            return
        delta = compute_pseudo_gradient(self._baseline, read_state())
        if not any(bool(t.any()) for t in delta.values()):
            return  # checkpointed at a boundary: its delta already left
        self._prepared_pending.append(
            DeltaUploadJob(self._local_step, self._last_global_step, self._generation, delta, {})
        )

    def _start_lanes(self, read_state: StateReader) -> None:
        if self._baseline is None:
            self._baseline = read_state()
        self._stop_event.clear()
        if self.settings.async_delta_upload:
            self._uploads = queue.Queue(maxsize=self.settings.delta_upload_queue_size)
            self._spawn("diloco-upload", self._upload_worker)
        if self.settings.async_global_poll:
            self._spawn("diloco-poll", self._poll_worker)
        self._last_poll = time.monotonic()
        self._send_prepared_pending()

    def _send_prepared_pending(self) -> None:
        jobs, self._prepared_pending = self._prepared_pending, []
        for job in jobs:
            self._send(job)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(
            target=target, name=f"{name}-{self.identity.node_id}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _start_master(self, read_state: StateReader) -> None:
        assert self.hub is not None
        self.hub.create_repo(private=True)
        for user in self.settings.collaborators:
            self.hub.add_collaborator(user)
        # A master started while another still runs (a requeued job, say) takes over: the
        # first one publishes nothing more once it sees this claim.
        self._claim()
        if self.master is None:
            self.master = MasterOuterLoop(
                self.hub,
                read_state(),
                node_state_dir=self.identity.state_dir / "outer",
                outer_lr=self.settings.outer_lr,
                outer_momentum=self.settings.outer_momentum,
                poll_interval=self.settings.poll_interval,
                staleness_limit=self.settings.staleness_limit,
                on_global_update=self._on_outer_update,
                events=self._emit_event,
                logger=self.logger,
                check_owner=self._check_owner,
                tokenizer=self.tokenizer,
            )
        self.master.recover()
        self.master.start()

    def _first_global(self) -> GlobalCandidate | None:
        """Return the published global model; a worker waits for the master to publish one."""
        if self.identity.role != "master":  # else a worker with no master yet looks stuck
            self._emit_event(
                "diloco/first_global_wait",
                {"repo_id": self.hub.repo_id, "timeout_s": self.settings.global_wait_timeout},
            )
        candidate = self._wait_for_global()
        if candidate is not None or self._interrupted:  # a stop: the trainer says so
            return candidate
        self.logger.warning(
            "no global model in %s after %.0fs (is its master running, with the same "
            "distributed.repo_id and endpoint?); training locally and uploading no deltas until "
            "one is installed",
            self.hub.repo_id if self.hub else "?",
            self.settings.global_wait_timeout,
        )
        return None

    def _wait_for_global(self) -> GlobalCandidate | None:
        """Block the training thread until a newer global model is staged, or global_wait_timeout
        passes.

        The poll lane stages candidates when it runs; before it starts, or in the synchronous mode,
        this loop fetches them itself. A delta whose upload failed meanwhile is re-sent at once, so
        a waiting node never holds back the round it waits for.
        """
        deadline = time.monotonic() + self.settings.global_wait_timeout
        lane_polls = self._started and self.settings.async_global_poll
        while True:
            candidate = self._take_candidate() or (
                None if lane_polls else self._fetch_global_candidate()
            )
            self._raise_fatal()
            if candidate is not None or time.monotonic() >= deadline or self._interrupted:
                return candidate
            if self._started:
                self._collect_upload_results()
                self._resend_retries()
            self._staged.wait(min(self.settings.poll_interval, 1.0))
            self._staged.clear()

    def interrupt(self) -> None:
        """End a wait for a global model within a second (signal-handler safe): the trainer calls
        it on SIGTERM/SIGINT, so the node checkpoints and stops instead of waiting out
        global_wait_timeout.
        """
        self._interrupted = True

    def _resend_retries(self) -> None:
        """Re-send undelivered uploads, oldest first, while the upload lane is idle."""
        while self._retries and (
            self._uploads is None or (self._inflight is None and self._uploads.empty())
        ):
            if not self._send(self._retries.pop(0)):
                return  # kept again (at the end); the next boundary or wait retries

    def stop(self) -> None:
        """Stop the lanes (waiting up to delta_upload_shutdown_timeout for a queued upload), then
        the master, after a last outer round over the deltas that landed.
        """
        if not self._started:
            return
        self._stop_event.set()
        deadline = time.monotonic() + self.settings.delta_upload_shutdown_timeout
        if self._uploads is None:
            self._resend_retries()
        else:
            # Undelivered work goes out before the lane stops; what cannot stays in the state.
            while self._retries:
                try:
                    self._uploads.put(
                        self._retries[0], timeout=max(0.0, deadline - time.monotonic())
                    )
                except queue.Full:
                    break
                self._retries.pop(0)
            try:
                self._uploads.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.logger.warning(
                    "%s still busy after the shutdown timeout; its job stays pending in "
                    "the coordinator state and is re-sent on resume",
                    thread.name,
                )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._collect_upload_results()
        if self.master is not None:
            self.master.finish()
        self._started = False

    # -- the training-thread callback --------------------------------------------------------
    def after_optimizer_step(self, model: torch.nn.Module, step: int) -> bool:
        """Handle a local step; return whether the inner optimizer should be reset."""
        self.model = model
        self._local_step = step
        if step % self.settings.inner_steps != 0:
            if self.group.is_lead:  # no collectives between boundaries
                self._collect_upload_results()
                self._maybe_poll_global()
            return False
        result = self.sync_boundary(step)
        return (result.pushed or result.loaded_global) and self.settings.reset_inner_optimizer

    def sync_boundary(self, step: int) -> SyncResult:
        """Dispatch this boundary's delta, then install a newer global model if one is ready.

        After max_local_rounds boundaries on the same global version the node waits here for a newer
        one: asynchronous nodes that trained far apart average into a worse model than either. In a
        data-parallel node every rank calls this; each gets rank 0's result.
        """
        read_state = self.group.state_reader(self.model)
        return self._agree(lambda: self._boundary(step, read_state))

    def _boundary(
        self, step: int, read_state: StateReader
    ) -> tuple[SyncResult, GlobalCandidate | None]:
        """Rank 0's part of a boundary: send the delta, pick the global model to install."""
        self._collect_upload_results()
        pushed = self._dispatch_delta(step, read_state)
        if step < self._replay_through:
            # The global comes at the last boundary an earlier process sent, over steps whose work
            # the repository holds: installed sooner, the steps after it trained that work again
            # on a global that held it already.
            return SyncResult(pushed, False, self.outer_step), None
        if not self.settings.async_global_poll:
            self._stage(self._fetch_global_candidate())
        candidate = self._take_candidate()
        if candidate is None and self._last_global_step >= 0:
            self._rounds_on_global += 1
            limit = self.settings.max_local_rounds
            if limit is not None and self._rounds_on_global >= limit:
                candidate = self._wait_for_newer_global(step)
        installed = -1 if candidate is None else candidate.outer_step
        return SyncResult(pushed, candidate is not None, max(self.outer_step, installed)), candidate

    def _agree(self, decide: Callable[[], tuple[T, GlobalCandidate | None]]) -> T:
        """Run decide on rank 0 (it may wait on the Hub), install the global model it chose on
        every rank, and return its answer on every rank.
        """
        chosen: list[GlobalCandidate | None] = [None]

        def lead() -> tuple[T, int | None]:
            answer, candidate = decide()
            self._raise_fatal()
            if candidate is not None:
                self._check_fits(candidate)  # before the broadcast: a failed load would hang
            chosen[0] = candidate
            return answer, None if candidate is None else candidate.outer_step

        answer, outer_step = self.group.decide(lead)
        if outer_step is not None:
            self._install_state(chosen[0], outer_step)
        return answer

    def _wait_for_newer_global(self, step: int) -> GlobalCandidate | None:
        started = time.monotonic()
        candidate = self._wait_for_global()
        waited = time.monotonic() - started
        self.counters["global_waits"] += 1
        self.counters["seconds_waited"] += waited
        self._emit_event(
            "diloco/global_wait",
            {
                "local_step": step,
                "outer_step": self._last_global_step,
                "rounds": self._rounds_on_global,
                "seconds": waited,
                "installed": candidate is not None,
            },
        )
        if candidate is None and not self._interrupted:
            self._rounds_on_global = 0  # train another max_local_rounds before waiting again
            self.logger.warning(
                "local step %d: no global model newer than outer step %d after %.0fs; training on "
                "(is the master running?)",
                step,
                self._last_global_step,
                waited,
            )
        return candidate

    def _dispatch_delta(self, step: int, read_state: StateReader) -> bool:
        if self._last_global_step < 0 or self._baseline is None:
            self.logger.warning(
                "local step %d: no global model installed yet, so no delta is sent", step
            )
            return False
        if step in self._sent_steps:
            # An earlier process sent this boundary's delta, then died before a checkpoint: its
            # steps count already. Sent again under a newer base, the master applied them twice.
            # A boundary it did not send (its upload failed and was kept) is sent as usual.
            self._baseline = read_state()
            return True  # left (from that process): the inner optimizer resets as it did there
        if (
            self._uploads is not None
            and self.settings.delta_upload_overflow == "skip"
            and self._uploads.full()
        ):
            # 2.0's skip: the baseline stays, so the next delta is cumulative. Work skipped here and
            # then overwritten by a global install is stale against it and is not sent later (sent
            # later, merged into newer deltas under an older base, it made the published model
            # diverge).
            self._count_skip(step)
            return False
        self._resend_retries()
        current = read_state()
        delta = compute_pseudo_gradient(self._baseline, current)
        return self._send(
            DeltaUploadJob(step, self._last_global_step, self._generation, delta, current)
        )

    def _keep_for_later(self, job: DeltaUploadJob) -> None:
        """Keep a job that was not delivered, to re-send under its own name.

        The baseline already moved past it, so the kept job has no target to move it back to.
        """
        self._retries.append(replace(job, target_state={}))

    def _send(self, job: DeltaUploadJob) -> bool:
        """Upload (sync) or enqueue (async) a job; return whether it left. Work that did not is
        kept.
        """
        if self._uploads is None:
            ok = self._upload(job)
        else:
            try:
                self._uploads.put(job, block=self.settings.delta_upload_overflow == "block")
                ok = True
            except queue.Full:
                ok = False
        # The baseline moves at dispatch, not at acknowledgement: the job's work is now either in
        # flight or kept to re-send, never in both, and a global install cannot erase it.
        if job.target_state:
            self._baseline = job.target_state
        if not ok:  # a lane full for a re-sent job, or a failed synchronous upload
            self._keep_for_later(job)
        return ok

    def _count_skip(self, step: int) -> None:
        self.counters["uploads_skipped"] += 1
        # The lane is full because the Hub is slow or down; during an announced outage that is
        # every boundary's news, not a warning each.
        self.logger.log(
            logging.INFO if self.hub is not None and self.hub.outage.active else logging.WARNING,
            "upload lane full at local step %d: delta skipped; the next one is cumulative",
            step,
        )
        self._emit_event("diloco/upload_skipped", {"local_step": step})

    def _upload(self, job: DeltaUploadJob) -> bool:
        """Upload one job (any thread); report the outcome to the training thread."""
        assert self.hub is not None
        ok, path = False, None
        try:
            # Once the node must stop nothing leaves: a node that lost its id's claim would
            # overwrite the other process's deltas. The job stays pending in the checkpoint.
            if self._fatal is None:
                self._claim()
                path = self.hub.upload_delta(
                    job.delta,
                    node_id=self.identity.node_id,
                    local_step=job.step,
                    base_outer_step=job.base_outer_step,
                )
                ok = True
        except Exception as exc:
            # A HubError, or not (a full or vanished shared folder raises OSError): raised here, it
            # would end the upload lane with this job in no retry list and no checkpoint. It is
            # kept and re-sent like any failed upload.
            self.logger.log(
                failure_level(exc),
                "delta upload for local step %d failed, re-sent later: %s",
                job.step,
                _failure(exc),
            )
            if isinstance(exc, HubRefused):
                self._fatal = exc
        if self._uploads is not None:
            self._results.put((job, ok))
        else:
            self._count_result(job, ok)
        if ok:
            self._emit_event(
                "diloco/upload",
                {"local_step": job.step, "base_outer_step": job.base_outer_step, "path": path},
            )
        return ok

    def _upload_worker(self) -> None:
        assert self._uploads is not None
        while True:
            job = self._uploads.get()
            if job is _STOP:
                return
            with self._lock:
                self._inflight = job
            try:
                self._upload(job)
            finally:
                with self._lock:
                    self._inflight = None

    def _collect_upload_results(self) -> None:
        """Account for finished asynchronous uploads (training thread only)."""
        while True:
            try:
                job, ok = self._results.get_nowait()
            except queue.Empty:
                return
            self._count_result(job, ok)
            if not ok:
                self._keep_for_later(job)

    def _count_result(self, job: DeltaUploadJob, ok: bool) -> None:
        if ok:
            self.counters["uploads"] += 1
            self.counters["bytes_uploaded"] += sum(
                t.numel() * t.element_size() for t in job.delta.values()
            )
        else:
            self.counters["upload_failures"] += 1
            self._emit_event("diloco/upload_failed", {"local_step": job.step})

    # -- global model ------------------------------------------------------------------------
    def _fetch_global_candidate(self) -> GlobalCandidate | None:
        """Return a newer published global model (pinned to its metadata's revision), or None."""
        if self.hub is None:
            return None
        try:
            self._check_claim()
            metadata: GlobalMetadata | None = self.hub.global_metadata()
            known = max(
                self._last_global_step, self._candidate.outer_step if self._candidate else -1
            )
            if metadata is not None:
                self._warn_outer_settings(metadata.outer)
            if metadata is None or metadata.outer_step <= known:
                return None
            state = self.hub.download_global_state(metadata)
            return GlobalCandidate(metadata.outer_step, state, metadata.tokenizer)
        except HubRefused as exc:
            self._fatal = exc  # raised on the training thread; it does not train on
            return None
        except Exception as exc:
            # A HubError, or not (an OSError of a shared folder): raised here, it would end the
            # poll lane, and no global would be installed again.
            self.logger.log(
                failure_level(exc), "global poll failed, training continues: %s", _failure(exc)
            )
            return None

    def _warn_outer_settings(self, theirs: Mapping[str, float] | None) -> None:
        """Warn once per master setting when this node's outer_lr or outer_momentum differs from
        the master's: only the master applies them, so a worker's were ignored without a word.
        """
        if theirs is None or theirs == self._warned_outer:
            return
        ours = {k: float(getattr(self.settings, k)) for k in OUTER_SETTINGS}
        changed = [k for k in ours if k in theirs and float(theirs[k]) != ours[k]]
        if changed:
            self._warned_outer = dict(theirs)
            self.logger.warning(
                "this node's %s differs from the master's (%s): only the master applies the "
                "outer step, so the master's is used; set it on the master to change it",
                " and ".join(changed),
                ", ".join(f"{k} {ours[k]:g} here, {float(theirs[k]):g} there" for k in changed),
            )

    def _claim(self) -> None:
        """Claim this node id in the repository, once per process: a resumed node takes it over,
        a fresh one only while no other process holds it, or the one that did died on this host
        before sending a delta (else it stops, sending nothing).
        """
        if self._claimed:
            return
        held = self.hub.claim_node(self.identity.node_id, self._session, take_over=self._resumed)
        if held is not None:
            self._fatal = self._used_node_id(held)
            raise self._fatal
        self._claimed = True

    def _check_owner(self) -> None:
        """Raise when this node may no longer write: another process claimed its id (or a lane
        found another fatal error). The master calls it before each publish.
        """
        self._check_claim()
        self._raise_fatal()

    def _check_claim(self) -> None:
        """Note a fatal error when another process claimed this node id after this one did."""
        if not self._claimed or self.hub.node_session(self.identity.node_id) in (
            None,  # the claim not readable (yet): only another process's claim stops this one
            self._session,
        ):
            return
        self._fatal = HubError(
            f"another process now runs node {self.identity.node_id!r} in {self.hub.repo_id} (its "
            "deltas have the same names and overwrite this one's): give every node its own "
            "distributed.node_id"
        )

    def _raise_fatal(self) -> None:
        """Raise, on the training thread, the error a lane found no retry or wait can cure."""
        if self._fatal is not None:
            raise self._fatal

    def _stage(self, candidate: GlobalCandidate | None) -> None:
        if candidate is None:
            return
        with self._lock:
            if self._candidate is None or candidate.outer_step > self._candidate.outer_step:
                self._candidate = candidate
        self._staged.set()

    def _take_candidate(self) -> GlobalCandidate | None:
        with self._lock:
            candidate, self._candidate = self._candidate, None
        if candidate is not None and candidate.outer_step <= self._last_global_step:
            return None
        return candidate

    def _on_outer_update(self, state: dict[str, torch.Tensor], outer_step: int) -> None:
        """Master thread callback: stage the freshly published global for the training thread."""
        self._stage(GlobalCandidate(outer_step, state, self.tokenizer))

    def _check_fits(self, candidate: GlobalCandidate) -> None:
        """Raise HubError unless the global model holds exactly the module's entries, shaped alike,
        trained on tokens of this node's tokenizer where both are known.

        An entry the module lacks is refused too: installed, it became part of the baseline and
        the first delta failed mid-training with a misleading KeyError.
        """
        repo = self.hub.repo_id if self.hub is not None else "the repository"
        theirs, ours = candidate.tokenizer, self.tokenizer
        if theirs is not None and ours is not None and not encode_alike(theirs, ours):
            # One id means other text on each side: averaged, the deltas would undo each other's
            # embeddings, and nothing else tells (the shapes agree).
            theirs_text, ours_text = describe_apart(theirs, ours)
            raise HubError(
                f"global model at outer step {candidate.outer_step} in {repo} was trained on "
                f"tokens of {theirs_text}, but this node's data holds tokens of {ours_text}; "
                "prepare this node's data with the run's tokenizer, or give it its own "
                "distributed.repo_id"
            )
        shapes = self.group.state_shapes(self.model)
        missing = sorted(set(shapes) - set(candidate.state))
        extra = sorted(set(candidate.state) - set(shapes))
        wrong = sorted(
            n for n, s in shapes.items() if n in candidate.state and candidate.state[n].shape != s
        )
        for names, what in (
            (missing, "lacks"),
            (extra, "has entries this model lacks:"),
            (wrong, "has other shapes for"),
        ):
            if names:
                raise HubError(
                    f"global model at outer step {candidate.outer_step} in {repo} {what} "
                    f"{names[:5]}: it belongs to a different model; give this node the run's "
                    "model.* settings or its own distributed.repo_id"
                )
        # The master skips a delta of another floating dtype, so a node whose module differs
        # trained on with every delta dropped, and only the master's log said so.
        dtypes = self.group.state_dtypes(self.model)
        other = sorted(
            n
            for n, d in dtypes.items()
            if d.is_floating_point
            and candidate.state[n].dtype.is_floating_point
            and candidate.state[n].dtype != d
        )
        if other:
            name = other[0]
            raise HubError(
                f"global model at outer step {candidate.outer_step} in {repo} is "
                f"{candidate.state[name].dtype} where this model is {dtypes[name]} ({other[:5]}): "
                "the master would skip every delta of this node; give it the master's dtype "
                f"(model.to({candidate.state[name].dtype}))"
            )

    def _install_state(self, candidate: GlobalCandidate | None, outer_step: int) -> None:
        """Load the chosen global model on every rank (candidate None on all but rank 0); rank 0
        also makes it the new baseline (training thread).
        """
        self.group.load(self.model, None if candidate is None else candidate.state)
        self._last_global_step = outer_step
        self._rounds_on_global = 0
        self._generation += 1
        if candidate is None:
            return
        self._baseline = cpu_state_dict(candidate.state)
        self.counters["globals_installed"] += 1
        self.logger.info("installed global model at outer step %d", outer_step)
        self._emit_event(
            "diloco/global_installed",
            {"outer_step": outer_step, "local_step": self._local_step},
        )

    def install_latest_global(self) -> bool:
        """Install a newer published global model now (training thread, every rank of the node);
        return whether one was installed.

        For callers that run synchronous rounds themselves (the master's sync_once between the
        nodes' boundaries); they reset the inner optimizer when this returns True.
        """
        return self._agree(self._newest_candidate)

    def _newest_candidate(self) -> tuple[bool, GlobalCandidate | None]:
        candidate = self._take_candidate() or self._fetch_global_candidate()
        return candidate is not None, candidate

    def _maybe_poll_global(self) -> None:
        """Synchronous mode only: a time-based poll between boundaries (async mode has its own
        lane).
        """
        if (
            self.settings.async_global_poll
            or time.monotonic() - self._last_poll < self.settings.poll_interval
        ):
            return
        self._last_poll = time.monotonic()
        self._stage(self._fetch_global_candidate())

    def _poll_worker(self) -> None:
        while not self._stop_event.wait(self.settings.poll_interval):
            self._stage(self._fetch_global_candidate())

    # -- checkpoint state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return checkpointable state: counters, baseline and every upload not yet acknowledged (no
        token). In a data-parallel node the checkpoint holds rank 0's; the others return steps only.
        """
        if not self.group.is_lead:
            return {
                "node_id": self.identity.node_id,
                "local_step": self._local_step,
                "last_global_step": self._last_global_step,
            }
        # A failed upload whose result waits in the queue is in no list below: the baseline has
        # moved past its steps, so a checkpoint without it would lose them.
        self._collect_upload_results()
        with self._lock:
            pending = [*self._retries, *([self._inflight] if self._inflight else [])]
        if self._uploads is not None:
            pending += [job for job in list(self._uploads.queue) if isinstance(job, DeltaUploadJob)]
        # The lane reports a result just before it clears its in-flight job: count it once.
        pending = list({id(job): job for job in pending}.values())
        return {
            "node_id": self.identity.node_id,
            "local_step": self._local_step,
            "last_global_step": self._last_global_step,
            "baseline": cpu_state_dict(self._baseline) if self._baseline is not None else None,
            "pending_uploads": [job.to_state() for job in pending],
            "counters": dict(self.counters),
            "master": self.master.state_dict() if self.master is not None else None,
        }

    def prepare_state(self, state: dict[str, Any]) -> None:
        """Stage resume state before startup performs any remote refresh."""
        self._prepared = dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore checkpointed state now if started, else at start()."""
        self.prepare_state(state)
        if self._started:
            self._apply_prepared_state()
            self._send_prepared_pending()

    def _apply_prepared_state(self) -> None:
        state, self._prepared = self._prepared, None
        if not state:
            return
        self._resumed = True
        self._local_step = int(state.get("local_step", 0))
        self._last_global_step = int(state.get("last_global_step", -1))
        if not self.group.is_lead:  # every rank reads rank 0's checkpoint; the rest is rank 0's
            return
        if state.get("node_id") not in (None, self.identity.node_id):
            self.logger.warning(
                "checkpoint was written by node %r, resuming as %r",
                state["node_id"],
                self.identity.node_id,
            )
        if state.get("baseline") is not None:
            self._baseline = cpu_state_dict(state["baseline"])
        self.counters.update(state.get("counters") or {})
        legacy = state.get("pending_upload")  # one job, in checkpoints of 2.0 and early 2.1 builds
        self._restore_pending_uploads(state.get("pending_uploads", [legacy] if legacy else []))
        if self.master is not None and state.get("master"):
            self.master.load_state_dict(state["master"])

    def _restore_pending_uploads(self, pending: list[dict[str, Any]]) -> None:
        """Re-send the uploads not acknowledged at checkpoint time under their own names: one that
        had landed is skipped by the master, so nothing counts twice.
        """
        # The checkpointed baseline already excludes these deltas (it moved at dispatch).
        self._prepared_pending = [
            DeltaUploadJob(
                int(job["step"]),
                int(job["base_outer_step"]),
                self._generation,
                cpu_state_dict(job["delta"]),
                {},
            )
            for job in pending
        ]


def _event_sink(events: Any) -> Callable[[str, dict[str, Any]], None] | None:
    """Return the callable that delivers an event: on_event(), the trainer MetricLogger's emit(), or
    events itself.
    """
    for name in ("on_event", "emit"):
        method = getattr(events, name, None)
        if callable(method):
            return method
    return events if callable(events) else None


__all__ = ["DeltaUploadJob", "DumbDiLoCoCoordinator", "GlobalCandidate", "SyncResult"]
