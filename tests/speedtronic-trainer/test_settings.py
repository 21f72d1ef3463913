from __future__ import annotations

import pytest
from trainer_testkit import make_config

from speedtronic_trainer import TrainerSettings


def test_defaults_without_config():
    settings = TrainerSettings.from_config(None)
    assert settings == TrainerSettings()
    assert (
        settings.nonfinite_loss == "stop" and settings.save_final and settings.reset_inner_optimizer
    )


def test_values_are_read_from_the_config_tree():
    config = make_config(
        run={"max_steps": 9, "nonfinite_loss": "skip"},
        data={"target_batch_size": 8, "micro_batch_size": 2, "eval_every": 5, "eval_steps": 2},
        optimizer={"grad_clip": 1.0},
        distributed={"reset_inner_optimizer": False},
        checkpoint={"save_final": False, "save_on_signal": False},
        logging={"progress": False},
        compile={"enabled": True},  # the section form `compile: {enabled: true}`
        gradient_checkpointing=True,
        ooo_backprop=False,
        ooo_streams=2,
    )
    s = TrainerSettings.from_config(config)
    assert (s.accumulation_steps, s.max_steps, s.nonfinite_loss, s.grad_clip) == (4, 9, "skip", 1.0)
    assert (
        s.eval_every,
        s.eval_steps,
        s.reset_inner_optimizer,
        s.save_final,
        s.save_on_signal,
    ) == (5, 2, False, False, False)
    assert (s.compile, s.gradient_checkpointing, s.ooo_backprop, s.ooo_streams, s.progress) == (
        True,
        True,
        False,
        2,
        False,
    )


def test_explicit_accumulation_steps_property_wins():
    config = make_config(
        data={"accumulation_steps": 3, "target_batch_size": 8, "micro_batch_size": 2}
    )
    assert TrainerSettings.from_config(config).accumulation_steps == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"accumulation_steps": 0}, "accumulation_steps"),
        ({"eval_every": 0}, "data.eval_every"),
        ({"eval_steps": -1}, "data.eval_steps"),
    ],
)
def test_invalid_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainerSettings(**kwargs)


def test_a_real_speedtronic_config_is_read():
    from speedtronic_config import SpeedtronicConfig

    config = SpeedtronicConfig.from_dict(
        {
            "run": {"max_steps": 12, "nonfinite_loss": "skip"},
            "data": {"micro_batch_size": 2, "target_batch_size": 6, "eval_every": 4},
            "checkpoint": {"save_final": False},
            "logging": {"progress": False},
            "compile": True,
        }
    )
    s = TrainerSettings.from_config(config)
    assert (s.accumulation_steps, s.max_steps, s.nonfinite_loss, s.eval_every) == (3, 12, "skip", 4)
    assert (s.save_final, s.progress, s.compile, s.save_on_signal) == (False, False, True, True)
