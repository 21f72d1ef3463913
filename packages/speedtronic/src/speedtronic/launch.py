"""`speedtronic train ... --nproc-per-node N` hands the run over to torchrun's own launcher.

torchrun (torch.distributed.run) starts the workers, runs the c10d rendezvous across nodes and
restarts them on failure (--max-restarts); each worker runs `python -m speedtronic train` with the
same arguments minus these launcher flags.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from speedtronic.errors import RUNTIME_ERROR, USAGE_ERROR, UsageError, print_line, signal_exit_code
from speedtronic.launcher_watch import LAUNCHER_ENV
from speedtronic.worker_exits import (
    PEER,
    RECORDS_ENV,
    TERMINATED,
    preempted_exit_code,
    rank_outcomes,
    read_records,
    root_causes,
    stop_said,
)

# Launcher flag -> whether it takes a value.
LAUNCH_FLAGS = {"--nproc-per-node": True, "--nnodes": True, "--rdzv-endpoint": True}
LAUNCH_FLAGS["--max-restarts"] = True
LAUNCH_FLAGS["--shutdown-timeout"] = True
# Seconds torchrun gives the workers to stop after passing a signal on, before it kills them: its
# own 30 s cut off a DiLoCo master's last outer round under a flaky Hub, and a large model's
# checkpoint can outlast it too. A DiLoCo node adds the time its upload lanes may take to empty.
STOP_GRACE_S = 120
# A stop line's end where this launch wrote no checkpoint (none is there, or an earlier run's).
_NONE_OF_THIS_RUN = "no checkpoint of this run was written"


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the launcher flags to the train command."""
    group = parser.add_argument_group("data-parallel launch (hands over to torchrun)")
    group.add_argument(
        "--nproc-per-node", type=int, metavar="N", help="processes on this node (e.g. its GPUs)"
    )
    group.add_argument(
        "--nnodes", default="1", metavar="M", help="nodes, or MIN:MAX for elastic (default 1)"
    )
    group.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="c10d rendezvous address, reachable from every node (multi-node; port default 29400)",
    )
    group.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart the workers up to K times after a failure; they resume from the last "
        "checkpoint",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=int,
        metavar="SECONDS",
        help=f"after a signal, kill the workers still stopping this long after it (default "
        f"{STOP_GRACE_S}, plus distributed.delta_upload_shutdown_timeout on a DiLoCo node)",
    )


def refuse_launch_flags_alone(args: argparse.Namespace) -> None:
    """Raise UsageError for launcher flags without --nproc-per-node (one process would train)."""
    given = [
        flag
        for flag, value in [
            ("--nnodes", args.nnodes != "1"),
            ("--rdzv-endpoint", args.rdzv_endpoint),
            ("--max-restarts", args.max_restarts),
            ("--shutdown-timeout", args.shutdown_timeout is not None),
        ]
        if value
    ]
    if given and args.nproc_per_node is None:
        raise UsageError(
            f"{', '.join(given)} launch workers through torchrun and need --nproc-per-node N "
            "(the processes on this node, e.g. 1 per GPU)"
        )


