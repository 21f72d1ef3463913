"""Eval mode for a while, then each module given back its own mode."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn


def switch_to_eval(model: nn.Module) -> Callable[[], None]:
    """Put model in eval mode (through its own eval()); return the call that gives every module
    back the mode it had. model.train(was_training) alone would also switch on the parts a model
    keeps in eval mode on purpose (a frozen backbone's dropout or batch norm).
    """
    was_training = model.training
    modes = [(module, module.training) for module in model.modules()]
    model.eval()

    def restore() -> None:
        model.train(was_training)  # as eval() went: through any train() override
        for module, training in modes:
            module.training = training

    return restore


__all__ = ["switch_to_eval"]
