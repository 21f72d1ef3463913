"""Every public name and signature of Speedtronic 2.0 still holds at its 2.0 import path.

spec_api_2_0.json was generated once from the 2.0 documentation's source inventory by
tools/extract_spec_api.py and is committed, so nothing of the 2.0 surface can drift unnoticed.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import time
from pathlib import Path

import pytest

API = json.loads((Path(__file__).parent / "spec_api_2_0.json").read_text(encoding="utf-8"))
# Defaults the inventory spells as expressions rather than literals, evaluated in this namespace.
_DEFAULT_NAMESPACE = {"time": time}


def _signatures():
    for module, entry in sorted(API.items()):
        for name, sig in sorted(entry["functions"].items()):
            yield pytest.param(module, None, name, sig["params"], id=f"{module}.{name}")
        for cls, methods in sorted(entry["classes"].items()):
            for name, sig in sorted(methods.items()):
                yield pytest.param(module, cls, name, sig["params"], id=f"{module}.{cls}.{name}")


def _names():
    for module, entry in sorted(API.items()):
        names = set(entry["names"]) | set(entry["functions"]) | set(entry["classes"])
        for name in sorted(names):
            yield pytest.param(module, name, id=f"{module}.{name}")


@pytest.mark.parametrize("module, name", list(_names()))
def test_every_20_name_resolves_at_its_20_path(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def _expected_default(source: str):
    try:
        return ast.literal_eval(source)
    except ValueError:
        return eval(source, _DEFAULT_NAMESPACE)  # noqa: S307 - our own committed inventory


def _fields():
    for module, entry in sorted(API.items()):
        for cls, names in sorted(entry["fields"].items()):
            yield pytest.param(module, cls, names, id=f"{module}.{cls}")


@pytest.mark.parametrize("module, cls, names", list(_fields()))
def test_every_20_dataclass_takes_its_20_fields_in_order(module, cls, names):
    # 2.0 callers may pass them positionally: a 2.1 field belongs after them or keyword-only.
    owner = getattr(importlib.import_module(module), cls)
    if dataclasses.is_dataclass(owner):
        declared = [field.name for field in dataclasses.fields(owner)]
        assert set(names) <= set(declared), f"missing: {set(names) - set(declared)}"
    parameters = list(inspect.signature(owner).parameters.values())
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional[: len(names)] == names


@pytest.mark.parametrize("module, cls, name, params", list(_signatures()))
def test_every_20_signature_is_unchanged(module, cls, name, params):
    owner = importlib.import_module(module)
    if cls is not None:
        owner = getattr(owner, cls)
        raw = inspect.getattr_static(owner, name)
        if isinstance(raw, property):
            return  # 2.0 documented some properties as methods; the attribute exists
        if isinstance(raw, (classmethod, staticmethod)):
            raw = raw.__func__
        target = raw
    else:
        target = getattr(owner, name)
    _check_compatible(list(inspect.signature(target).parameters.values()), params)


def _check_compatible(actual: list[inspect.Parameter], params: list) -> None:
    """2.0 calls must still bind: same positional names in order, same keywords and defaults.

    Extensions are allowed only where no 2.0 call can notice them: new parameters with defaults
    after the 2.0 positional ones, new keyword-only parameters, defaults for required ones.
    """
    by_name = {p.name: p for p in actual}
    positional = [p for p in params if p[1] in ("positional_only", "positional_or_keyword")]
    assert [p.name for p in actual[: len(positional)]] == [p[0] for p in positional], "order"
    for name, kind, default in params:
        assert name in by_name, f"2.0 parameter {name!r} is missing"
        param = by_name[name]
        assert param.kind.name.lower() == kind, f"{name}: kind {param.kind.name.lower()}"
        # A parameter 2.0 required may gain a default: every 2.0 call passes it anyway.
        if default is not None:
            assert param.default == _expected_default(default), f"{name}: default"
    known = {p[0] for p in params}
    for param in actual:
        if param.name not in known and param.kind.name not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            assert param.default is not inspect.Parameter.empty, (
                f"new {param.name!r} needs a default"
            )


def test_trainer_train_is_a_20_name_of_the_meta_package_only(tmp_path):
    # The inventory lists it as a class attribute, which the signature table above cannot hold.
    import speedtronic_trainer
    from speedtronic.runtime import build_runtime
    from speedtronic.trainer import Trainer

    assert Trainer.train is speedtronic_trainer.Trainer.fit
    assert not hasattr(speedtronic_trainer.Trainer, "train")  # one name per method there
    run = {"device": "cpu", "output_dir": str(tmp_path)}
    trainer, _ = build_runtime({"data": {"synthetic": True}, "run": run})
    assert isinstance(trainer, Trainer)
