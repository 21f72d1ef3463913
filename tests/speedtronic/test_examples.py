"""The shipped configs validate and the Python API example runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from speedtronic_config import SpeedtronicConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["quickstart", "smoke", "v2_smoke"])
def test_shipped_configs_load(name):
    config = SpeedtronicConfig.from_yaml(ROOT / "configs" / f"{name}.yaml")
    assert config.run.max_steps > 0


def test_quickstart_cuda_overlay_gives_the_larger_bf16_model():
    from speedtronic.cli import _cuda_overrides
    from speedtronic_config import apply_overrides
    from speedtronic_config.loading import read_file

    overrides = _cuda_overrides(str(ROOT / "configs" / "quickstart-cuda.yaml"))
    config = SpeedtronicConfig.from_dict(
        apply_overrides(read_file(ROOT / "configs" / "quickstart.yaml"), overrides)
    )
    assert (config.model.n_layer, config.model.d_model, config.model.max_seq_len) == (8, 512, 512)
    assert config.data.block_size == 512  # the data follows the model's context
    assert config.precision.mode == "bf16" and config.compile
    # The CPU-tuned rates are not carried to a size they were not measured at.
    assert (config.optimizer.lr, config.optimizer.adamw_lr) == (0.002, None)


def test_v2_smoke_config_trains(tmp_path):
    from speedtronic.runtime import train_from_config

    config = SpeedtronicConfig.from_yaml(ROOT / "configs" / "v2_smoke.yaml")
    config.run.output_dir = str(tmp_path)
    result = train_from_config(config)
    assert result.steps == 4 and (tmp_path / "checkpoints" / "step_4.pt").exists()


def test_reference_example_trains_and_resumes(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_reference.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "first run: step 3" in result.stdout and "resumed run: step 6" in result.stdout
    # The shipped example runs clean: no warning asking the reader to fix its settings.
    assert "WARNING" not in result.stdout + result.stderr, result.stdout


def test_optimizers_doc_example_keeps_the_head_on_adamw():
    import re

    section = (ROOT / "docs" / "optimizers.md").read_text().split("## Using it alone", 1)[1]
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S)[1], namespace)
    from speedtronic_optim import route_parameters

    routing = route_parameters(namespace["model"])
    # the output head: the Linear(64, 256), whatever the example names it
    head = [name for name, p in namespace["model"].named_parameters() if p.shape == (256, 64)]
    assert head and set(head) <= set(routing.adamw_names), routing.muon_names
