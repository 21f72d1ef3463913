from __future__ import annotations

import subprocess
import sys

import speedtronic_config


def test_public_names_are_exported():
    for name in speedtronic_config.__all__:
        assert hasattr(speedtronic_config, name), name
    assert speedtronic_config.__version__ == "2.1.0"
    assert issubclass(speedtronic_config.ConfigError, ValueError)


def test_importing_and_using_the_package_never_imports_torch():
    code = (
        "import sys, speedtronic_config as c; c.SpeedtronicConfig.load('max_steps: 3').to_yaml(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
