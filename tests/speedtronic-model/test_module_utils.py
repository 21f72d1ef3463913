from __future__ import annotations

import pytest
import torch.nn as nn

from speedtronic_model.model import ReferenceTransformer
from speedtronic_model.module_utils import GradientCheckpointingWarning, set_gradient_checkpointing


class OwnHook(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bool] = []

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        self.calls.append(enabled)


class HuggingFaceStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enabled = False

    def gradient_checkpointing_enable(self) -> None:
        self.enabled = True

    def gradient_checkpointing_disable(self) -> None:
        self.enabled = False


class Failing(nn.Module):
    def set_gradient_checkpointing(self, enabled: bool) -> None:
        raise RuntimeError("boom")


def test_calls_the_module_hook_and_returns_the_module():
    module = OwnHook()
    assert set_gradient_checkpointing(module) is module
    set_gradient_checkpointing(module, False)
    assert module.calls == [True, False]


def test_uses_the_hugging_face_pair():
    module = HuggingFaceStyle()
    set_gradient_checkpointing(module, True)
    assert module.enabled
    set_gradient_checkpointing(module, False)
    assert not module.enabled


def test_reference_transformer_opts_in():
    model = ReferenceTransformer(vocab_size=16, block_size=4, n_layer=2, n_head=2, d_model=8)
    set_gradient_checkpointing(model, True)
    assert all(block.gradient_checkpointing for block in model.blocks)


def test_unsupported_module_warns_when_enabling_only(recwarn):
    with pytest.warns(
        GradientCheckpointingWarning, match="Linear has no set_gradient_checkpointing"
    ):
        set_gradient_checkpointing(nn.Linear(2, 2), True)
    set_gradient_checkpointing(nn.Linear(2, 2), False)
    assert not [w for w in recwarn if issubclass(w.category, GradientCheckpointingWarning)]


def test_failing_hook_warns_instead_of_raising():
    module = Failing()
    with pytest.warns(
        GradientCheckpointingWarning,
        match="Failing.set_gradient_checkpointing\\(True\\) failed.*boom",
    ):
        assert set_gradient_checkpointing(module) is module
