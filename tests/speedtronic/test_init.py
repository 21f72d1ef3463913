"""The 2.0 import surface: every path imports, hands out the micro-packages' own objects, lazily."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import subprocess
import sys

import pytest

import speedtronic

SHIMS = [
    "speedtronic.config",
    "speedtronic.optimizers",
    "speedtronic.data",
    "speedtronic.model",
    "speedtronic.registry",
    "speedtronic.module_utils",
    "speedtronic.precision",
    "speedtronic.shapes",
    "speedtronic.scheduling",
    "speedtronic.trainer",
    "speedtronic.checkpoint",
    "speedtronic.profiling",
    "speedtronic.hooks",
    "speedtronic.integrations",
    "speedtronic.distributed",
    "speedtronic.distributed.diloco",
    "speedtronic.distributed.hub",
    "speedtronic.distributed.outer",
    "speedtronic.distributed.tensors",
]
# 2.0 signatures and names the micro-packages changed or dropped: thin wrappers, and the Trainer
# subclass that adds `train`, which live only in the 2.0 modules.
WRAPPERS = {
    "speedtronic.config.load_config",
    "speedtronic.config.load_yaml_config",
    "speedtronic.data.build_dataloader",
    "speedtronic.distributed.tensors.parse_delta_path",
    "speedtronic.optimizers.build_v2_optimizer",
    "speedtronic.trainer.SpeedtronicTrainer",
    "speedtronic.trainer.Trainer",
    "speedtronic.trainer.TrainingEngine",
}


@pytest.mark.parametrize("path", SHIMS)
def test_every_20_path_hands_out_the_micro_packages_objects(path):
    shim = importlib.import_module(path)
    assert shim.__all__, path
    for name in shim.__all__:
        value = getattr(shim, name)
        origin = getattr(value, "__module__", None)
        if f"{path}.{name}" in WRAPPERS or not (inspect.isclass(value) or callable(value)):
            continue
        if origin in ("typing", "collections.abc", "builtins"):
            continue  # a 2.0 type alias such as profiling.Metric
        assert origin.startswith("speedtronic_"), f"{path}.{name} is defined in {origin}"
        assert getattr(importlib.import_module(origin), value.__name__) is value, name


def test_top_level_names_resolve_to_the_micro_package_objects():
    from speedtronic_config import SpeedtronicConfig
    from speedtronic_optim import Muon
    from speedtronic_trainer import Trainer

    assert speedtronic.SpeedtronicConfig is SpeedtronicConfig
    assert speedtronic.Muon is Muon
    assert issubclass(speedtronic.Trainer, Trainer)  # adds only 2.0's `train`
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


def test_registry_stays_the_model_registry_after_its_module_is_imported():
    # 2.0 bound `speedtronic.registry` to the ModelRegistry instance; importing the submodule of
    # the same name (as any `from speedtronic.registry import ...` does) must not rebind it.
    code = (
        "import speedtronic, speedtronic.registry as via_import; "
        "from speedtronic.registry import ModelRegistry, registry; "
        "assert speedtronic.registry is registry, speedtronic.registry; "
        "assert via_import is registry, via_import; "
        "from speedtronic import registry as via_from; assert via_from is registry; "
        "assert isinstance(registry, ModelRegistry)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_20_submodules_are_attributes_of_the_package():
    # 2.0's `import speedtronic` imported config, optimizers, shapes, ... so
    # `speedtronic.config.load_config(...)` worked without importing the submodule; now lazily.
    code = (
        "import sys, speedtronic; "
        "assert speedtronic.config.load_config({'max_steps': 3}).run.max_steps == 3; "
        "assert 'torch' not in sys.modules, 'speedtronic.config pulled torch'; "
        f"names = {[path.removeprefix('speedtronic.') for path in SHIMS]!r}; "
        "mods = [n for n in names if '.' not in n and n != 'registry'] + ['runtime', 'cli']; "
        "assert all(getattr(speedtronic, n) is sys.modules['speedtronic.' + n] for n in mods); "
        "assert speedtronic.optimizers.Muon is speedtronic.Muon; "
        "assert speedtronic.distributed.tensors is sys.modules['speedtronic.distributed.tensors']"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
