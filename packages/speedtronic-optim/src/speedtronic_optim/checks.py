"""Constructor-time argument checks: one-line errors naming the argument and what it needs."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

NS_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def show_value(value: Any) -> str:
    """Return a value as error text on one short line: a tensor by its shape, a long repr cut."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _interval(low: float, high: float, open_low: bool, open_high: bool) -> str:
    if math.isinf(high):
        return f"{'>' if open_low else '>='} {low:g}"
    return f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"


def check_number(
    where: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> None:
    """Raise unless ``value`` is a finite real number (or one-element tensor) in the range."""
    expected = f"a finite number {_interval(low, high, open_low, open_high)}"
    # torch.optim takes a one-element tensor lr (for capturable / compiled steps).
    is_scalar = isinstance(value, torch.Tensor) and value.numel() == 1
    if not is_scalar and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{where}: expected {expected}, got {show_value(value)}")
    number = float(value)
    above = number > low if open_low else number >= low
    below = number < high if open_high else number <= high
    if not (math.isfinite(number) and above and below):
        raise ValueError(f"{where}: expected {expected}, got {show_value(value)}")


def check_integer(where: str, value: Any, low: int) -> None:
    """Raise unless ``value`` is an int (not a bool or float) of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: expected an integer >= {low}, got {show_value(value)}")
    if value < low:
        raise ValueError(f"{where}: expected an integer >= {low}, got {value!r}")


def check_betas(where: str, value: Any) -> None:
    """Raise unless ``value`` is a pair of numbers in [0, 1)."""
    message = f"{where}: expected a pair (beta1, beta2) in [0, 1), got {show_value(value)}"
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(message)
    if len(value) != 2:
        raise ValueError(message)
    for index, beta in enumerate(value):
        check_number(f"{where}[{index}]", beta, 0.0, 1.0, open_high=True)


def check_flag(where: str, value: Any, *, optional: bool = False) -> None:
    """Raise unless ``value`` is True or False (or None when ``optional``)."""
    if not (isinstance(value, bool) or (optional and value is None)):
        expected = "True, False or None" if optional else "True or False"
        raise TypeError(f"{where}: expected {expected}, got {show_value(value)}")


def check_dtype(where: str, value: Any) -> None:
    """Raise unless ``value`` is None or a floating torch.dtype Newton–Schulz can run in."""
    expected = "None or one of " + ", ".join(map(str, NS_DTYPES))
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"{where}: expected {expected}, got {show_value(value)}")
    if value is not None and value not in NS_DTYPES:
        raise ValueError(f"{where}: expected {expected}, got {value}")


def check_parameters(where: str, value: Any) -> None:
    """Raise when a module, a single tensor or group, or no iterable at all is passed where an
    iterable of parameters is wanted.
    """
    expected = f"{where}: expected an iterable of parameters or param groups"
    if isinstance(value, Mapping):  # iterating it would take its keys ("params") for parameters
        raise TypeError(f"{expected}, got a dict; pass [group]")
    if isinstance(value, torch.Tensor):  # iterating it would take each row for a parameter
        raise TypeError(
            f"{expected}, got a single tensor of shape {tuple(value.shape)}; pass [tensor]"
        )
    # A ParameterList iterates over its parameters, as torch.optim takes it; other modules not.
    if isinstance(value, nn.Module) and not isinstance(value, nn.ParameterList):
        raise TypeError(
            f"{expected}, got a {type(value).__name__} module; pass its .parameters() "
            "(or route_parameters(model).muon for Muon)"
        )
    if not isinstance(value, Iterable):
        raise TypeError(f"{expected}, got {show_value(value)}; pass model.parameters() or a list")


def check_model(where: str, value: Any) -> None:
    """Raise unless ``value`` is a module: routing reads its modules' kinds and names."""
    if not isinstance(value, nn.Module):
        raise TypeError(
            f"{where}: expected a torch.nn.Module, got {type(value).__name__}; pass the model "
            "(routing needs its modules), or build make_adamw/Muon from parameters"
        )


_NON_NEGATIVE = functools.partial(check_number, low=0.0)
_FRACTION = functools.partial(check_number, low=0.0, high=1.0, open_high=True)
# Every checked argument or section field, by name (Muon's and AdamW's prefixes dropped).
_RULES: dict[str, Callable[[str, Any], None]] = {
    "lr": _NON_NEGATIVE,
    "eps": _NON_NEGATIVE,
    # Muon+ divides rows and columns by norm + norm_eps: 0 makes a zero row (a dead unit) NaN.
    "norm_eps": functools.partial(check_number, low=0.0, open_low=True),
    "weight_decay": _NON_NEGATIVE,
    "momentum": _FRACTION,
    "betas": check_betas,
    "ns_steps": functools.partial(check_integer, low=1),
    "ns_dtype": check_dtype,
    "nesterov": check_flag,
    "muon_plus": check_flag,
    "transposed": check_flag,
    "cautious": check_flag,
    "fused": functools.partial(check_flag, optional=True),
    "distributed": functools.partial(check_flag, optional=True),
    "warmup_steps": functools.partial(check_integer, low=0),
    "max_steps": functools.partial(check_integer, low=1),
    "min_lr_ratio": functools.partial(check_number, low=0.0, high=1.0),
    "decay_ratio": functools.partial(check_number, low=0.0, high=1.0, open_low=True),
}


def check_arguments(owner: str, **values: Any) -> None:
    """Raise TypeError or ValueError ``"{owner} {name}: expected ..., got ..."`` for a bad value."""
    for name, value in values.items():
        rule = _RULES.get(name) or _RULES[name.removeprefix("muon_").removeprefix("adamw_")]
        rule(f"{owner} {name}", value)


def as_section(section: Any, owner: str, fields: Collection[str]) -> Any:
    """Return ``section``; a namespace of its items when it is a mapping (parsed YAML/JSON), whose
    keys must be among ``fields``; or of ``name`` alone for a string (YAML's ``optimizer: muon``).
    """
    if isinstance(section, str):
        return SimpleNamespace(name=section)
    if not isinstance(section, Mapping):
        return section  # any object: only the fields read are looked up
    unknown = sorted((key for key in section if key not in fields), key=str)
    if unknown:  # a misspelt key would leave its setting at the default, silently
        raise ValueError(
            f"{owner}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(fields))}"
        )
    return SimpleNamespace(**section)
