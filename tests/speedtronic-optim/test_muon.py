from __future__ import annotations

import builtins
import copy
import importlib.util
import math
import re

import pytest
import torch

from speedtronic_optim import HybridOptimizer, Muon
from speedtronic_optim.muon import adjusted_lr

# The reference these tests compare with; Muon itself does not use it.
needs_torch_muon = pytest.mark.skipif(
    not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon (the reference) is not in this torch"
)


def _run(optimizer_factory, shape: tuple[int, int], steps: int = 4) -> torch.Tensor:
    torch.manual_seed(10)
    param = torch.nn.Parameter(torch.randn(*shape))
    target = torch.randn(*shape)
    optimizer = optimizer_factory([param])
    for _ in range(steps):
        optimizer.zero_grad()
        # A non-linear loss so each step sees a different gradient.
        ((param - target) ** 2 * (1 + param.tanh())).sum().backward()
        optimizer.step()
    return param.detach()


@needs_torch_muon
@pytest.mark.parametrize("shape", [(48, 20), (20, 48), (32, 32)])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_matches_torch_muon(shape: tuple[int, int], nesterov: bool, adjust: str) -> None:
    settings = dict(
        lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=0.05, eps=1e-7, ns_steps=5
    )
    theirs = _run(lambda p: torch.optim.Muon(p, adjust_lr_fn=adjust, **settings), shape)
    ours = _run(
        lambda p: Muon(
            p, adjust_lr=adjust, ns_method="standard", ns_dtype=torch.bfloat16, **settings
        ),
        shape,
    )
    start = _run(lambda p: torch.optim.SGD(p, lr=0.0), shape)
    assert (theirs - start).abs().max() > 0.01  # the steps are real
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=0)


@needs_torch_muon
@pytest.mark.parametrize("shape", [(64, 20), (20, 64)])
def test_gram_path_tracks_torch_muon(shape: tuple[int, int]) -> None:
    settings = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0, ns_steps=5)
    theirs = _run(lambda p: torch.optim.Muon(p, **settings), shape)
    ours = _run(lambda p: Muon(p, ns_method="gram", ns_dtype=torch.float32, **settings), shape)
    start = _run(lambda p: torch.optim.SGD(p, lr=0.0), shape)
    relative = (ours - theirs).norm() / (theirs - start).norm()
    assert relative < 0.05


def test_adjusted_lr_rules() -> None:
    assert adjusted_lr(0.1, "original", torch.Size([40, 10])) == pytest.approx(0.2)
    assert adjusted_lr(0.1, "original", torch.Size([10, 40])) == pytest.approx(0.1)
    assert adjusted_lr(0.1, "match_rms_adamw", torch.Size([10, 400])) == pytest.approx(
        0.1 * 0.2 * 20
    )
    assert adjusted_lr(0.1, "none", torch.Size([10, 400])) == 0.1


def test_muon_plus_changes_direction_but_keeps_size() -> None:
    plain = _run(lambda p: Muon(p, lr=0.02, ns_method="standard"), (16, 48), steps=1)
    plus = _run(lambda p: Muon(p, lr=0.02, muon_plus=True, ns_method="standard"), (16, 48), steps=1)
    start = _run(lambda p: torch.optim.SGD(p, lr=0.0), (16, 48))
    step_plain, step_plus = plain - start, plus - start
    assert not torch.allclose(step_plain, step_plus, atol=1e-4)
    assert math.isclose(step_plus.norm().item(), step_plain.norm().item(), rel_tol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lr", [0.02, torch.tensor(0.02)])
def test_16_bit_weight_decay_is_torch_muons(dtype: torch.dtype, lr) -> None:
    # On CPU, torch._foreach_mul_ rounded a float factor to the parameters' dtype: in bf16
    # 1 - 0.02 * 0.1 became 1 - 2**-8, twice the decay, unlike torch.optim.Muon's mul_.
    torch.manual_seed(10)
    start = torch.randn(24, 16).mul(3).to(dtype)
    param = torch.nn.Parameter(start.clone())
    param.grad = torch.zeros_like(param)  # only the decay acts
    Muon([param], lr=lr, weight_decay=0.1).step()
    expected = start.clone().mul_(1 - 0.02 * 0.1)  # what torch.optim.Muon does
    assert not torch.equal(expected, start)
    torch.testing.assert_close(param.detach(), expected, atol=0, rtol=0)


@needs_torch_muon
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_parameters_take_torch_muons_steps_bit_for_bit(dtype: torch.dtype) -> None:
    # bf16: 300 such steps left the weights at half the norm torch.optim.Muon's had. fp16: the
    # update was cast to fp16 before the add, 1 ulp off torch's float32 add on ~0.5% of entries.
    torch.manual_seed(10)
    start = torch.randn(96, 64).mul(3).to(dtype)
    params = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.9)
    ours = Muon([params[0]], ns_dtype=torch.bfloat16, ns_method="standard", **settings)
    theirs = torch.optim.Muon([params[1]], **settings)
    for _ in range(3):
        grad = torch.randn(96, 64).to(dtype)
        for param, optimizer in zip(params, (ours, theirs), strict=True):
            param.grad = grad.clone()
            optimizer.step()
    torch.testing.assert_close(params[0], params[1], atol=0, rtol=0)


