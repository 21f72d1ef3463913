"""Bad arguments fail when the optimizer or schedule is built, with one line naming them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speedtronic_optim import (
    HybridOptimizer,
    Muon,
    build_lr_scheduler,
    build_optimizer,
    fast_work_dtype,
    lr_lambda,
    make_adamw,
    route_parameters,
)


def _matrices() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 4))]


def _vectors() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(4))]


def _check_raises(error: type[Exception], fragment: str, build) -> None:
    with pytest.raises(error) as raised:
        build()
    message = str(raised.value)
    assert fragment in message and "\n" not in message, message


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"lr": "0.01"}, TypeError, "Muon lr: expected a finite number >= 0, got '0.01'"),
        ({"lr": math.inf}, ValueError, "Muon lr: expected a finite number >= 0, got inf"),
        ({"lr": math.nan}, ValueError, "Muon lr: expected a finite number >= 0, got nan"),
        ({"lr": -1.0}, ValueError, "Muon lr: expected a finite number >= 0, got -1.0"),
        ({"lr": torch.tensor([0.1, 0.2])}, TypeError, "Muon lr: expected a finite number"),
        ({"lr": True}, TypeError, "Muon lr: expected a finite number >= 0, got True"),
        ({"momentum": 1.0}, ValueError, "Muon momentum: expected a finite number in [0, 1)"),
        ({"ns_steps": "5"}, TypeError, "Muon ns_steps: expected an integer >= 1, got '5'"),
        ({"ns_steps": 2.5}, TypeError, "Muon ns_steps: expected an integer >= 1, got 2.5"),
        ({"ns_steps": 0}, ValueError, "Muon ns_steps: expected an integer >= 1, got 0"),
        ({"weight_decay": math.nan}, ValueError, "Muon weight_decay: expected a finite number"),
        ({"eps": -1}, ValueError, "Muon eps: expected a finite number >= 0, got -1"),
        ({"norm_eps": math.inf}, ValueError, "Muon norm_eps: expected a finite number > 0"),
        # Muon+ divides each row and column by its norm + norm_eps: a zero row (a dead unit's
        # gradient) made the whole matrix NaN.
        ({"norm_eps": 0.0}, ValueError, "Muon norm_eps: expected a finite number > 0, got 0.0"),
        ({"nesterov": "yes"}, TypeError, "Muon nesterov: expected True or False, got 'yes'"),
        ({"muon_plus": 1}, TypeError, "Muon muon_plus: expected True or False, got 1"),
        ({"ns_dtype": "bf16"}, TypeError, "Muon ns_dtype: expected None or one of"),
        ({"ns_dtype": torch.int32}, ValueError, "Muon ns_dtype: expected None or one of"),
        ({"adjust_lr": "moonshot"}, ValueError, "Muon adjust_lr: expected one of"),
        ({"normalize_mode": "rows"}, ValueError, "Muon normalize_mode: expected one of"),
        ({"ns_method": "svd"}, ValueError, "Muon ns_method: expected one of"),
    ],
)
def test_muon_rejects(kwargs: dict, error: type[Exception], fragment: str) -> None:
    _check_raises(error, fragment, lambda: Muon(_matrices(), **kwargs))


def test_muon_rejects_a_module_for_its_parameters(make_lm) -> None:
    model = make_lm()
    _check_raises(TypeError, "Muon params: expected an iterable of parameters", lambda: Muon(model))
    blocks = model.blocks  # an iterable of modules
    _check_raises(TypeError, "parameter 0 of the group is a Block", lambda: Muon(list(blocks)))


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: Muon(None), "Muon params: expected an iterable of parameters or param groups, "),
        (lambda: HybridOptimizer(_matrices(), 3), "HybridOptimizer adamw_params: expected an "),
        (lambda: make_adamw(None), "make_adamw params: expected an iterable of parameters or "),
        (lambda: Muon({"params": _matrices()}), "got a dict; pass [group]"),
    ],
)
def test_params_that_are_not_an_iterable_of_them_are_refused(build, fragment: str) -> None:
    # torch.optim says "'NoneType' object is not iterable", or for a dict that its key "params"
    # is not a tensor.
    _check_raises(TypeError, fragment, build)


@pytest.mark.parametrize(
    "group, error, fragment",
    [
        (
            _matrices,
            TypeError,
            "Muon param group 1: expected a dict with a 'params' key, got a list",
        ),
        (lambda: _matrices()[0], TypeError, "expected a dict with a 'params' key, got a Parameter"),
        (lambda: {"lr": 0.1}, ValueError, "Muon param group 1 has no 'params'"),
    ],
)
def test_muon_refuses_a_param_group_that_is_not_one(group, error, fragment: str) -> None:
    # It indexed the group first: "list indices must be integers", "too many indices for tensor
    # of dimension 2", KeyError('params').
    optimizer = Muon(_matrices())
    _check_raises(error, fragment, lambda: optimizer.add_param_group(group()))
    assert len(optimizer.param_groups) == 1


def test_muon_refuses_a_list_mixing_groups_and_tensors() -> None:
    # torch.optim hands each item to add_param_group as a group: the tensor was indexed.
    _check_raises(
        TypeError,
        "Muon param group 1: expected a dict",
        lambda: Muon([{"params": _matrices()}, *_matrices()]),
    )


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"betas": (0.9,)}, ValueError, "HybridOptimizer betas: expected a pair (beta1, beta2)"),
        ({"betas": 0.9}, TypeError, "HybridOptimizer betas: expected a pair (beta1, beta2)"),
        ({"betas": (0.9, 1.0)}, ValueError, "HybridOptimizer betas[1]: expected a finite number"),
        ({"muon_lr": math.inf}, ValueError, "HybridOptimizer muon_lr: expected a finite number"),
        ({"adamw_lr": "1e-3"}, TypeError, "HybridOptimizer adamw_lr: expected a finite number"),
        ({"eps": -1e-8}, ValueError, "HybridOptimizer eps: expected a finite number >= 0"),
        ({"fused": "no"}, TypeError, "HybridOptimizer fused: expected True, False or None"),
        ({"muon_ns_steps": 2.5}, TypeError, "HybridOptimizer muon_ns_steps: expected an integer"),
        ({"muon_momentum": -0.1}, ValueError, "HybridOptimizer muon_momentum: expected a finite"),
        ({"muon_norm_eps": 0}, ValueError, "HybridOptimizer muon_norm_eps: expected a finite"),
        ({"muon_adjust_lr": "rms"}, ValueError, "HybridOptimizer muon_adjust_lr: expected one of"),
        ({"muon_process_group": 0}, TypeError, "HybridOptimizer muon_process_group: expected a"),
    ],
)
def test_hybrid_rejects(kwargs: dict, error: type[Exception], fragment: str) -> None:
    # Only AdamW parameters: Muon's arguments are still checked when its branch is empty.
    _check_raises(error, fragment, lambda: HybridOptimizer([], _vectors(), **kwargs))


def test_hybrid_and_make_adamw_reject_a_module(make_lm) -> None:
    model = make_lm()
    _check_raises(
        TypeError,
        "HybridOptimizer adamw_params: expected an iterable of parameters",
        lambda: HybridOptimizer([], model),
    )
    _check_raises(TypeError, "make_adamw params: expected an iterable", lambda: make_adamw(model))
    _check_raises(
        ValueError,
        "make_adamw lr: expected a finite number >= 0, got inf",
        lambda: make_adamw(_vectors(), lr=math.inf),
    )


@pytest.mark.parametrize(
    "section, error, fragment",
    [
        ({"name": "adamw", "lr": "fast"}, TypeError, "optimizer section lr: expected a finite"),
        ({"name": "muon", "lr": math.inf}, ValueError, "optimizer section lr: expected a finite"),
        ({"name": "muon", "adamw_lr": -1.0}, ValueError, "optimizer section adamw_lr: expected"),
        ({"name": "adamw", "betas": [0.9]}, ValueError, "optimizer section betas: expected a pair"),
        ({"name": "muon", "muon_ns_steps": "5"}, TypeError, "optimizer section muon_ns_steps"),
        ({"name": "muon", "muon_plus": "false"}, TypeError, "optimizer section muon_plus"),
        ({"name": "adamw", "cautious": "true"}, TypeError, "optimizer section cautious"),
        ({"name": "adamw", "fused": "auto"}, TypeError, "optimizer section fused"),
        ({"name": "lion"}, ValueError, "optimizer name 'lion' is not supported"),
    ],
)
@pytest.mark.parametrize("as_mapping", [False, True], ids=["object", "mapping"])
def test_build_optimizer_rejects(
    make_lm, section: dict, error: type[Exception], fragment: str, as_mapping: bool
) -> None:
    given = section if as_mapping else SimpleNamespace(**section)
    _check_raises(error, fragment, lambda: build_optimizer(make_lm(), given))


def test_build_optimizer_wants_the_model(make_lm) -> None:
    params = list(make_lm().parameters())
    _check_raises(
        TypeError,
        "build_optimizer model: expected a torch.nn.Module, got list",
        lambda: build_optimizer(params, SimpleNamespace(name="adamw")),
    )


@pytest.mark.parametrize(
    "section, error, fragment",
    [
        (
            {"name": "cosine", "warmup_steps": "10"},
            TypeError,
            "scheduler section warmup_steps: expected an integer >= 0, got '10'",
        ),
        (
            {"name": "constant", "warmup_steps": math.nan},
            TypeError,
            "scheduler section warmup_steps: expected an integer >= 0, got nan",
        ),
        ({"name": "cosine", "warmup_steps": -1}, ValueError, "scheduler section warmup_steps"),
        ({"name": "cosine", "max_steps": 0}, ValueError, "scheduler section max_steps"),
        (
            {"name": "cosine", "min_lr_ratio": math.nan},
            ValueError,
            "scheduler section min_lr_ratio: expected a finite number in [0, 1], got nan",
        ),
        ({"name": "wsd", "min_lr_ratio": 1.5}, ValueError, "scheduler section min_lr_ratio"),
        (
            {"name": "wsd", "warmup_steps": 0, "decay_ratio": math.nan},
            ValueError,
            "scheduler section decay_ratio: expected a finite number in (0, 1], got nan",
        ),
        ({"name": "wsd", "decay_ratio": 0.0}, ValueError, "scheduler section decay_ratio"),
    ],
)
@pytest.mark.parametrize("as_mapping", [False, True], ids=["object", "mapping"])
def test_build_lr_scheduler_rejects(
    section: dict, error: type[Exception], fragment: str, as_mapping: bool
) -> None:
    given = section if as_mapping else SimpleNamespace(**section)
    optimizer = torch.optim.SGD(_vectors(), lr=1.0)
    _check_raises(error, fragment, lambda: build_lr_scheduler(optimizer, given))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0},  # torch.optim accepts lr 0 (a frozen phase)
        {"lr": torch.tensor(0.01)},  # and a one-element tensor lr
        {"lr": np.float32(0.01), "ns_steps": np.int64(3)},
        {"momentum": 0.0, "weight_decay": 0.0, "eps": 0.0, "nesterov": False},
        {"ns_dtype": torch.float32, "ns_method": "standard", "normalize_mode": "row"},
        {"muon_plus": True, "ns_dtype": torch.float64, "adjust_lr": "none"},
    ],
)
def test_muon_accepts_good_arguments_and_steps(kwargs: dict) -> None:
    params = _matrices()
    optimizer = Muon(params, **kwargs)
    params[0].grad = torch.randn(4, 4)
    optimizer.step()
    assert torch.isfinite(params[0]).all()
    params[0].grad = torch.zeros(4, 4)  # a fresh Muon's update is zero: with eps 0 it was 0 / 0
    Muon(params, **kwargs).step()
    assert torch.isfinite(params[0]).all()


def test_a_mapping_section_builds_what_the_object_does(make_lm) -> None:
    fields = {"name": "muon", "lr": 2e-3, "adamw_lr": 3e-2, "betas": [0.8, 0.9], "cautious": True}
    built = build_optimizer(make_lm(), fields)
    expected = build_optimizer(make_lm(), SimpleNamespace(**fields))
    assert [(g["lr"], g["weight_decay"]) for g in built.param_groups] == [
        (g["lr"], g["weight_decay"]) for g in expected.param_groups
    ]
    assert built.base.adamw.param_groups[0]["betas"] == (0.8, 0.9)
    schedule = {"name": "wsd", "warmup_steps": 0, "max_steps": 10, "min_lr_ratio": 0.0}
    assert [lr_lambda(schedule)(s) for s in range(10)] == [
        lr_lambda(SimpleNamespace(**schedule))(s) for s in range(10)
    ]


def test_edges_of_the_schedule_ranges_are_accepted() -> None:
    section = SimpleNamespace(
        name="wsd", warmup_steps=0, max_steps=1, min_lr_ratio=1.0, decay_ratio=1.0
    )
    assert lr_lambda(section)(0) == 1.0
    assert lr_lambda(SimpleNamespace(name="cosine", min_lr_ratio=0.0))(0) > 0


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: route_parameters(_matrices()), "route_parameters model: expected a torch.nn"),
        (lambda: build_lr_scheduler(None, "cosine"), "build_lr_scheduler optimizer: expected a"),
    ],
)
def test_a_model_or_optimizer_of_another_kind_is_refused(build, fragment: str) -> None:
    # They failed inside: "'list' object has no attribute 'named_modules'", "'NoneType' object
    # has no attribute 'param_groups'" (in torch's LambdaLR).
    _check_raises(TypeError, fragment, build)


def test_fast_work_dtype_takes_a_device_name_as_torch_does() -> None:
    # "'str' object has no attribute 'type'".
    assert fast_work_dtype("cpu") == fast_work_dtype(torch.device("cpu"))
    assert fast_work_dtype("cuda:0") == torch.bfloat16  # named, not opened
