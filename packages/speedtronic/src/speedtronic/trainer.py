"""2.0 import path `speedtronic.trainer`: speedtronic_trainer's loop and its 2.0 aliases."""

from __future__ import annotations

from speedtronic_trainer.trainer import SyncCoordinator, Trainer, TrainResult

TrainingEngine = Trainer
SpeedtronicTrainer = Trainer

__all__ = [
    "SpeedtronicTrainer",
    "SyncCoordinator",
    "TrainResult",
    "Trainer",
    "TrainingEngine",
]