@needs_torch_muon
def test_a_matrix_alone_in_its_shape_takes_torch_muons_step_bit_for_bit() -> None:
    # Stepped as a batch of one, this tall shape's bf16 baddbmm rounded unlike torch's addmm.
    torch.manual_seed(11)
    start, grad = torch.randn(1024, 512), torch.randn(1024, 512)
    params = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    settings = dict(lr=0.02, weight_decay=0.1)
    ours = Muon([params[0]], ns_dtype=torch.bfloat16, **settings)
    theirs = torch.optim.Muon([params[1]], **settings)
    for param, optimizer in zip(params, (ours, theirs), strict=True):
        param.grad = grad.clone()
        optimizer.step()
    assert not torch.equal(params[0], start)
    torch.testing.assert_close(params[0], params[1], atol=0, rtol=0)


def test_weight_decay_is_decoupled_and_uses_unscaled_lr() -> None:
    param = torch.nn.Parameter(torch.ones(8, 2))
    optimizer = Muon([param], lr=0.1, weight_decay=0.5)
    param.grad = torch.zeros(8, 2)  # zero gradient: only the decay acts
    optimizer.step()
    torch.testing.assert_close(param.detach(), torch.full((8, 2), 1 - 0.1 * 0.5))


def test_rejects_non_matrix_parameters_naming_the_shape() -> None:
    with pytest.raises(ValueError, match=r"\(7,\)"):
        Muon([torch.nn.Parameter(torch.zeros(7))])
    optimizer = Muon([torch.nn.Parameter(torch.zeros(3, 3))])
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, 3, 4))]})


def test_rejects_sparse_gradient_before_any_group_changes() -> None:
    dense, sparse = torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(4, 3))
    optimizer = Muon([{"params": [dense]}, {"params": [sparse]}], weight_decay=0.1)
    dense.grad, sparse.grad = torch.randn(4, 3), torch.zeros(4, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()
    # The first group was stepped before the second's gradient was looked at.
    assert torch.equal(dense, torch.ones(4, 3)) and not optimizer.state


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr": -1.0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"ns_steps": 0}, "ns_steps"),
        ({"adjust_lr": "moonshot"}, "adjust_lr"),
    ],
)
def test_bad_hyperparameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_closure_called_once_and_loss_returned() -> None:
    param = torch.nn.Parameter(torch.randn(4, 6))
    optimizer = Muon([param])
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        optimizer.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure) is not None and len(calls) == 1


def test_state_dict_round_trip() -> None:
    torch.manual_seed(10)
    param = torch.nn.Parameter(torch.randn(12, 20))
    optimizer = Muon([param], lr=0.02)
    param.grad = torch.randn(12, 20)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())  # load_state_dict would alias the live buffers
    clone = torch.nn.Parameter(param.detach().clone())
    restored = Muon([clone], lr=0.02)
    restored.load_state_dict(saved)
    grad = torch.randn(12, 20)
    param.grad, clone.grad = grad, grad.clone()
    optimizer.step()
    restored.step()
    torch.testing.assert_close(clone, param)
    torch.testing.assert_close(
        restored.state[clone]["momentum_buffer"], optimizer.state[param]["momentum_buffer"]
    )


