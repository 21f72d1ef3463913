from __future__ import annotations

import copy
import io
from types import SimpleNamespace

import pytest
import torch

from speedtronic_optim import (
    CautiousOptimizer,
    HybridOptimizer,
    build_lr_scheduler,
    route_parameters,
)


def _hybrid(model: torch.nn.Module, **overrides) -> HybridOptimizer:
    routing = route_parameters(model)
    settings = dict(muon_lr=0.02, adamw_lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    settings.update(overrides)
    return HybridOptimizer(routing.muon, routing.adamw, **settings)


def test_both_branches_update_and_scheduler_drives_both(tiny_lm, lm_loss) -> None:
    optimizer = _hybrid(tiny_lm)
    scheduler = build_lr_scheduler(
        optimizer, SimpleNamespace(name="constant", warmup_steps=4, max_steps=10, min_lr_ratio=0.0)
    )
    before = {n: p.detach().clone() for n, p in tiny_lm.named_parameters()}
    lm_loss(tiny_lm).backward()
    optimizer.step()
    scheduler.step()
    assert not torch.equal(before["blocks.0.qkv.weight"], tiny_lm.blocks[0].qkv.weight)
    assert not torch.equal(before["wte.weight"], tiny_lm.wte.weight)
    lrs = [group["lr"] for group in optimizer.param_groups]
    assert lrs == pytest.approx([0.02 * 0.5, 1e-3 * 0.5])
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.01)
    assert set(optimizer.state) == {p for p in tiny_lm.parameters()}


def test_closure_called_once(tiny_lm, lm_loss) -> None:
    optimizer = _hybrid(tiny_lm)
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        optimizer.zero_grad()
        loss = lm_loss(tiny_lm)
        loss.backward()
        return loss

    assert isinstance(optimizer.step(closure), torch.Tensor) and calls == [1]


def test_all_linear_model_builds_no_empty_adamw() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    )
    optimizer = _hybrid(model)
    assert optimizer.adamw is None and set(optimizer.children) == {"muon"}
    with pytest.raises(ValueError, match="no parameters"):
        HybridOptimizer(
            [], [], muon_lr=1.0, adamw_lr=1.0, betas=(0.9, 0.9), eps=1e-8, weight_decay=0.0
        )


