"""A torchrun worker for the distributed Muon training tests: trains the data-parallel tests' tiny
run with `optimizer: muon` under DDP, then FSDP2, in one launch.

    torchrun --nproc-per-node 2 tests/speedtronic/parallel_muon_worker.py OUT_DIR

Rank 0 writes OUT_DIR/<mode>.pt: the whole parameters, Muon's whole momentum by parameter name
and how Muon split its work; tests/speedtronic/test_parallel_muon.py compares them with one process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.elastic.multiprocessing.errors import record

from speedtronic import runtime
from speedtronic_optim.distributed_muon import work_split

sys.path.insert(0, str(Path(__file__).parent))
from parallel_worker import config, full_parameters  # noqa: E402

MUON = {"name": "muon", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1e9}


def muon_of(trainer) -> torch.optim.Optimizer:
    return getattr(trainer.optimizer, "base", trainer.optimizer).muon


def full_momentum(trainer) -> dict[str, torch.Tensor]:
    """Muon's momentum by parameter name, whole matrices (FSDP shards gathered), on every rank."""
    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(trainer.model, [muon_of(trainer)], options=options)["state"]
    return {name: entry["momentum_buffer"].clone() for name, entry in state.items()}


def split_kind(trainer) -> str:
    muon = muon_of(trainer)
    split = work_split(muon.param_groups[0]["params"], muon.distributed, muon.process_group)
    return "none" if split is None else "sharded" if split.sharded else "replicated"


@record  # a failing rank's traceback ends torchrun's summary, where a test's tail shows it
def main() -> None:
    out = Path(sys.argv[1])
    for mode in ("ddp", "fsdp"):
        trainer, _ = runtime.build_runtime(config(out / mode, mode, optimizer=MUON))
        trainer.fit()
        seen = {
            "params": full_parameters(trainer),
            "momentum": full_momentum(trainer),
            "split": split_kind(trainer),
        }
        if trainer.parallel.is_main:
            torch.save(seen, out / f"{mode}.pt")
        trainer.close()
        # Drop this mode's wrapped model and optimizer (DDP's reducer holds the process group)
        # on every rank before the next mode, and leave only when every rank is done: a rank
        # that exits first can abort a peer still finishing its last gloo operation.
        del trainer
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip interpreter finalization: about 1 launch in 15 under load, a rank aborted there
    # ("terminate called without an active exception", SIGABRT) after every result was written
    # and the group destroyed, and torchrun reported the run failed. The FSDP2 run's group
    # outlives destroy_process_group (DTensor's caches keep its device mesh), so gloo's
    # threads run into finalization (see shutdown_parallel). The results are flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
