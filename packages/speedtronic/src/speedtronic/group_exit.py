"""How a process that joined a torch.distributed process group ends: without ever destroying it.

A gloo process group's destructor joins its worker threads, and run by DDP's reducer (the
group's last owner while the model lives) it holds the GIL meanwhile. A worker that is still
releasing a finished collective's tensors needs the GIL for their Python objects, so the
destructor can wait forever (a finished run that never exits: seen after the final barrier, the
main thread in ~ProcessGroupGloo joining a worker, that worker waiting for the GIL) or, run
during interpreter teardown, abort ("terminate called without an active exception", SIGABRT;
pytorch#179291) - either way torchrun reports the run failed. So the CLI keeps what holds the
group (the trainer: its wrapped model and optimizer) alive and leaves through exit_process.
(train_from_config, a library call that must return, drops the trainer and destroys the group
itself: speedtronic_systems.parallel.shutdown_parallel.)
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, NoReturn

# What holds this process's process group, kept alive until exit_process ends the process.
_group_owners: list[Any] = []


def hold_process_group(owner: Any) -> None:
    """Keep `owner` (an object holding a process group, such as a data-parallel trainer) alive
    until exit_process: its group is then never destroyed in this process.
    """
    _group_owners.append(owner)


def exit_process(code: int) -> NoReturn:
    """Exit with `code`. When a process group is held, do Python's own exit steps and then end
    the process without the interpreter teardown, which would destroy the group.
    """
    if not _group_owners:
        sys.exit(code)
    # CPython's exit, in its order (Py_FinalizeEx): threading's shutdown (its own exit hooks,
    # which stop the idle workers of thread pools such as torch.compile's, then a join of every
    # non-daemon thread), the atexit handlers (logging's flush among them), the flush of stdout
    # and stderr. Both calls are private, and the same ones the interpreter makes.
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["exit_process", "hold_process_group"]