def worker_arguments(argv: Sequence[str]) -> list[str]:
    """Return argv without the launcher flags (and their values)."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in LAUNCH_FLAGS:
            skip = "=" not in token and LAUNCH_FLAGS[name]
            continue
        out.append(token)
    return out


def launch_world_sizes(args: argparse.Namespace) -> list[int]:
    """Return every world size this launch can have: --nproc-per-node times each node count
    --nnodes allows (N, or MIN:MAX for an elastic job).
    """
    low, _, high = str(args.nnodes).partition(":")
    try:
        counts = range(int(low), int(high or low) + 1)
    except ValueError:
        counts = range(0)
    if not counts or counts.start < 1:
        raise UsageError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got {args.nnodes}")
    return [args.nproc_per_node * count for count in counts]


def check_launch(config: Any, args: argparse.Namespace) -> None:
    """Raise ConfigError (DeviceError for the device) for a config every worker of this launch
    would refuse, at any world size it can have, before a worker starts: one line instead of one
    per worker and a torchrun trace.
    """
    from speedtronic.preflight import check_init_tokenizer, check_output_paths
    from speedtronic.runtime import check_node_group_wait
    from speedtronic_config import ConfigError
    from speedtronic_data import build_dataloader, build_eval_dataloader
    from speedtronic_data.rank_shares import check_rank_shares
    from speedtronic_systems.parallel import check_batch_split, check_world_size

    for world_size in launch_world_sizes(args):
        try:
            check_world_size(config.parallel, world_size)
            check_batch_split(
                config.data.target_batch_size, config.data.micro_batch_size, world_size
            )
        except ConfigError as error:  # both checks name no value: path, problem, fix
            # Say where the world size comes from (with MIN:MAX, it may be a later resize).
            nodes = f"{world_size // args.nproc_per_node} node(s) x {args.nproc_per_node}"
            problem = f"{error.problem} (--nnodes {args.nnodes}: {nodes} processes)"
            raise ConfigError(error.path, problem, allowed=error.allowed) from None
    check_worker_device(config, args.nproc_per_node)
    if config.parallel.data_parallel != "none":  # a DiLoCo node is then a group of ranks
        check_node_group_wait(config)
    check_init_tokenizer(config)
    # A rank's share of the data holds a batch: it shrinks as the world grows, so the largest
    # world size this launch can have decides (one build of the loaders, not one per size).
    shares = {"rank": 0, "world_size": max(launch_world_sizes(args))}
    check_rank_shares(
        build_dataloader(config.data, **shares), build_eval_dataloader(config.data, **shares)
    )
    check_output_paths(config)  # as every worker would, before its first step


def check_worker_device(config: Any, workers: int) -> None:
    """Raise DeviceError or ConfigError for a device or process-group backend this node's
    `workers` could not use, as each worker would resolve them.
    """
    from speedtronic_systems import resolve_device
    from speedtronic_systems.parallel import resolve_backend, worker_device

    device = resolve_device(config.run.device)
    if config.parallel.data_parallel != "none":  # else no worker joins a group
        worker_device(device, workers - 1)  # the last worker asks for the highest GPU index
        resolve_backend(config.parallel.backend, device)


def check_rdzv_endpoint(endpoint: str) -> None:
    """Raise UsageError for a rendezvous endpoint torchrun would refuse, or whose host does not
    resolve (c10d would retry it for minutes). A bare HOST is torchrun's HOST:29400.
    """
    import socket

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import DEFAULT_PORT
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    fix = "give HOST:PORT reachable from every node"
    try:
        host, port = parse_rendezvous_endpoint(endpoint, default_port=DEFAULT_PORT)
    except ValueError as error:  # torch's sentence, e.g. "The port number ... must be ..."
        reason = str(error).rstrip(".")
        reason = reason[:1].lower() + reason[1:]
        raise UsageError(f"--rdzv-endpoint {endpoint}: {reason}; {fix}") from None
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):  # UnicodeError: a label IDNA cannot encode
        raise UsageError(f"--rdzv-endpoint {endpoint}: host not found; {fix}") from None


def check_launch_flags(args: argparse.Namespace) -> None:
    """Raise UsageError for launcher flags torchrun would refuse, or hang on."""
    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.shutdown_timeout is not None:
        if args.shutdown_timeout < 0:
            raise UsageError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
        if not torchrun_has_shutdown_timeout():
            import torch

            raise UsageError(
                f"--shutdown-timeout needs a newer torch: torchrun in torch {torch.__version__} "
                "always kills the workers 30 s after a signal"
            )
    launch_world_sizes(args)  # a bad --nnodes, before what it needs
    if args.rdzv_endpoint:
        check_rdzv_endpoint(args.rdzv_endpoint)
    elif args.nnodes != "1":
        raise UsageError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)"
        )


def torchrun_has_shutdown_timeout() -> bool:
    """Return whether this torch's torchrun takes --shutdown-timeout (older ones wait 30 s)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    return any(field.name == "shutdown_timeout" for field in dataclasses.fields(LaunchConfig))


