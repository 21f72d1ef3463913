from __future__ import annotations

import copy

import pytest
import torch

from speedtronic_optim import CautiousOptimizer, HybridOptimizer, Muon, route_parameters


def test_masks_misaligned_entries_and_rescales() -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    base = torch.optim.SGD([param], lr=1.0, momentum=0.9)
    optimizer = CautiousOptimizer(base)
    param.grad = torch.tensor([1.0, 1.0, 1.0, 1.0])
    optimizer.step()  # momentum buffer = grad; plain step -1 everywhere, all aligned
    torch.testing.assert_close(param.detach(), torch.full((4,), -4 / 5))
    param.grad = torch.tensor([-2.0, -2.0, -2.0, -0.5])
    start = param.detach().clone()
    # buffer 0.9 - 2 = -1.1 (aligned with grad) for three entries, 0.9 - 0.5 = 0.4 (against) for one
    optimizer.step()
    delta = param.detach() - start
    assert delta[3] == 0  # update disagrees with the gradient there: reverted
    torch.testing.assert_close(delta[:3], torch.full((3,), 1.1 * 4 / 4))


def test_a_maximizing_base_keeps_the_entries_that_ascend() -> None:
    # With maximize=True the base moves along the gradient; every entry read as misaligned and
    # was reverted, so the wrapped optimizer never moved.
    params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(2)]
    groups = [{"params": [params[0]], "maximize": True}, {"params": [params[1]]}]
    optimizer = CautiousOptimizer(torch.optim.SGD(groups, lr=1.0))
    for param in params:
        param.grad = torch.tensor([1.0, -1.0, 2.0, -2.0])
    optimizer.step()  # every entry agrees with its group's direction: all kept, scaled 4 / 5
    torch.testing.assert_close(params[0].detach(), torch.tensor([1.0, -1.0, 2.0, -2.0]) * 0.8)
    torch.testing.assert_close(params[1].detach(), torch.tensor([-1.0, 1.0, -2.0, 2.0]) * 0.8)


def test_fp16_parameters_are_masked_and_scaled_as_float32_ones() -> None:
    # The kept count (an fp16 sum) overflowed past 65504 entries, so the scale was 0 and nothing
    # moved; and delta * grad of small values underflowed to 0, reverting descent entries.
    for shape, value, grad in (((256, 257), 1.0, 1.0), ((4, 4), 0.01, 1e-3)):
        param = torch.nn.Parameter(torch.full(shape, value, dtype=torch.float16))
        before = param.detach().clone()
        optimizer = CautiousOptimizer(torch.optim.SGD([param], lr=0.01))
        param.grad = torch.full(shape, grad, dtype=torch.float16)
        optimizer.step()
        plain = (before.add(param.grad, alpha=-0.01) - before).float()  # SGD's own step
        assert plain.abs().min() > 0  # every entry descends: all kept, scaled
        expected = plain * (param.numel() / (param.numel() + 1))
        # Within fp16's rounding of the parameter (one spacing is 6% of the small case's step).
        torch.testing.assert_close((param.detach() - before).float(), expected, rtol=0.1, atol=0)


def test_composes_with_muon_and_hybrid(tiny_lm, lm_loss) -> None:
    routing = route_parameters(tiny_lm)
    wrapped = CautiousOptimizer(
        HybridOptimizer(
            routing.muon,
            routing.adamw,
            muon_lr=0.02,
            adamw_lr=1e-3,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.0,
        )
    )
    muon_only = CautiousOptimizer(Muon([torch.nn.Parameter(torch.randn(6, 9))], lr=0.02))
    losses = []
    for _ in range(5):
        wrapped.zero_grad()
        loss = lm_loss(tiny_lm)
        loss.backward()
        wrapped.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(torch.isfinite(p).all() for p in tiny_lm.parameters())
    assert muon_only.param_groups is muon_only.base.param_groups


def test_closure_once_zero_grad_and_add_param_group() -> None:
    param = torch.nn.Parameter(torch.randn(5))
    optimizer = CautiousOptimizer(torch.optim.AdamW([param], lr=0.1, weight_decay=0.0))
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        loss = (param**2).sum()
        loss.backward()
        return loss

    before = param.detach().clone()
    optimizer.step(closure)
    # Adam's first step is -lr * sign(grad): all aligned, so every entry is scaled by 5 / (5 + 1).
    expected = before - 0.1 * (5 / 6) * torch.sign(2 * before)
    assert calls == [1]
    torch.testing.assert_close(param.detach(), expected, atol=1e-5, rtol=0)
    optimizer.zero_grad()
    assert param.grad is None
    extra = torch.nn.Parameter(torch.randn(3))
    optimizer.add_param_group({"params": [extra]})
    assert optimizer.base.param_groups[-1]["params"] == [extra] and len(optimizer.param_groups) == 2


def test_state_round_trip() -> None:
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(6, 4))
    optimizer = CautiousOptimizer(Muon([param], lr=0.05))
    param.grad = torch.randn(6, 4)
    optimizer.step()
    twin = torch.nn.Parameter(param.detach().clone())
    twin_optimizer = CautiousOptimizer(Muon([twin], lr=0.05))
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    grad = torch.randn(6, 4)
    param.grad, twin.grad = grad, grad.clone()
    optimizer.step()
    twin_optimizer.step()
    torch.testing.assert_close(param, twin)


def test_rejects_non_optimizer() -> None:
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        CautiousOptimizer(object())  # type: ignore[arg-type]


def test_sparse_or_complex_gradients_are_named_before_the_step() -> None:
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    optimizer = CautiousOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.1))
    embedding(torch.tensor([1, 2])).sum().backward()
    before = embedding.weight.detach().clone()
    with pytest.raises(ValueError, match=r"real, dense gradients, got a sparse one of shape"):
        optimizer.step()
    assert torch.equal(embedding.weight, before)  # refused before the base stepped
    complex_param = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.complex64))
    complex_param.grad = torch.randn_like(complex_param)
    with pytest.raises(ValueError, match=r"got a complex one of shape \(3, 3\)"):
        CautiousOptimizer(torch.optim.AdamW([complex_param])).step()
