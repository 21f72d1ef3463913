from __future__ import annotations

import pytest
import torch

from speedtronic_optim import make_adamw

SETTINGS = dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def test_disabled_fused_is_regular() -> None:
    optimizer = make_adamw([torch.nn.Parameter(torch.zeros(3))], fused=False, **SETTINGS)
    assert not optimizer.param_groups[0]["fused"]


@pytest.mark.parametrize("fused", [None, True])
def test_probe_falls_back_when_fused_construction_fails(monkeypatch, fused: bool | None) -> None:
    real = torch.optim.AdamW
    attempts = []

    def without_fused_kernels(params, fused=None, **kwargs):
        attempts.append(fused)
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", without_fused_kernels)
    optimizer = make_adamw([torch.nn.Parameter(torch.zeros(3))], fused=fused, **SETTINGS)
    assert attempts == [True, None]
    assert not optimizer.param_groups[0]["fused"]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.99)


def test_probe_uses_fused_where_available() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    try:
        torch.optim.AdamW([param], fused=True)
    except RuntimeError:
        pytest.skip("this torch build has no fused AdamW for CPU")
    assert make_adamw([param], fused=None, **SETTINGS).param_groups[0]["fused"]


@pytest.mark.parametrize(
    "group, error, fragment",
    [
        ({"lr": -1.0}, ValueError, "make_adamw param group 1 lr"),
        ({"betas": (0.9, 1.5)}, ValueError, "make_adamw param group 1 betas"),
        ({"weight_decay": float("nan")}, ValueError, "make_adamw param group 1 weight_decay"),
    ],
)
def test_a_groups_own_options_are_checked(group, error, fragment):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    groups.append({"params": [torch.nn.Parameter(torch.zeros(3))], **group})
    with pytest.raises(error, match=fragment):
        make_adamw(groups)