def test_a_state_saved_for_parameters_in_another_order_is_refused_when_loaded() -> None:
    # torch.optim pairs saved and live parameters by position: groups built in another order
    # loaded, then every step() failed with a bare broadcasting error.
    def build(order: list[int]) -> tuple[Muon, list[torch.nn.Parameter]]:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(8, 6)), torch.nn.Parameter(torch.randn(6, 8))]
        groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.01}]
        return Muon([groups[i] for i in order], lr=0.02), params

    saved, params = build([0, 1])
    for param in params:
        param.grad = torch.randn_like(param)
    saved.step()
    state = copy.deepcopy(saved.state_dict())
    swapped, _ = build([1, 0])
    fresh = copy.deepcopy(swapped.state_dict())
    with pytest.raises(ValueError, match=r"group 0 has shape \(6, 8\).*\(8, 6\).*order"):
        swapped.load_state_dict(state)
    assert swapped.state_dict() == fresh  # nothing was loaded
    build([0, 1])[0].load_state_dict(state)  # the saved order loads


def _torch_muon_state(adjust_lr_fn: str | None) -> tuple[dict, torch.Tensor]:
    """Return a torch.optim.Muon state dict after one step, and the parameter it stepped."""
    torch.manual_seed(10)
    param = torch.nn.Parameter(torch.randn(12, 20))
    theirs = torch.optim.Muon([param], lr=0.02, adjust_lr_fn=adjust_lr_fn)
    param.grad = torch.randn(12, 20)
    theirs.step()
    return copy.deepcopy(theirs.state_dict()), param


@needs_torch_muon
@pytest.mark.parametrize(
    "adjust_lr_fn, ours", [(None, "match_rms_adamw"), ("match_rms_adamw", "original")]
)
def test_a_torch_muon_state_loads_with_its_lr_rule(adjust_lr_fn, ours: str) -> None:
    # torch's group key adjust_lr_fn was ignored: the loading optimizer's adjust_lr ran instead.
    saved, param = _torch_muon_state(adjust_lr_fn)
    theirs = torch.optim.Muon([param])
    theirs.load_state_dict(copy.deepcopy(saved))
    clone = torch.nn.Parameter(param.detach().clone())
    restored = Muon([clone], adjust_lr=ours, ns_dtype=torch.bfloat16, ns_method="standard")
    restored.load_state_dict(saved)
    for _ in range(2):
        grad = torch.randn(12, 20)
        param.grad, clone.grad = grad, grad.clone()
        theirs.step()
        restored.step()
    torch.testing.assert_close(clone, param, atol=0, rtol=0)
    group = restored.param_groups[0]
    assert "adjust_lr_fn" not in group and group["weight_decay"] == 0.1  # torch's saved value


@needs_torch_muon
@pytest.mark.parametrize(
    "edit, fragment",
    [
        ({"adjust_lr_fn": "moonshot"}, "torch.optim.Muon's adjust_lr_fn='moonshot'"),
        ({"adjust_lr": "none"}, "adjust_lr='none' and torch.optim.Muon's adjust_lr_fn=None"),
    ],
)
def test_a_torch_muon_state_muon_cannot_run_as_saved_is_refused(edit, fragment: str) -> None:
    saved, _ = _torch_muon_state(None)
    saved["param_groups"][0].update(edit)
    optimizer = Muon([torch.nn.Parameter(torch.randn(12, 20))])
    fresh = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(ValueError, match=f"group 0 has {re.escape(fragment)}.*start a new run"):
        optimizer.load_state_dict(saved)
    assert optimizer.state_dict() == fresh  # nothing was loaded


def test_loading_state_keeps_the_split_mode() -> None:
    # The split mode is not in the state dict: a resume must not fall back to auto mode.
    optimizer = Muon([torch.nn.Parameter(torch.randn(4, 6))], distributed=False)
    optimizer.process_group = group = object()
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert optimizer.distributed is False and optimizer.process_group is group


def test_state_saved_without_the_newer_group_options_loads_and_steps() -> None:
    # 2.0's Muon groups had lr, momentum, nesterov, ns_steps, weight_decay, eps, norm_eps and
    # muon_plus only; the options added since take the loading optimizer's values.
    torch.manual_seed(10)
    param = torch.nn.Parameter(torch.randn(12, 20))
    optimizer = Muon([param], lr=0.02, adjust_lr="match_rms_adamw")
    param.grad = torch.randn(12, 20)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    for key in ("adjust_lr", "normalize_mode", "ns_coefficients", "ns_method", "ns_dtype"):
        del saved["param_groups"][0][key]
    clone = torch.nn.Parameter(param.detach().clone())
    restored = Muon([clone], lr=0.02, adjust_lr="match_rms_adamw")
    restored.load_state_dict(saved)
    assert restored.param_groups[0]["adjust_lr"] == "match_rms_adamw"
    grad = torch.randn(12, 20)
    param.grad, clone.grad = grad, grad.clone()
    optimizer.step()
    restored.step()
    torch.testing.assert_close(clone, param)


