"""Muon under DDP and FSDP2 (torchrun, gloo): the same training as one process, and an FSDP2 Muon
checkpoint resumes in one process (DCP reshards the sharded momentum).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from speedtronic import runtime
from speedtronic_optim import route_parameters

WORKER = Path(__file__).with_name("parallel_muon_worker.py")
sys.path.insert(0, str(WORKER.parent))
from parallel_muon_worker import MUON, full_momentum, muon_of  # noqa: E402
from parallel_worker import config  # noqa: E402


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict:
    """The reference: one process training the same global batches with Muon."""
    out = tmp_path_factory.mktemp("single")
    trainer, _ = runtime.build_runtime(config(out, "none", optimizer=MUON))
    trainer.fit()
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    matrices = len(route_parameters(trainer.model).muon)
    return {"params": params, "momentum": full_momentum(trainer), "matrices": matrices}


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("muon")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(WORKER), str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    # A rank that aborts in C++ (gloo) prints why far above torchrun's summary: show both.
    causes = [line for line in result.stderr.splitlines() if "rror" in line or "terminate" in line]
    assert result.returncode == 0, "\n".join(causes[:20]) + "\n...\n" + result.stderr[-3000:]
    return out


@pytest.mark.parametrize("mode, split", [("ddp", "replicated"), ("fsdp", "sharded")])
def test_two_ranks_train_with_muon_like_one_process(distributed, single_process, mode, split):
    seen = torch.load(distributed / f"{mode}.pt")
    assert seen["split"] == split  # Newton-Schulz was divided over the ranks
    for kind in ("params", "momentum"):
        reference = single_process[kind]
        assert seen[kind].keys() == reference.keys()
        for name, value in reference.items():
            assert (seen[kind][name] - value).abs().max() <= 1e-6, (kind, name)
    assert len(seen["momentum"]) == single_process["matrices"]  # every hidden matrix


# DCP says it loads in one process without a process group: the intent here.
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_an_fsdp_muon_checkpoint_resumes_in_one_process(distributed, tmp_path):
    source = distributed / "fsdp"
    values = config(source, "none", optimizer=MUON, run={"max_steps": 4})
    values["run"]["output_dir"] = str(tmp_path / "run")
    target = tmp_path / "run" / "checkpoints"
    target.mkdir(parents=True)
    with contextlib.suppress(FileExistsError):
        os.symlink(source / "run" / "checkpoints" / "step_3.dcp", target / "step_3.dcp")
    trainer, _ = runtime.build_runtime(values, resume=True)
    assert trainer.step == 3
    saved = torch.load(distributed / "fsdp.pt")["momentum"]
    state = get_optimizer_state_dict(trainer.model, [muon_of(trainer)])["state"]
    assert state.keys() == saved.keys()
    for name, entry in state.items():  # every matrix's momentum, gathered from both ranks' shards
        assert torch.equal(entry["momentum_buffer"], saved[name]), name
    assert trainer.fit().steps == 4
