"""Distributed Muon: the partition and mode rules here, and real torchrun processes (gloo, world
size 2) checking replicated (DDP) and sharded (FSDP2) Muon against one process
(distributed_muon_worker.py: every check of one launch).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.fsdp

from speedtronic_optim import Muon
from speedtronic_optim.distributed_muon import (
    newton_schulz_cost,
    owned_matrices,
    shard_rows,
    work_split,
)

WORKER = Path(__file__).with_name("distributed_muon_worker.py")
VARIANTS = ("fp32", "muon_plus", "polar_express", "bf16_work")
# The checks build FSDP2 models and DTensors through the public API (torch.distributed.fsdp's
# fully_shard, torch.distributed.tensor's Shard): torch 2.6 on. Muon itself needs neither.
NO_PUBLIC_FSDP2 = "the test builds FSDP2 models with torch>=2.6's public fully_shard"
needs_public_fsdp2 = pytest.mark.skipif(
    not hasattr(torch.distributed.fsdp, "fully_shard"), reason=NO_PUBLIC_FSDP2
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    if not hasattr(torch.distributed.fsdp, "fully_shard"):
        pytest.skip(NO_PUBLIC_FSDP2)
    out = tmp_path_factory.mktemp("distributed_muon")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(WORKER), str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    # A rank that aborts in C++ (gloo) prints why far above torchrun's summary: show both.
    causes = [line for line in result.stderr.splitlines() if "rror" in line or "terminate" in line]
    assert result.returncode == 0, "\n".join(causes[:20]) + "\n...\n" + result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_match_one_process(ranks, mode):
    for seen in ranks:
        assert seen["moved"] > 0.01  # the steps are real
        for variant in VARIANTS:  # parameters and momentum after three steps
            assert seen[f"{mode}_{variant}_diff"] <= 1e-6, variant
        # bf16 parameters: one rounding step per update at most (torch's bf16 foreach add rounds
        # differently for strided and contiguous updates), in units of eps * |value|.
        assert seen[f"{mode}_bf16_params_diff"] <= 2 * 3
        # fp16 parameters: bit for bit (the update is added in float32, as torch.optim.Muon's).
        assert seen[f"{mode}_fp16_params_diff"] == 0
        assert seen[f"{mode}_cautious_diff"] <= 1e-6
        # Conv1D-like (in, out) matrices: the transposes of the (out, in) run's.
        assert seen[f"{mode}_transposed_diff"] <= 1e-6


def test_each_replica_orthogonalizes_about_half_the_matrices(ranks):
    assert [seen["ddp_orthogonalized_split"] for seen in ranks] == [4, 4]
    assert [seen["ddp_orthogonalized_auto"] for seen in ranks] == [8, 8]  # plain: not assumed
    assert [seen["ddp_orthogonalized_all"] for seen in ranks] == [8, 8]  # distributed=False
    assert all(seen["ddp_state_entries"] == 8 for seen in ranks)


def test_sharded_state_is_made_up_front_alike_and_other_layouts_are_not_split(ranks):
    for seen in ranks:
        assert seen["fsdp_upfront_state"] and seen["fsdp_state_keys_equal"]
        assert seen["fsdp_state_keys"] == 8
        assert seen["fsdp_other_layout_warned"] and seen["fsdp_other_layout_refused"]


def test_a_sharded_step_makes_two_all_to_alls_and_no_redistribution(ranks):
    for seen in ranks:
        assert seen["fsdp_step_collectives"] == {"c10d.alltoall_base_": 2}


def test_sharded_checkpoints_resume_exactly_and_fully_shard_models_train(ranks):
    for seen in ranks:
        assert seen["dcp_resume_diff"] == 0.0
        assert seen["fully_shard_moved"] > 0.01 and seen["fully_shard_diff"] <= 1e-6


def test_owners_are_balanced_by_cost_and_deterministic():
    shapes = [(64, 64)] * 6 + [(64, 256)] * 3 + [(8, 8)] * 5
    owned = owned_matrices(shapes, 4)
    assert sorted(i for share in owned for i in share) == list(range(len(shapes)))
    loads = [sum(newton_schulz_cost(shapes[i]) for i in share) for share in owned]
    # Greedy onto the least-loaded rank: no rank ends more than one matrix above another.
    assert max(loads) - min(loads) <= max(map(newton_schulz_cost, shapes))
    assert owned_matrices(list(shapes), 4) == owned  # any rank computes the same split
    assert owned_matrices([(4, 4)] * 8, 2) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert owned_matrices([(4, 4)], 3) == ((0,), (), ())


@pytest.mark.parametrize("rows, world", [(16, 2), (5, 2), (1, 2), (7, 4), (5, 4)])
def test_shard_rows_follow_torch_chunk(rows, world):
    chunks = torch.arange(rows).chunk(world)
    for rank in range(world):
        expected = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(range(*shard_rows(rows, world, rank))) == expected


def test_without_a_process_group_muon_runs_alone():
    params = [torch.nn.Parameter(torch.randn(4, 6))]
    assert all(work_split(params, mode) is None for mode in (None, True, False))
    params[0].grad = torch.randn(4, 6)
    Muon(params, distributed=True).step()  # a world of one: nothing distributed happens


def test_copies_keep_the_split_mode():
    optimizer = Muon([torch.nn.Parameter(torch.randn(4, 6))], distributed=False)
    assert copy.deepcopy(optimizer).distributed is False  # torch pickles groups and state only


@pytest.fixture
def world_of_one(tmp_path):
    """A one-rank gloo process group in this process (destroyed after the test)."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@needs_public_fsdp2
@pytest.mark.parametrize("mode", [None, False])
def test_plain_and_sharded_matrices_of_one_shape_step_together(world_of_one, mode):
    # A partly FSDP2-wrapped model: torch.stack refuses a DTensor batched with a plain tensor.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    weights, grads = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    mixed = [
        torch.nn.Parameter(distribute_tensor(weights[0].clone(), mesh, [Shard(0)])),
        torch.nn.Parameter(weights[1].clone()),
    ]
    plain = [torch.nn.Parameter(weight.clone()) for weight in weights]
    mixed[0].grad = distribute_tensor(grads[0].clone(), mesh, [Shard(0)])
    mixed[1].grad = grads[1].clone()
    for param, grad in zip(plain, grads, strict=True):
        param.grad = grad.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto mode warns that it does not split a mixed group
        # weight_decay: its factor is a tensor, which DTensors take as a replicated scalar.
        Muon(mixed, lr=0.1, weight_decay=0.1, ns_dtype=torch.float32, distributed=mode).step()
    Muon(plain, lr=0.1, weight_decay=0.1, ns_dtype=torch.float32).step()
    torch.testing.assert_close(mixed[0].full_tensor(), plain[0].detach())
    torch.testing.assert_close(mixed[1].detach(), plain[1].detach())