def test_loading_state_keeps_how_the_parameters_are_stored() -> None:
    # A state saved before `transposed` existed (or by another layout) must not flip the live
    # groups' orientation: a resumed GPT-2 run would change its update rule.
    optimizer = Muon([{"params": [torch.nn.Parameter(torch.randn(4, 6))], "transposed": True}])
    saved = copy.deepcopy(optimizer.state_dict())
    del saved["param_groups"][0]["transposed"]
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["transposed"] is True


def test_auto_work_dtype_tracks_bf16_support(monkeypatch) -> None:
    from speedtronic_optim.newton_schulz import fast_work_dtype

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert fast_work_dtype(torch.device("cpu")) == torch.float32
    assert fast_work_dtype(torch.device("meta")) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert fast_work_dtype(torch.device("cpu")) == torch.bfloat16


@needs_torch_muon
def test_float32_work_dtype_tracks_torch_muon() -> None:
    settings = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0, ns_steps=5)
    theirs = _run(lambda p: torch.optim.Muon(p, **settings), (40, 24))
    ours = _run(lambda p: Muon(p, ns_dtype=torch.float32, **settings), (40, 24))
    start = _run(lambda p: torch.optim.SGD(p, lr=0.0), (40, 24))
    assert (ours - theirs).norm() / (theirs - start).norm() < 0.05


@pytest.mark.parametrize("cap", [None, 20 * 12 * 2])  # None: one batch per shape; else chunks of 2
@pytest.mark.parametrize("muon_plus", [False, True])
def test_batched_same_shape_step_equals_one_matrix_at_a_time(monkeypatch, cap, muon_plus) -> None:
    import speedtronic_optim.muon as muon_module

    if cap is not None:
        monkeypatch.setattr(muon_module, "MAX_CPU_BATCH_ELEMENTS", cap)
    torch.manual_seed(3)
    shapes = [(20, 12), (12, 20), (20, 12), (20, 12), (12, 20), (20, 12), (16, 16)]
    starts = [torch.randn(*shape) for shape in shapes]
    grads = [[torch.randn(*shape) for shape in shapes] for _ in range(3)]
    settings = dict(lr=0.02, weight_decay=0.1, muon_plus=muon_plus, ns_dtype=torch.float32)

    together = [torch.nn.Parameter(s.clone()) for s in starts]
    alone = [torch.nn.Parameter(s.clone()) for s in starts]
    batched = Muon(together, **settings)
    singles = [Muon([p], **settings) for p in alone]
    for step_grads in grads:
        for p, q, g in zip(together, alone, step_grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        batched.step()
        for optimizer in singles:
            optimizer.step()
    for p, q, s in zip(together, alone, starts, strict=True):
        assert (p - s).abs().max() > 1e-3  # the steps are real
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_same_shape_batches_group_by_shape_and_respect_the_cap(monkeypatch) -> None:
    import speedtronic_optim.muon as muon_module

    group = Muon([torch.zeros(1, 1)]).defaults
    params = [torch.zeros(4, 4), torch.zeros(2, 8), torch.zeros(4, 4), torch.zeros(4, 4)]
    assert muon_module._same_shape_batches(params, group) == [[0, 2, 3], [1]]
    monkeypatch.setattr(muon_module, "MAX_CPU_BATCH_ELEMENTS", 32)
    assert muon_module._same_shape_batches(params, group) == [[0, 2], [3], [1]]
    # Accelerators keep the larger cap; meta tensors stand in for them here.
    meta = [torch.zeros(4, 4, device="meta") for _ in range(3)]
    assert muon_module._same_shape_batches(meta, group) == [[0, 1, 2]]


@pytest.mark.parametrize("threads", [1, 2])
def test_one_thread_cpu_batches_hold_what_the_l2_cache_holds(monkeypatch, threads) -> None:
    import speedtronic_optim.muon as muon_module

    # One 16x8 step's working set (X, X X^T, polynomial, next X): 2 * (128 + 64) elements.
    l2_bytes = 2 * 192 * 4 * 3  # three fp32 ones
    monkeypatch.setattr(muon_module, "_l2_cache_bytes", lambda: l2_bytes)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    params = [torch.zeros(16, 8) for _ in range(7)]
    fp32 = dict(Muon([torch.zeros(1, 1)]).defaults, ns_dtype=torch.float32)
    bf16 = dict(fp32, ns_dtype=torch.bfloat16)  # half the bytes: twice the matrices
    sizes = [[len(b) for b in muon_module._same_shape_batches(params, g)] for g in (fp32, bf16)]
    # Several threads share out a batch's matrices: only the element cap bounds it.
    assert sizes == {1: [[3, 3, 1], [6, 1]], 2: [[7], [7]]}[threads]
    # A matrix past the cache runs alone, not in batches of none.
    l2_bytes = 1
    assert len(muon_module._same_shape_batches(params, fp32)) == {1: 7, 2: 1}[threads]


def test_the_l2_cache_size_is_read_at_the_first_one_thread_step_not_at_import(monkeypatch) -> None:
    import speedtronic_optim.muon as muon_module

    # Processes that never step Muon on one CPU thread never read sysfs.
    opened: list[str] = []
    real_open = builtins.open

    def recording_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    spec = importlib.util.spec_from_file_location("fresh_muon", muon_module.__file__)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # an import of a fresh copy
    assert not [path for path in opened if path.startswith("/sys/")]


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (0, 0)])
@pytest.mark.parametrize("muon_plus", [False, True])
def test_empty_matrices_step_as_no_ops(shape: tuple[int, int], muon_plus: bool) -> None:
    empty, full = torch.nn.Parameter(torch.zeros(shape)), torch.nn.Parameter(torch.randn(3, 3))
    alone = torch.nn.Parameter(full.detach().clone())
    empty.grad, full.grad = torch.zeros(shape), torch.randn(3, 3)
    alone.grad = full.grad.clone()
    Muon([empty, full], lr=0.1, weight_decay=0.1, muon_plus=muon_plus).step()
    Muon([alone], lr=0.1, weight_decay=0.1, muon_plus=muon_plus).step()
    assert empty.shape == shape and torch.equal(full, alone)