def shutdown_timeout(config: Any, requested: int | None) -> int:
    """Return the seconds torchrun lets the workers stop after a signal: `requested`
    (--shutdown-timeout), else STOP_GRACE_S and a DiLoCo node's upload-lane wait.
    """
    if requested is not None:
        return requested
    lanes = config.distributed.delta_upload_shutdown_timeout if config.distributed.active else 0
    return STOP_GRACE_S + math.ceil(lanes)


def torchrun_arguments(
    args: argparse.Namespace, argv: Sequence[str], grace_s: int | None
) -> list[str]:
    """Return torchrun's command line for this train invocation (flags checked by
    check_launch_flags); grace_s is its --shutdown-timeout, None to keep torchrun's 30 s.
    """
    launcher = [f"--nproc-per-node={args.nproc_per_node}", f"--max-restarts={args.max_restarts}"]
    if grace_s is not None:
        launcher.append(f"--shutdown-timeout={grace_s}")
    if args.rdzv_endpoint:
        launcher += [
            f"--nnodes={args.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={args.rdzv_endpoint}",
        ]
    else:
        launcher.append("--standalone")
    return [*launcher, "-m", "speedtronic", *worker_arguments(argv)]


def launch(args: argparse.Namespace, argv: Sequence[str], config: Any) -> int:
    """Check `config` against the launch, then run torchrun with this invocation's workers;
    return 0, the signal exit code when a signal stopped the group (143 for SIGTERM), 2 when
    every worker that failed on its own refused a setting, else 1 (with one line naming them).
    """
    from speedtronic.preflight import NewOutputs

    check_launch_flags(args)
    outputs = NewOutputs(config)
    with outputs.removed_on_error():
        check_launch(config, args)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # args.shutdown_timeout stays what the user asked for (None: not given), as the resume
    # command repeats it; grace_s is what torchrun gets, None where it takes no such flag.
    grace_s = (
        shutdown_timeout(config, args.shutdown_timeout) if torchrun_has_shutdown_timeout() else None
    )
    agent_lines = _ExplainedWorkerExits()
    saved_before = latest_checkpoint(config)
    records = tempfile.mkdtemp(prefix="speedtronic-exits-")  # what each worker exits for
    try:
        # Each worker also learns the launcher's pid, to stop itself if the launcher is gone.
        workers_env = {RECORDS_ENV: records, LAUNCHER_ENV: str(os.getpid())}
        with _quiet_agent_lines(agent_lines), _worker_env(workers_env):
            try:
                run(parse_args(torchrun_arguments(args, argv, grace_s)))
            except UnboundLocalError as masked:
                # torch's elastic metrics wrapper (metrics.api.prof) reads `start` in a finally: a
                # signal landing before it is set raises this over the SignalException.
                if isinstance(masked.__context__, SignalException):
                    raise masked.__context__ from None
                raise
    except SignalException as stop:  # the launcher was signalled; torchrun passed it on
        name = signal.Signals(stop.sigval).name
        if agent_lines.killed:
            print_line(killed_line(config, saved_before, args, name, agent_lines.killed, grace_s))
        elif not stop_said(read_records(records)):  # no worker was in its loop to say it
            print_line(unhandled_stop_line(config, saved_before, args, f"stopped by {name}"))
        return signal_exit_code(name)
    except ChildFailedError as failure:
        notes = read_records(records)
        exits = {rank: (info.exitcode, info.pid) for rank, info in failure.failures.items()}
        outcomes = rank_outcomes(exits, notes)
        stopped = preempted_exit_code(outcomes)
        if stopped is not None:
            if not stop_said(notes):  # a worker SIGTERM ended outside its loop said nothing
                who = "a worker was stopped by SIGTERM"
                print_line(unhandled_stop_line(config, saved_before, args, who))
            return stopped
        # Each rank that failed on its own said which setting to fix: exit as one process does.
        if set(root_causes(outcomes).values()) == {USAGE_ERROR}:
            outputs.remove()  # each refused before its first step: what check_launch made
            return USAGE_ERROR
        print_line(failed_line(outcomes))
        return RUNTIME_ERROR
    finally:
        shutil.rmtree(records, ignore_errors=True)
    return 0


