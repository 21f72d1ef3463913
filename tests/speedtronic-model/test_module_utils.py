from __future__ import annotations

import warnings

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


def test_a_transformers_model_is_switched_by_its_current_method():
    """transformers 5.x deprecated gradient_checkpointing_enable/disable (FutureWarning; gone in
    6) for activation_checkpointing_enable/disable: the helper calls the current pair.
    """
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    if not hasattr(model, "activation_checkpointing_enable"):
        pytest.skip("this transformers has only gradient_checkpointing_enable")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        set_gradient_checkpointing(model, True)
        assert model.model.layers[0].gradient_checkpointing
        set_gradient_checkpointing(model, False)
    assert not model.model.layers[0].gradient_checkpointing
