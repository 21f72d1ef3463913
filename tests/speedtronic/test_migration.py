"""A Speedtronic 2.0 user gets 2.0's behaviour unless they opt in (docs/migrating.md)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from speedtronic import runtime
from speedtronic.cli import main
from speedtronic_config import SpeedtronicConfig
from speedtronic_model import build_model, register_model, set_gradient_checkpointing
from speedtronic_optim import build_optimizer
from speedtronic_trainer import CheckpointError, CheckpointManager, MetricLogger, Trainer


def small(tmp_path: Path, **sections) -> dict:
    config = {
        "run": {"device": "cpu", "max_steps": 2, "output_dir": str(tmp_path / "run")},
        "model": {"vocab_size": 64, "max_seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
        "data": {"num_tokens": 64, "micro_batch_size": 2, "target_batch_size": 2},
        "precision": "fp32",
        "logging": {"progress": False},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values} if isinstance(values, dict) else values
    return config


# ----------------------------------------------------------------- 1: explicit step targets win


def test_an_explicit_target_wins_over_data_max_steps(tmp_path):
    config = small(tmp_path, data={"max_steps": 3})
    trainer, _ = runtime.build_runtime(config, max_steps=5)
    assert trainer.max_steps == 5
    assert trainer.scheduler.lr_lambdas[0].keywords.get("max_steps") == 3  # horizon unmoved
    assert runtime.train_from_config(config, max_steps=4).steps == 4
    assert runtime.build_runtime(config)[0].max_steps == 3  # without one, data.max_steps


def test_cli_max_steps_is_the_target_and_moves_the_schedule_horizon(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    SpeedtronicConfig.from_dict(small(tmp_path, data={"max_steps": 2})).save(config)
    assert main(["train", str(config), "--max-steps", "3"]) == 0
    state = CheckpointManager(tmp_path / "run" / "checkpoints").load_latest()
    assert state["step"] == 3 and state["config"]["scheduler"]["max_steps"] == 3
    explicit = tmp_path / "explicit.yaml"
    SpeedtronicConfig.from_dict(small(tmp_path / "e", scheduler={"max_steps": 50})).save(explicit)
    assert main(["train", str(explicit), "--max-steps", "3"]) == 0
    state = CheckpointManager(tmp_path / "e" / "run" / "checkpoints").load_latest()
    assert state["step"] == 3 and state["config"]["scheduler"]["max_steps"] == 50


# ------------------------------------------------------- 2: a reset request clears Muon's state


class ResetAt:
    """A SyncCoordinator that asks for an inner-optimizer reset at one step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def state_dict(self) -> None: ...
    def load_state_dict(self, state) -> None: ...

    def after_optimizer_step(self, model, step: int) -> bool:
        return step == self.step


@pytest.mark.parametrize("cautious", [False, True])
def test_a_reset_request_clears_muon_and_adamw_state(tmp_path, cautious):
    config = SpeedtronicConfig.from_dict(
        small(tmp_path, optimizer={"name": "muon", "cautious": cautious})
    )
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.optimizer)
    trainer = Trainer(
        model,
        optimizer,
        runtime.build_dataloader(config.data),
        device="cpu",
        config=config,
        coordinator=ResetAt(2),
        logger=MetricLogger(stream=io.StringIO()),
    )
    trainer.fit(1)
    hybrid = optimizer.base if cautious else optimizer
    assert len(hybrid.muon.state) > 0 and len(hybrid.adamw.state) > 0
    trainer.fit(2)
    assert len(hybrid.muon.state) == len(hybrid.adamw.state) == 0


# ------------------------------------------- 3: factories written for 2.0's field list still work