def test_state_dict_round_trip_continues_identically(tiny_lm, lm_loss) -> None:
    optimizer = _hybrid(tiny_lm)
    lm_loss(tiny_lm).backward()
    optimizer.step()
    twin = copy.deepcopy(tiny_lm)
    twin_optimizer = _hybrid(twin)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for model, opt in ((tiny_lm, optimizer), (twin, twin_optimizer)):
        opt.zero_grad()
        lm_loss(model, seed=1).backward()
        opt.step()
    for a, b in zip(tiny_lm.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert twin_optimizer.param_groups[0] is twin_optimizer.muon.param_groups[0]


@pytest.mark.parametrize("cautious", [False, True])
def test_copies_and_pickles_continue_identically(tiny_lm, lm_loss, cautious: bool) -> None:
    # As torch's optimizers: copied or pickled with its model, the copy trains on alike.
    optimizer = _hybrid(tiny_lm)
    optimizer = CautiousOptimizer(optimizer) if cautious else optimizer
    lm_loss(tiny_lm).backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save((tiny_lm, optimizer), buffer)
    buffer.seek(0)
    copies = [copy.deepcopy((tiny_lm, optimizer)), torch.load(buffer, weights_only=False)]
    for model, opt in [(tiny_lm, optimizer), *copies]:
        opt.zero_grad()
        lm_loss(model, seed=1).backward()
        opt.step()
    for model, opt in copies:
        assert type(opt) is type(optimizer) and len(opt.state) == len(optimizer.state)
        for a, b in zip(tiny_lm.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(a, b)


def test_load_rejects_adamw_only_state(tiny_lm, lm_loss) -> None:
    optimizer = _hybrid(tiny_lm)
    adamw_only = torch.optim.AdamW(tiny_lm.parameters()).state_dict()
    with pytest.raises(ValueError, match="different optimizer setup"):
        optimizer.load_state_dict(adamw_only)


@pytest.mark.parametrize("cautious", [False, True])
def test_state_is_a_live_view_that_clear_resets(tiny_lm, lm_loss, cautious: bool) -> None:
    # DiLoCo resets the inner optimizer with optimizer.state.clear(): it must reach both children.
    from speedtronic_optim import CautiousOptimizer

    hybrid = _hybrid(tiny_lm)
    optimizer = CautiousOptimizer(hybrid) if cautious else hybrid
    lm_loss(tiny_lm).backward()
    optimizer.step()
    assert len(hybrid.muon.state) > 0 and len(hybrid.adamw.state) > 0
    param = next(iter(optimizer.state))
    assert optimizer.state[param] is (hybrid.muon.state.get(param) or hybrid.adamw.state[param])
    optimizer.state.clear()
    assert len(hybrid.muon.state) == len(hybrid.adamw.state) == len(optimizer.state) == 0
    lm_loss(tiny_lm).backward()
    optimizer.step()  # steps again from fresh moments
    assert len(optimizer.state) == sum(1 for _ in tiny_lm.parameters())


def test_add_param_group_is_refused_not_dropped() -> None:
    hybrid = HybridOptimizer(
        [torch.nn.Parameter(torch.randn(4, 4))], [torch.nn.Parameter(torch.zeros(4))]
    )
    with pytest.raises(TypeError, match=r"optimizer.adamw.add_param_group"):
        hybrid.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    with pytest.raises(TypeError, match=r"optimizer.muon.add_param_group"):
        CautiousOptimizer(hybrid).add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert len(hybrid.param_groups) == 2
    with pytest.raises(TypeError, match="HybridOptimizer muon_distributed"):
        HybridOptimizer([torch.nn.Parameter(torch.randn(4, 4))], [], muon_distributed="no")


def test_a_parameter_in_both_branches_or_a_bare_tensor_is_refused() -> None:
    shared = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"1 parameter\(s\) are in both muon_params and adamw"):
        HybridOptimizer([shared], [shared, torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(TypeError, match=r"muon_params: .*got a single tensor of shape \(4, 4\)"):
        HybridOptimizer(shared, [])
    # ... in param groups too (a generator of params is read once, for the check and the build)
    with pytest.raises(ValueError, match=r"1 parameter\(s\) are in both muon_params and adamw"):
        HybridOptimizer([{"params": [shared]}], [{"params": iter([shared])}])
    other = torch.nn.Parameter(torch.randn(4, 4))
    built = HybridOptimizer([{"params": iter([shared]), "lr": 0.01}], [{"params": iter([other])}])
    assert [len(group["params"]) for group in built.param_groups] == [1, 1]


def test_a_process_group_that_is_not_one_is_refused_when_built() -> None:
    with pytest.raises(TypeError, match="HybridOptimizer muon_process_group: expected a torch"):
        HybridOptimizer([torch.nn.Parameter(torch.randn(4, 4))], [], muon_process_group="world")


@pytest.mark.parametrize("cautious", [False, True])
def test_state_dict_hooks_run_as_on_torch_optimizers(tiny_lm, lm_loss, cautious: bool) -> None:
    # torch.optim's register_(load_)state_dict_*_hook: accepted by the facades, and never run.
    opt = CautiousOptimizer(_hybrid(tiny_lm)) if cautious else _hybrid(tiny_lm)
    calls = []
    opt.register_state_dict_pre_hook(lambda optimizer: calls.append("save pre"))
    opt.register_state_dict_post_hook(lambda optimizer, state: {**state, "extra": 1})
    opt.register_load_state_dict_pre_hook(
        lambda optimizer, state: {key: value for key, value in state.items() if key != "extra"}
    )
    opt.register_load_state_dict_post_hook(lambda optimizer: calls.append("load post"))
    state = opt.state_dict()
    assert state["extra"] == 1 and calls == ["save pre"]
    opt.load_state_dict(state)  # the pre hook drops "extra", which check_keys would refuse
    assert calls == ["save pre", "load post"]


def test_state_of_a_parameter_not_stepped_yet_reads_as_torch_optimizers_do() -> None:
    # torch.optim's state is a defaultdict: state[p] of a parameter with no state yet is a new {}
    # (the usual way to seed it), while `in` and get() do not create it. The hybrid raised KeyError.
    matrix, vector = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.zeros(4))
    hybrid, plain = HybridOptimizer([matrix], [vector]), torch.optim.AdamW([vector])
    for optimizer, param in ((plain, vector), (hybrid, vector), (hybrid, matrix)):
        assert param not in optimizer.state and optimizer.state.get(param) is None
        optimizer.state[param]["seeded"] = 1
        assert param in optimizer.state and optimizer.state.get(param) == {"seeded": 1}
    assert hybrid.muon.state[matrix] == hybrid.adamw.state[vector] == {"seeded": 1}
    with pytest.raises(KeyError, match=r"shape \(3,\) is not optimized"):
        hybrid.state[torch.nn.Parameter(torch.zeros(3))]


def test_setdefault_and_pop_of_a_parameter_without_state_act_as_torch_optimizers_do() -> None:
    # dict.setdefault and dict.pop skip the defaultdict's new {}: setdefault stores its default
    # and pop returns its default. Through state[p] they returned a new {} and dropped the default.
    matrix, vector = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.zeros(4))
    hybrid, plain = HybridOptimizer([matrix], [vector]), torch.optim.AdamW([matrix, vector])
    for optimizer in (plain, hybrid):
        assert optimizer.state.setdefault(matrix, {"step": 7}) == {"step": 7}
        assert optimizer.state[matrix] == {"step": 7}
        assert optimizer.state.setdefault(matrix, {"step": 9}) == {"step": 7}
        assert optimizer.state.pop(vector, "none") == "none" and vector not in optimizer.state
        with pytest.raises(KeyError):
            optimizer.state.pop(vector)
        assert optimizer.state.pop(matrix) == {"step": 7} and len(optimizer.state) == 0


def _stepped_pair(norm_width: int) -> HybridOptimizer:
    """Return a hybrid over a Linear(8, 8) (Muon) and a LayerNorm of `norm_width` after a step."""
    torch.manual_seed(0)
    linear, norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(norm_width)
    optimizer = HybridOptimizer([linear.weight], [linear.bias, *norm.parameters()], muon_lr=0.02)
    for param in [linear.weight, linear.bias, *norm.parameters()]:
        param.grad = torch.randn_like(param)
    optimizer.step()
    return optimizer


def test_a_state_from_another_model_is_refused_before_either_branch_loads() -> None:
    # The Muon matrices match, the AdamW ones not: AdamW loaded moments of the wrong shape and
    # the next step() failed with a bare broadcasting error, and a refused AdamW branch left
    # the Muon branch already loaded.
    saved = copy.deepcopy(_stepped_pair(8).state_dict())
    other = _stepped_pair(4)
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ValueError, match=r"adamw: parameter 1 of group 0 has shape \(4,\).*\(8,\)"):
        other.load_state_dict(saved)
    after = other.state_dict()
    for name in ("muon", "adamw"):
        for index, state in before[name]["state"].items():
            for key, value in state.items():
                assert torch.equal(after[name]["state"][index][key], value), (name, index, key)
    other.adamw.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    with pytest.raises(
        ValueError, match="adamw: the optimizer has 2 parameter groups but the state 1"
    ):
        other.load_state_dict(saved)
    assert torch.equal(
        other.muon.state_dict()["state"][0]["momentum_buffer"],
        before["muon"]["state"][0]["momentum_buffer"],
    )


def test_a_sparse_gradient_is_refused_before_either_branch_steps() -> None:
    # AdamW refused it after Muon had stepped: a caller retrying stepped Muon twice.
    matrix = torch.nn.Parameter(torch.ones(4, 3))
    embedding = torch.nn.Embedding(5, 3, sparse=True)
    optimizer = HybridOptimizer([matrix], list(embedding.parameters()), weight_decay=0.1)
    matrix.grad = torch.randn(4, 3)
    embedding(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match=r"^HybridOptimizer does not support sparse gradients"):
        optimizer.step()
    assert torch.equal(matrix, torch.ones(4, 3)) and not optimizer.state[matrix]