@contextlib.contextmanager
def _worker_env(values: dict[str, str]) -> Iterator[None]:
    """Set these environment variables for the workers torchrun starts, then restore them."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def latest_checkpoint(config: Any) -> tuple[Any, int] | None:
    """Return the run's latest checkpoint and when its pointer was written, else None."""
    from speedtronic_trainer import CheckpointManager

    checkpoints = CheckpointManager.from_config(config.checkpoint, output_dir=config.run.output_dir)
    with contextlib.suppress(OSError):  # unreadable: as good as none
        latest = checkpoints.latest_path()
        if latest is not None:
            return latest, latest.stat().st_mtime_ns
    return None


def unhandled_stop_line(
    config: Any, saved_before: tuple[Any, int] | None, args: argparse.Namespace, stopped: str
) -> str:
    """Return the launcher's line on a signal stop no worker said (`stopped`: what was stopped
    by which signal): none was in its training loop, which checkpoints and says so. With no
    checkpoint written since the launch where the loop would have saved a final one, it came
    before training started. A latest checkpoint at the step target leaves nothing to resume.
    """
    saved = latest_checkpoint(config)
    section = config.checkpoint
    handled = section.save_on_signal  # else the loop too dies of the signal, saying nothing
    if saved == saved_before and section.enabled and section.save_final and handled:
        return f"speedtronic train: {stopped} before training started: nothing was saved"
    when = "outside the training steps" if handled else "(checkpoint.save_on_signal: false)"
    if saved is None or saved == saved_before:
        return f"speedtronic train: {stopped} {when}; {_NONE_OF_THIS_RUN}"
    then = _what_next(config, args, saved)  # e.g. signalled after the last step: nothing
    return f"speedtronic train: {stopped} {when}; {then}"


def _what_next(config: Any, args: argparse.Namespace, saved: tuple[Any, int] | None) -> str:
    """Return the latest checkpoint `saved` (see latest_checkpoint) and what to do after a stop:
    resume, unless that checkpoint is at the step target.
    """
    from speedtronic.runtime import step_target
    from speedtronic.train_end import TARGET_REACHED, resume_command
    from speedtronic_trainer.checkpoint import checkpoint_step

    resume = f"resume with: {resume_command(args)}"
    if saved is None:
        return resume
    target = step_target(config, args.max_steps)  # as the workers' build_runtime takes it
    then = TARGET_REACHED if (checkpoint_step(saved[0]) or 0) >= target else resume
    return f"latest checkpoint: {saved[0]}; {then}"


def failed_line(outcomes: dict[int, int | str]) -> str:
    """Return the launcher's line on a failed group (`outcomes`: see
    speedtronic.worker_exits.rank_outcomes): first the ranks that failed on their own, with the
    code each noted (else torchrun's), then those that only stopped for them (or finished, and
    then their process did not end cleanly).
    """

    def ranks(which: list[int]) -> str:
        return f"rank {which[0]}" if len(which) == 1 else f"ranks {', '.join(map(str, which))}"

    causes = sorted(root_causes(outcomes).items())
    own = ", ".join(f"rank {rank} (exit code {code})" for rank, code in causes)
    parts = [own] if own else []
    for said, what in (
        (PEER, "stopped because another rank failed"),
        (TERMINATED, "terminated by torchrun"),
        (0, "finished but did not exit cleanly"),
    ):
        which = sorted(rank for rank, outcome in outcomes.items() if outcome == said)
        if which:
            parts.append(f"{ranks(which)} {what}")
    failed = "; ".join(parts)
    return f"speedtronic train: data-parallel workers failed: {failed}; see their errors above"