def test_a_factory_with_the_20_field_list_trains_with_gradient_checkpointing(tmp_path):
    switched = []

    class Tiny(torch.nn.Module):
        def __init__(self, vocab_size: int, d_model: int) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab_size, d_model)
            self.head = torch.nn.Linear(d_model, vocab_size)

        def forward(self, input_ids, labels=None, **_):
            return {"logits": self.head(self.embed(input_ids))}

        def set_gradient_checkpointing(self, enabled: bool = True) -> None:
            switched.append(enabled)

    @register_model("migration_20_factory")
    def factory(
        vocab_size, block_size, n_layer, n_head, n_kv_head, d_model, d_ff, dropout, tie_weights,
        rope_base,
    ):  # fmt: skip
        return Tiny(vocab_size, d_model)

    config = small(tmp_path, model={"name": "migration_20_factory"}, gradient_checkpointing=True)
    assert runtime.train_from_config(config).steps == 2
    assert switched == [True]  # applied after construction, through the module's own hook
    assert set_gradient_checkpointing(Tiny(4, 2)) is not None


# ------------------------------------------ 6: mode disabled / single turns DiLoCo off (2.0 way)


@pytest.mark.parametrize("mode", ["disabled", "single"])
def test_distributed_mode_disabled_or_single_builds_no_coordinator(tmp_path, mode):
    config = small(tmp_path, distributed={"enabled": True, "mode": mode})
    trainer, _ = runtime.build_runtime(config)
    assert trainer.coordinator is None
    assert runtime.train_from_config(config).steps == 2


# ------------------------------------------------------------ 7: 2.0 checkpoints can be resumed


def write_20_checkpoint(tmp_path: Path, config: dict) -> tuple[Path, tuple]:
    """Train 2 steps, then rewrite the checkpoint the way 2.0 wrote it (a pickled NumPy state)."""
    trainer, manager = runtime.build_runtime(config)
    trainer.fit(2)
    np.random.seed(11)
    numpy_state = np.random.get_state()
    legacy = {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": None,
        "step": 2,
        "samples": 4,
        "tokens": 64,
        "rng": {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()},
        "config": SpeedtronicConfig.from_dict(config).to_dict(redact_secrets=True),
        "coordinator": None,
    }
    path = manager.directory / "step_2.pt"
    torch.save(legacy, path)
    return path, numpy_state


def test_a_checkpoint_written_by_20_resumes(tmp_path):
    config = small(tmp_path, run={"max_steps": 4})
    _, numpy_state = write_20_checkpoint(tmp_path, config)
    np.random.seed(0)
    trainer, _ = runtime.build_runtime(config, resume=True)
    assert trainer.step == 2 and trainer.tokens == 64
    assert np.array_equal(np.random.get_state()[1], numpy_state[1])
    assert trainer.fit().steps == 4


def test_weights_only_loading_still_refuses_other_objects(tmp_path):
    path = tmp_path / "step_1.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}, "evil": np.float64(1.0)}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        CheckpointManager(tmp_path).load(path)


# ------------------------------------------------------ 10: reporting never fails a finished run


def test_a_finished_run_exits_0_when_the_sample_prompt_cannot_be_encoded(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    # 8 ids hold no byte of text, not even the newline the summary falls back to.
    SpeedtronicConfig.from_dict(small(tmp_path, model={"vocab_size": 8})).save(config)
    assert main(["train", str(config)]) == 0
    out = capsys.readouterr().out
    assert "trained 2 steps" in out and "sample: skipped" in out


# ------------------------------------------- 9: DiLoCo's blocking policies are opt-in, like 2.0


def test_diloco_drift_policies_are_off_by_default_and_on_in_the_shipped_config():
    defaults = SpeedtronicConfig().distributed
    assert (defaults.staleness_limit, defaults.max_local_rounds) == (None, None)
    assert defaults.global_wait_timeout == 0.0
    root = Path(__file__).resolve().parents[2]
    shipped = SpeedtronicConfig.from_yaml(root / "configs" / "diloco.yaml").distributed
    assert (shipped.staleness_limit, shipped.max_local_rounds) == (2, 4)
    assert shipped.global_wait_timeout > 0


def test_parse_delta_path_keeps_its_20_return_value():
    from speedtronic.distributed.tensors import parse_delta_path
    from speedtronic_diloco.tensors import delta_path

    assert parse_delta_path(delta_path("node-1", 1500, 7)) == ("node-1", 1500)
    assert parse_delta_path("deltas/../step-1-base-1.safetensors") is None
