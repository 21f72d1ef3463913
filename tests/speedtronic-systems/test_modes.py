"""switch_to_eval: eval mode for a while, then each module's own mode back."""

from __future__ import annotations

import torch.nn as nn

from speedtronic_systems import switch_to_eval


def test_each_module_gets_its_own_mode_back_after_the_models_own_train_runs():
    calls = []

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.frozen, self.head = nn.Dropout(0.5), nn.Dropout(0.5)

        def train(self, mode=True):  # an override still sees both switches
            calls.append(mode)
            return super().train(mode)

    net = Net()
    net.frozen.eval()  # kept in eval mode on purpose
    restore = switch_to_eval(net)
    assert not any(module.training for module in net.modules())
    restore()
    assert calls == [False, True]
    assert net.training and net.head.training and not net.frozen.training
