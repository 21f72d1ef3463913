from __future__ import annotations

import subprocess
import sys

import pytest

import speedtronic_diloco


def test_public_names_resolve_to_the_defining_modules():
    from speedtronic_diloco import diloco, hub, outer

    for name in speedtronic_diloco.__all__:
        assert getattr(speedtronic_diloco, name) is not None
    assert speedtronic_diloco.DumbDiLoCoCoordinator is diloco.DumbDiLoCoCoordinator
    assert speedtronic_diloco.HubClient is hub.HubClient
    assert speedtronic_diloco.MasterOuterLoop is outer.MasterOuterLoop
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = speedtronic_diloco.missing


def test_import_and_the_test_server_stay_light():
    code = (
        "import sys, speedtronic_diloco, speedtronic_diloco.testing.hub_server; "
        "print(sorted(m for m in ('torch', 'huggingface_hub') if m in sys.modules))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )


@pytest.mark.parametrize(
    "module", ["diloco", "group", "hub", "identity", "outage", "outer", "tensors", "transport"]
)
def test_every_module_declares_its_public_names(module):
    from importlib import import_module

    mod = import_module(f"speedtronic_diloco.{module}")
    assert mod.__all__ and all(hasattr(mod, name) for name in mod.__all__)