@pytest.mark.parametrize(
    "group, error, fragment",
    [
        ({"lr": -1.0}, ValueError, "Muon param group 0 lr"),
        ({"momentum": float("nan")}, ValueError, "Muon param group 0 momentum"),
        ({"ns_steps": 2.5}, TypeError, "Muon param group 0 ns_steps"),
        ({"adjust_lr": "orignal"}, ValueError, "Muon param group 0 adjust_lr"),
        ({"ns_coefficients": "polar"}, ValueError, "Muon param group 0 ns_coefficients"),
        ({"transposed": "yes"}, TypeError, "Muon param group 0 transposed"),
    ],
)
def test_per_group_options_are_checked_when_the_group_is_added(group, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        Muon([{"params": [torch.nn.Parameter(torch.zeros(2, 2))], **group}])
    optimizer = Muon([torch.nn.Parameter(torch.zeros(2, 2))])
    with pytest.raises(error, match=fragment.replace("group 0", "group 1")):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))], **group})
    assert len(optimizer.param_groups) == 1


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"ns_coefficients": "polar"}, ValueError, "Muon ns_coefficients"),
        ({"ns_coefficients": [(1.0, 2.0)]}, ValueError, "Muon ns_coefficients"),
        ({"ns_coefficients": None}, ValueError, "Muon ns_coefficients"),
        ({"ns_coefficients": torch.ones(5, 2)}, ValueError, r"got a tensor of shape \(5, 2\)$"),
        ({"ns_coefficients": [(3.4445, -4.775, float("nan"))]}, ValueError, "Muon ns_coefficients"),
        ({"distributed": "no"}, TypeError, "Muon distributed"),
    ],
)
def test_coefficients_and_split_mode_are_checked_when_built(kwargs, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64])
def test_rejects_complex_and_integer_matrices(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=f"real floating-point matrices.*{dtype}"):
        Muon([torch.zeros(3, 3, dtype=dtype)])


def test_gram_works_in_float32_by_default_and_16_bit_gram_is_refused_when_built(
    monkeypatch,
) -> None:
    # As on a GPU or a BF16-capable CPU, where the default work dtype is bf16.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    param = torch.nn.Parameter(torch.randn(8, 32))
    param.grad = torch.randn(8, 32)
    Muon([param], ns_method="gram").step()
    assert torch.isfinite(param).all()
    with pytest.raises(ValueError, match="Muon ns_method: 'gram' is numerically unstable"):
        Muon([torch.nn.Parameter(torch.randn(8, 32))], ns_method="gram", ns_dtype=torch.bfloat16)
    optimizer = Muon([torch.nn.Parameter(torch.randn(8, 32))], ns_dtype=torch.float16)
    with pytest.raises(ValueError, match="Muon param group 1 ns_method: 'gram'"):
        optimizer.add_param_group(
            {"params": [torch.nn.Parameter(torch.randn(8, 32))], "ns_method": "gram"}
        )