def killed_line(
    config: Any,
    saved_before: tuple[Any, int] | None,
    args: argparse.Namespace,
    signal_name: str,
    killed: int,
    grace_s: int | None,
) -> str:
    """Return the launcher's line on `killed` workers torchrun ended with SIGKILL because they
    were still stopping when its shutdown timeout (grace_s; None: torchrun's fixed 30 s) ran out
    (rank 0 may not have said anything); a latest checkpoint at the step target leaves nothing
    to resume. A fresh run's latest checkpoint that is still `saved_before` (the latest at its
    launch) is an earlier run's, beside it: neither its step nor a resume from it is this run's.
    """
    if grace_s is None:  # a torch without the flag
        longer = "a newer torch's torchrun takes --shutdown-timeout SECONDS"
        waited = 30
    else:
        longer = "give them longer with --shutdown-timeout SECONDS"
        waited = grace_s
    saved = latest_checkpoint(config)
    if saved == saved_before and not args.resume:  # none, or an earlier run's
        then = _NONE_OF_THIS_RUN
    else:
        then = _what_next(config, args, saved)
    return (
        f"speedtronic train: torchrun killed {killed} worker(s) still stopping {waited} s after "
        f"the {signal_name}, perhaps mid-checkpoint (the one before stays intact); {longer}; "
        f"{then}"
    )


class _ExplainedWorkerExits(logging.Filter):
    """Drop torchrun's lines on what the workers' own lines already say: a worker that exited
    refusing a setting or stopped by a signal (it printed why and how to resume), the SIGTERM
    torchrun then sends the rest, and the signal the launcher got and passed on (the workers'
    stop line names it). Any other exit keeps torchrun's line. Once the launcher is
    signalled, a worker torchrun killed for outlasting the shutdown timeout is counted in
    `killed`, for the launcher's own line (a kill on a restart or after a failure keeps
    torchrun's).
    """

    # The agent's line as it passes the launcher's signal on, before it stops the workers.
    SIGNALLED = "Received %s death signal, shutting down workers"

    EXPLAINED = {USAGE_ERROR, signal_exit_code("SIGTERM"), signal_exit_code("SIGINT")}

    def __init__(self) -> None:
        super().__init__()
        self.signalled = False
        self.killed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.SIGNALLED:
            self.signalled = True
            return False
        if record.msg == "Sending process %s closing signal %s":
            return False
        if self.signalled and str(record.msg).startswith("Unable to shutdown process %s via %s"):
            self.killed += 1
            return False
        exited = str(record.msg).startswith("failed (exitcode: %s)")
        return not (exited and isinstance(record.args, tuple) and record.args[0] in self.EXPLAINED)


@contextlib.contextmanager
def _quiet_agent_lines(quiet: _ExplainedWorkerExits) -> Iterator[None]:
    """While torchrun runs, keep its worker-exit lines to those no worker explained."""
    loggers = [
        logging.getLogger(f"torch.distributed.elastic.{name}")
        for name in ("multiprocessing.api", "agent.server.api")
    ]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


__all__ = [
    "add_launch_arguments",
    "check_launch",
    "check_launch_flags",
    "check_rdzv_endpoint",
    "check_worker_device",
    "failed_line",
    "killed_line",
    "launch",
    "latest_checkpoint",
    "launch_world_sizes",
    "shutdown_timeout",
    "torchrun_arguments",
    "torchrun_has_shutdown_timeout",
    "unhandled_stop_line",
    "worker_arguments",
]
