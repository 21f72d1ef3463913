"""The data-parallel helpers that need no process group: choices, checks and clear errors.

Real multi-process runs (DDP, FSDP2 under torchrun) are tests/speedtronic/test_parallel.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from speedtronic_config import ConfigError
from speedtronic_systems.parallel import (
    SINGLE,
    ParallelContext,
    check_batch_split,
    elastic_restarts,
    gradient_sync,
    init_parallel,
    resolve_backend,
    total_norm,
    transformer_blocks,
    unwrap_model,
    worker_device,
    wrap_model,
)

needs_fsdp_torch = pytest.mark.skipif(
    torch.__version__ < (2, 7), reason="fsdp needs torch>=2.7 (its refusal is tested below)"
)


def test_a_plain_run_needs_no_process_group_and_its_collectives_are_identities():
    assert init_parallel(None, torch.device("cpu")) is SINGLE
    assert SINGLE.all_reduce_sum([1.5, 2.0]) == [1.5, 2.0] and SINGLE.any(True)
    assert SINGLE.all_gather_object({"a": 1}) == [{"a": 1}] and SINGLE.broadcast_object(3) == 3
    assert SINGLE.is_main and not SINGLE.active and SINGLE.disagreement("fp32") is None
    assert SINGLE.disagreements({"precision": "fp32", "steps": 4}) == {}


def test_several_processes_without_a_data_parallel_mode_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"parallel.data_parallel: is none, but 2 processes"):
        init_parallel({"data_parallel": "none"}, torch.device("cpu"))


def test_torchruns_restart_counts_read_as_made_and_allowed(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    assert elastic_restarts() == (0, 0)  # outside torchrun
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert elastic_restarts() == (1, 3)


def test_the_backend_follows_the_device_and_an_unusable_one_is_named():
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    with pytest.raises(ConfigError, match="parallel.backend: nccl"):
        resolve_backend("nccl", torch.device("cpu"))
    with pytest.raises(ConfigError, match="parallel.backend"):
        init_parallel({"data_parallel": "ddp", "backend": "tcp"}, torch.device("cpu"))


def test_each_worker_takes_its_own_gpu_and_a_node_short_of_gpus_is_one_line(monkeypatch):
    from speedtronic_systems.precision import DeviceError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_device(torch.device("cpu"), 5) == torch.device("cpu")
    assert worker_device(torch.device("cuda"), 1) == torch.device("cuda", 1)
    with pytest.raises(
        DeviceError, match=r"^worker 2 of this node needs cuda:2, but the node has 2 "
    ):
        worker_device(torch.device("cuda"), 2)
    monkeypatch.setenv("LOCAL_RANK", "3")  # init_parallel refuses it before touching the GPU
    with pytest.raises(DeviceError, match=r"set --nproc-per-node to at most 2$"):
        init_parallel({"data_parallel": "ddp"}, torch.device("cuda"))


@pytest.mark.parametrize("target, micro, world", [(8, 2, 3), (8, 4, 4), (6, 2, 2)])
def test_a_target_batch_that_does_not_split_over_the_ranks_is_refused(target, micro, world):
    with pytest.raises(ConfigError, match=f"data.target_batch_size: {target} does not split"):
        check_batch_split(target, micro, world)


def test_the_refusal_names_a_microbatch_that_keeps_the_global_batch():
    with pytest.raises(ConfigError, match=r"or keep it with data.micro_batch_size: 8 \(8 per rank"):
        check_batch_split(16, 16, 2)  # the main job's batch on two ranks
    with pytest.raises(ConfigError) as refused:
        check_batch_split(8, 2, 3)  # 8 rows do not split over 3 ranks at all
    assert "keep it" not in str(refused.value)


def test_a_target_batch_that_splits_is_accepted():
    check_batch_split(16, 2, 4)
    check_batch_split(3, 3, 1)  # one process: anything the config accepts


@needs_fsdp_torch
def test_fsdp_needs_blocks_to_shard():
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

    fsdp = ParallelContext("fsdp", 0, 2)
    with pytest.raises(ConfigError, match="fsdp needs blocks to shard, and Flat has no"):
        wrap_model(Flat(), fsdp, {"data_parallel": "fsdp"})

    class Units(Flat):
        def fsdp_units(self):
            return [self.linear]

    assert len(transformer_blocks(Units())) == 1
    stack = nn.Module()
    stack.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert len(transformer_blocks(stack)) == 2


@pytest.mark.parametrize("version", ["2.4.1+cu121", "2.6.0"])
def test_fsdp_on_a_torch_older_than_2_7_is_refused_in_one_line(monkeypatch, version):
    # torch 2.4 and 2.5 failed at wrapping with "cannot import name 'MixedPrecisionPolicy'".
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
    message = f"is fsdp, which needs torch>=2.7 .*this is torch {re.escape(version)}"
    with pytest.raises(ConfigError, match=message):
        init_parallel({"data_parallel": "fsdp"}, torch.device("cpu"))
    with pytest.raises(ConfigError, match=message):
        wrap_model(nn.Linear(2, 2), ParallelContext("fsdp", 0, 2), {"data_parallel": "fsdp"})


def test_a_plain_model_is_left_alone():
    model = nn.Linear(3, 3)
    assert wrap_model(model, SINGLE, None) is model and unwrap_model(model) is model
    with gradient_sync(model, enabled=False):
        model(torch.ones(1, 3)).sum().backward()
    assert model.weight.grad is not None
    assert total_norm(torch.tensor(2.5)) == 2.5


@needs_fsdp_torch
def test_fsdp_wraps_a_model_whose_state_dict_holds_extra_state():
    # wrap_model gives every rank rank 0's weights; a module's get_extra_state() entry (any
    # object, as TransformerEngine layers keep) is no weight to broadcast. An in-process fake
    # group of two ranks runs the real wrapping; its collectives do nothing.
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    import torch.distributed as dist

    class Block(nn.Linear):
        def get_extra_state(self):
            return {"recipe": "delayed"}

        def set_extra_state(self, state):
            pass

    model = nn.Module()
    model.layers = nn.ModuleList([Block(4, 4), Block(4, 4)])
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        wrap_model(model, ParallelContext("fsdp", 0, 2), {"data_parallel": "fsdp"})
    finally:
        dist.destroy_process_group()
    assert "layers.0._extra_state" in model.state_dict()