def test_a_parameter_list_is_taken_as_in_torch_optim() -> None:
    # It iterates over its parameters; it was refused as a module ("pass its .parameters()").
    params = torch.nn.ParameterList([torch.randn(4, 6), torch.randn(6, 4)])
    optimizer = Muon(params, lr=0.02)
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer.step()
    assert [len(group["params"]) for group in optimizer.param_groups] == [2]
    with pytest.raises(TypeError, match="got a Linear module; pass its .parameters()"):
        Muon(torch.nn.Linear(4, 6))


def test_named_parameters_are_taken_and_sets_refused_as_in_torch_optim() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 3))
    matrices = [(name, p) for name, p in model.named_parameters() if p.ndim == 2]
    optimizer = Muon(matrices, lr=0.02)
    assert optimizer.state_dict()["param_groups"][0]["param_names"] == ["0.weight", "1.weight"]
    with pytest.raises(ValueError, match="parameter '1.bias' has shape"):
        Muon(model.named_parameters())
    with pytest.raises(TypeError, match="ordered collections"):
        Muon([{"params": {model[0].weight}}])


def test_named_and_unnamed_parameters_are_not_mixed() -> None:
    # torch.optim refuses a mix from torch 2.6; torch 2.4 and 2.5 took no names at all.
    first, second = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(6, 3))
    with pytest.raises(ValueError, match="group 0: 1 of 2 parameters are .* or none"):
        Muon([("a", first), second])
    with pytest.raises(ValueError, match="group 1 names its parameters but an earlier group"):
        Muon([{"params": [first]}, {"params": [("b", second)]}])
    with pytest.raises(ValueError, match="group 1 does not name its parameters but an earlier"):
        Muon([{"params": [("a", first)]}, {"params": [second]}])


def _loaded_state(saved) -> None:
    """Load `saved` into a fresh Muon; assert it raised one line and changed nothing."""
    optimizer = Muon([torch.nn.Parameter(torch.randn(4, 6))])
    fresh = copy.deepcopy(optimizer.state_dict())
    try:
        optimizer.load_state_dict(saved)
    finally:
        assert optimizer.state_dict() == fresh  # nothing was loaded


def test_a_state_that_is_not_a_muon_state_dict_is_refused() -> None:
    # torch.optim raised KeyError('param_groups') for a HybridOptimizer's state and
    # "'NoneType' object has no attribute 'copy'" for None.
    hybrid = HybridOptimizer(
        [torch.nn.Parameter(torch.randn(4, 6))], [torch.nn.Parameter(torch.zeros(6))]
    )
    with pytest.raises(ValueError, match=r"got keys \['adamw', 'muon'\].*state_dict\(\)\['muon'\]"):
        _loaded_state(hybrid.state_dict())
    with pytest.raises(TypeError, match="Muon.load_state_dict: expected a state dict, got None"):
        _loaded_state(None)


def test_a_state_saved_by_another_optimizer_is_refused() -> None:
    # An AdamW state loaded: its groups lack Muon's options, which took this Muon's defaults, so
    # its lr and weight decay went on with a zero momentum and AdamW's moments in the state.
    param = torch.nn.Parameter(torch.randn(4, 6))
    adamw = torch.optim.AdamW([param])
    param.grad = torch.randn(4, 6)
    adamw.step()
    with pytest.raises(
        ValueError, match="group 0 of the state has no momentum, nesterov, ns_steps"
    ):
        _loaded_state(adamw.state_dict())


def test_a_pre_hook_may_turn_a_saved_state_into_a_muon_one() -> None:
    # The layout is checked after the caller's load_state_dict pre hooks, as torch reads it.
    optimizer = Muon([torch.nn.Parameter(torch.randn(4, 6))], lr=0.5)
    wrapped = {"muon": copy.deepcopy(optimizer.state_dict())}
    wrapped["muon"]["param_groups"][0]["lr"] = 0.25
    optimizer.register_load_state_dict_pre_hook(lambda _, saved: saved["muon"])
    optimizer.load_state_dict(wrapped)
    assert optimizer.param_groups[0]["lr"] == 0.25
