"""The 2.0 import surface: every path imports, hands out the micro-packages' own objects, lazily."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

import speedtronic

SHIMS = {
    "speedtronic.config": "speedtronic_config",
    "speedtronic.optimizers": "speedtronic_optim",
    "speedtronic.data": "speedtronic_data",
    "speedtronic.model": "speedtronic_model.model",
    "speedtronic.registry": "speedtronic_model.registry",
    "speedtronic.module_utils": "speedtronic_model.module_utils",
    "speedtronic.precision": "speedtronic_systems.precision",
    "speedtronic.shapes": "speedtronic_systems.shapes",
    "speedtronic.scheduling": "speedtronic_systems.scheduling",
    "speedtronic.trainer": "speedtronic_trainer.trainer",
    "speedtronic.checkpoint": "speedtronic_trainer.checkpoint",
    "speedtronic.profiling": "speedtronic_trainer.profiling",
    "speedtronic.hooks": "speedtronic_trainer.hooks",
    "speedtronic.integrations": "speedtronic_trainer.integrations",
    "speedtronic.distributed": "speedtronic_diloco",
    "speedtronic.distributed.diloco": "speedtronic_diloco.diloco",
    "speedtronic.distributed.hub": "speedtronic_diloco.hub",
    "speedtronic.distributed.outer": "speedtronic_diloco.outer",
    "speedtronic.distributed.tensors": "speedtronic_diloco.tensors",
}


@pytest.mark.parametrize("path, source", sorted(SHIMS.items()))
def test_every_20_path_hands_out_the_same_objects(path, source):
    shim, origin = importlib.import_module(path), importlib.import_module(source)
    assert shim.__all__, path
    for name in shim.__all__:
        assert getattr(shim, name) is getattr(origin, name), f"{path}.{name} is a copy"


def test_top_level_names_resolve_to_the_micro_package_objects():
    from speedtronic_config import SpeedtronicConfig
    from speedtronic_optim import Muon
    from speedtronic_trainer import Trainer

    assert speedtronic.SpeedtronicConfig is SpeedtronicConfig
    assert speedtronic.Muon is Muon
    assert speedtronic.Trainer is Trainer
    for name in speedtronic.__all__:
        assert getattr(speedtronic, name) is not None


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        speedtronic.Nope  # noqa: B018


def test_version_is_the_installed_distribution_version():
    assert speedtronic.__version__ == importlib.metadata.version("speedtronic")
    assert speedtronic.__version__.startswith("2.0.")


def test_import_is_lazy_and_validate_needs_no_torch(tmp_path):
    code = (
        "import sys, speedtronic; assert 'torch' not in sys.modules, 'import speedtronic pulled "
        "torch'; "
        "speedtronic.SpeedtronicConfig; assert 'torch' not in sys.modules, 'config pulled torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 3\n")
    code = (
        f"import sys; from speedtronic.cli import main; rc = main(['validate', {str(config)!r}]); "
        "assert 'torch' not in sys.modules, 'validate pulled torch'; sys.exit(rc)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
