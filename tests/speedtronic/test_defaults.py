"""Every setting has one default: each consumer built without a config sees the config's own.

speedtronic-config defines each setting once. The packages that may depend on it read the typed
section (or build it through the same dataclass); speedtronic-optim stays config-free, so its
constructors are the one source of optimizer and schedule defaults and the config must agree.
"""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
import torch

from speedtronic_config import SpeedtronicConfig, resolve_section
from speedtronic_config.normalize import SECTIONS
from speedtronic_data import build_dataloader
from speedtronic_diloco import DumbDiLoCoCoordinator
from speedtronic_model import GPTConfig, build_model
from speedtronic_optim import (
    HybridOptimizer,
    build_lr_scheduler,
    build_optimizer,
    make_adamw,
    warmup_stable_decay,
)
from speedtronic_systems.precision import resolve_precision
from speedtronic_trainer import CheckpointManager, MetricLogger, Trainer

DEFAULTS = SpeedtronicConfig()


def _values(section) -> dict:
    return {f.name: getattr(section, f.name) for f in fields(section)}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_missing_section_resolves_to_the_configs_defaults(name):
    assert _values(resolve_section(None, name)) == _values(getattr(DEFAULTS, name))


def test_every_consumer_without_a_config_sees_the_same_defaults(tmp_path):
    model = torch.nn.Linear(4, 4)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), [], device="cpu")
    for name in SECTIONS:  # every field of every section, as the trainer reads it
        assert _values(getattr(trainer.config, name)) == _values(getattr(DEFAULTS, name)), name
    assert trainer.precision == resolve_precision(DEFAULTS.precision, "cpu")

    loader = build_dataloader(None)
    data = DEFAULTS.data
    assert (loader.batch_size, loader.drop_last, loader.num_workers) == (
        data.micro_batch_size,
        data.drop_last,
        data.num_workers,
    )
    assert len(loader.dataset) == data.num_tokens and loader.dataset.block_size == data.block_size

    coordinator = DumbDiLoCoCoordinator(None, model, state_dir=tmp_path)
    assert _values(coordinator.settings) == _values(DEFAULTS.distributed)

    logger = MetricLogger()
    logging = DEFAULTS.logging
    assert (logger.level, logger.file, logger.json_file, logger.every_steps) == (
        logging.level,
        logging.file,
        logging.json_file,
        logging.every_steps,
    )
    manager = CheckpointManager(tmp_path)
    checkpoint = DEFAULTS.checkpoint
    assert (manager.every_steps, manager.keep_last, manager.enabled) == (
        checkpoint.every_steps,
        checkpoint.keep_last,
        checkpoint.enabled,
    )


def test_the_reference_model_takes_the_model_sections_defaults():
    config = GPTConfig()
    section = DEFAULTS.model
    assert config.section_fields() == {
        k: v for k, v in _values(section).items() if k in config.section_fields()
    }
    assert build_model(None).config == config


def _signature_defaults(function) -> dict:
    return {
        name: param.default
        for name, param in inspect.signature(function).parameters.items()
        if param.default is not inspect.Parameter.empty
    }


def test_the_optimizer_sections_defaults_are_the_constructors_defaults():
    optimizer = DEFAULTS.optimizer
    adamw = _signature_defaults(make_adamw)
    assert {k: adamw[k] for k in ("lr", "eps", "weight_decay", "fused")} == {
        "lr": optimizer.lr,
        "eps": optimizer.eps,
        "weight_decay": optimizer.weight_decay,
        "fused": optimizer.fused,
    }
    assert tuple(adamw["betas"]) == tuple(optimizer.betas)
    hybrid = _signature_defaults(HybridOptimizer.__init__)
    assert (hybrid["muon_lr"], hybrid["adamw_lr"]) == (optimizer.lr, optimizer.lr)
    for field in ("muon_momentum", "muon_ns_steps", "muon_norm_eps", "muon_plus"):
        assert hybrid[field] == getattr(optimizer, field), field


def test_the_scheduler_sections_defaults_are_the_schedule_functions_defaults():
    scheduler = SpeedtronicConfig.from_dict({"scheduler": {"name": "wsd"}}).scheduler
    defaults = _signature_defaults(warmup_stable_decay)
    for field in ("warmup_steps", "min_lr_ratio", "decay_ratio"):
        assert defaults[field] == getattr(scheduler, field), field
    # An unset horizon follows the run's step target, whose default is the schedule default.
    assert defaults["max_steps"] == DEFAULTS.run.max_steps == DEFAULTS.scheduler.max_steps


def test_the_builders_take_every_field_of_the_sections_as_a_mapping():
    # speedtronic-optim lists the fields it knows without the config: a config's own mapping of
    # either section (as from YAML) must pass its unknown-key check.
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4))
    values = SpeedtronicConfig.from_dict({"optimizer": {"name": "muon"}}).to_dict()
    optimizer = build_optimizer(model, values["optimizer"])
    build_lr_scheduler(optimizer, {**values["scheduler"], "max_steps": 10})
