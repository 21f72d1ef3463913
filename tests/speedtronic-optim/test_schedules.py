from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from speedtronic_optim import (
    build_lr_scheduler,
    warmup_constant,
    warmup_cosine,
    warmup_stable_decay,
)
from speedtronic_optim.schedules import DEFAULT_WARMUP_STEPS, lr_lambda


def test_warmup_formula() -> None:
    assert warmup_constant(0, warmup_steps=4) == 0.25
    assert warmup_constant(3, warmup_steps=4) == 1.0
    assert warmup_constant(10, warmup_steps=0) == 1.0
    assert warmup_cosine(1, warmup_steps=4, max_steps=10, min_lr_ratio=0.1) == 0.5


def test_cosine_values_and_clamp() -> None:
    kwargs = dict(warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert warmup_cosine(10, **kwargs) == pytest.approx(1.0)
    assert warmup_cosine(60, **kwargs) == pytest.approx(0.1 + 0.9 * 0.5)
    assert warmup_cosine(85, **kwargs) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75))
    )
    assert warmup_cosine(110, **kwargs) == pytest.approx(0.1)
    assert warmup_cosine(500, **kwargs) == pytest.approx(0.1)


def test_wsd_values() -> None:
    kwargs = dict(warmup_steps=10, max_steps=100, min_lr_ratio=0.0)
    assert warmup_stable_decay(5, **kwargs) == pytest.approx(0.6)
    assert warmup_stable_decay(50, **kwargs) == 1.0
    assert warmup_stable_decay(79, **kwargs) == 1.0  # decay_ratio 0.2: the last 20 steps decay
    assert warmup_stable_decay(80, **kwargs) == pytest.approx(0.95)
    assert warmup_stable_decay(90, **kwargs) == pytest.approx(0.45)
    assert warmup_stable_decay(99, **kwargs) == 0.0  # the last update runs at min_lr_ratio
    assert warmup_stable_decay(100, **kwargs) == 0.0
    assert warmup_stable_decay(90, decay_ratio=0.5, **kwargs) == pytest.approx(0.18)


def test_wsd_scheduler_ends_the_run_at_min_lr_ratio() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    section = SimpleNamespace(name="wsd", warmup_steps=2, max_steps=10, min_lr_ratio=0.1)
    scheduler = build_lr_scheduler(optimizer, section)
    applied = []
    for _ in range(10):  # the lr each of the run's 10 updates runs at
        applied.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert applied == pytest.approx([0.5, 1, 1, 1, 1, 1, 1, 1, 0.55, 0.1])


def test_scheduler_drives_lr_and_round_trips() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    section = SimpleNamespace(name="cosine", warmup_steps=2, max_steps=6, min_lr_ratio=0.2)
    scheduler = build_lr_scheduler(optimizer, section)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(6):
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx(
        [warmup_cosine(s, warmup_steps=2, max_steps=6, min_lr_ratio=0.2) for s in range(7)]
    )
    restored = build_lr_scheduler(torch.optim.SGD([param], lr=1.0), section)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.last_epoch == 6


def test_decay_ratio_defaults_when_absent() -> None:
    fn = lr_lambda(SimpleNamespace(name="wsd", warmup_steps=0, max_steps=10, min_lr_ratio=0.0))
    assert fn(7) == 1.0 and fn(8) == pytest.approx(0.5)  # decay_ratio 0.2: the last 2 steps


def test_unknown_schedule_name() -> None:
    with pytest.raises(ValueError, match="scheduler name 'linear' is not supported"):
        lr_lambda(SimpleNamespace(name="linear"))


def test_fields_a_section_lacks_take_the_schedule_defaults() -> None:
    fn = lr_lambda(SimpleNamespace(name="cosine"))
    assert [fn(s) for s in (0, 500, 2000)] == [warmup_cosine(s) for s in (0, 500, 2000)] and fn(
        0
    ) == pytest.approx(1 / DEFAULT_WARMUP_STEPS)


def test_a_mapping_with_a_key_no_schedule_has_is_refused() -> None:
    refused = r"scheduler section: unknown key 'warmup'; the keys are decay_ratio, max_steps"
    with pytest.raises(ValueError, match=refused):
        lr_lambda({"name": "cosine", "warmup": 10, "max_steps": 100})
    # Every field of every schedule is known, also to a schedule that does not read it.
    fn = lr_lambda({"name": "constant", "warmup_steps": 4, "max_steps": 9, "decay_ratio": 0.5})
    assert fn(1) == pytest.approx(0.5) and lr_lambda("constant")(0) == warmup_constant(0)


@pytest.mark.parametrize(
    "call, error, message",
    [
        # Each returned a factor: 0.99995 (warmup ran backwards), 0.4 then 0.8, 1.0 at step 150
        # then 2.0, nan from step 100, "cannot convert float NaN to integer" (in round).
        (
            lambda: warmup_cosine(0, warmup_steps=-5),
            ValueError,
            "warmup_cosine warmup_steps: expected an integer >= 0, got -5",
        ),
        (
            lambda: warmup_cosine(0, warmup_steps=2.5),
            TypeError,
            "warmup_cosine warmup_steps: expected an integer >= 0, got 2.5",
        ),
        (
            lambda: warmup_stable_decay(0, min_lr_ratio=2.0),
            ValueError,
            "warmup_stable_decay min_lr_ratio: expected a finite number in [0, 1], got 2.0",
        ),
        (
            lambda: warmup_cosine(0, min_lr_ratio=math.nan),
            ValueError,
            "warmup_cosine min_lr_ratio: expected a finite number in [0, 1], got nan",
        ),
        (
            lambda: warmup_stable_decay(0, decay_ratio=math.nan),
            ValueError,
            "warmup_stable_decay decay_ratio: expected a finite number in (0, 1], got nan",
        ),
        (
            lambda: warmup_cosine(0, max_steps=0),
            ValueError,
            "warmup_cosine max_steps: expected an integer >= 1, got 0",
        ),
        # Returned 2.0, (-3 + 1) / -1.
        (
            lambda: warmup_constant(-3, warmup_steps=-1),
            ValueError,
            "warmup_constant step: expected an integer >= 0, got -3",
        ),
        (
            lambda: warmup_cosine(1.5),
            TypeError,
            "warmup_cosine step: expected an integer >= 0, got 1.5",
        ),
        (
            lambda: warmup_constant(0, max_steps=5),
            TypeError,
            "got an unexpected keyword argument 'max_steps'",
        ),
    ],
)
def test_a_multiplier_called_directly_checks_its_arguments(call, error, message: str) -> None:
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_multiplier_takes_numpy_integers_and_a_horizon_inside_the_warmup() -> None:
    import numpy as np

    assert warmup_cosine(np.int64(3), warmup_steps=np.int64(4)) == 1.0
    # A warmup longer than the horizon is accepted (as SchedulerConfig accepts it): it warms up.
    assert warmup_cosine(149, warmup_steps=200, max_steps=100) == pytest.approx(0.75)


def test_the_scheduler_checks_its_section_once_not_every_step(monkeypatch) -> None:
    from speedtronic_optim import schedules

    calls = []
    real = schedules.check_arguments
    monkeypatch.setattr(
        schedules, "check_arguments", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, SimpleNamespace(name="wsd", max_steps=10))
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert len(calls) == 1
