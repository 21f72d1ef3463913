"""2.0 import path `speedtronic.trainer`: speedtronic_trainer's loop and its 2.0 names."""

from __future__ import annotations

import speedtronic_trainer
from speedtronic_trainer.trainer import SyncCoordinator, TrainResult


class Trainer(speedtronic_trainer.Trainer):
    """speedtronic_trainer.Trainer with 2.0's second name for fit, `train`."""

    train = speedtronic_trainer.Trainer.fit


TrainingEngine = Trainer
SpeedtronicTrainer = Trainer

__all__ = [
    "SpeedtronicTrainer",
    "SyncCoordinator",
    "TrainResult",
    "Trainer",
    "TrainingEngine",
]
