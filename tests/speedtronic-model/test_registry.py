from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from speedtronic_config import ConfigError, ModelConfig
from speedtronic_model.registry import ModelRegistry, build_model, register_model, registry


@dataclass
class Section:
    """A ModelConfig look-alike (builders take any object with the fields)."""

    name: str = "reference_transformer"
    vocab_size: int = 64
    max_seq_len: int = 8
    n_layer: int = 1
    n_head: int = 2
    n_kv_head: int | None = None
    d_model: int = 16
    d_ff: int | None = None
    dropout: float = 0.0
    tie_weights: bool = True
    rope_base: float = 10000.0
    gradient_checkpointing: bool = False


def test_register_as_decorator_and_as_call():
    reg = ModelRegistry()

    @reg.register("a")
    def make_a(**kwargs):
        return ("a", kwargs)

    reg.register("b", lambda **kwargs: ("b", kwargs))
    assert make_a(x=1) == ("a", {"x": 1})  # the decorator hands the factory back
    assert reg.names() == ("a", "b")
    assert reg.build("b", x=2) == ("b", {"x": 2})


def test_registering_a_name_again_replaces_it_and_says_so(caplog):
    # 2.0's register_model is a plain extension seam: re-run notebook cells, overridden built-ins.
    reg = ModelRegistry(builtins=True)
    reg.register("a", dict)
    with caplog.at_level(logging.INFO, logger="speedtronic_model.registry"):
        reg.register("a", list)

        @reg.register("reference_transformer")
        def mine(**kwargs):
            return "mine"

    assert reg.get("a") is list and reg.build("reference_transformer") == "mine"
    replaced = [r for r in caplog.records if "replaces the registered one" in r.getMessage()]
    assert [r.levelno for r in replaced] == [logging.INFO, logging.INFO]


@pytest.mark.parametrize("name, factory, error", [("", dict, ValueError), ("x", 3, TypeError)])
def test_bad_registrations_are_rejected(name, factory, error):
    with pytest.raises(error):
        ModelRegistry().register(name, factory)


def test_unknown_name_lists_the_registered_names():
    reg = ModelRegistry()
    reg.register("mine", dict)
    with pytest.raises(
        ConfigError, match="model.name: unknown model 'nope'; registered models: mine"
    ):
        reg.get("nope")


def test_global_registry_resolves_the_builtin_lazily():
    from speedtronic_model.model import ReferenceTransformer

    assert {"reference_transformer", "gpt"} <= set(registry.names())
    assert registry.get("reference_transformer") is ReferenceTransformer
    assert ModelRegistry().names() == ()  # private registries start empty


def test_importing_the_registry_does_not_import_torch():
    code = "import speedtronic_model.registry, sys; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_build_model_maps_max_seq_len_and_applies_overrides():
    model = build_model(Section(), n_layer=2)
    assert model.config.block_size == 8
    assert len(model.blocks) == 2
    assert model.config.d_ff == 64
    assert build_model(Section(), max_seq_len=4).config.block_size == 4


def test_build_model_accepts_mappings_and_partial_sections():
    model = build_model({"name": "gpt", "vocab_size": 32, "d_model": 16, "n_head": 2, "n_layer": 1})
    assert model.config.vocab_size == 32
    # A partial section is completed through ModelConfig: its defaults and its validation.
    assert build_model(SimpleNamespace(vocab_size=3)).config.d_model == ModelConfig().d_model
    with pytest.raises(ConfigError, match="model.vocab_size"):
        build_model(SimpleNamespace(vocab_size=0))


def test_custom_factory_receives_every_field_and_extra_overrides():
    seen = {}

    def factory(**kwargs):
        seen.update(kwargs)
        return "built"

    register_model("test_registry_custom", factory)
    assert build_model(Section(name="test_registry_custom"), hidden_act="relu") == "built"
    assert seen == {
        "vocab_size": 64,
        "block_size": 8,
        "n_layer": 1,
        "n_head": 2,
        "n_kv_head": 2,  # resolved by ModelConfig, as 2.0 passed them
        "d_model": 16,
        "d_ff": 64,
        "dropout": 0.0,
        "tie_weights": True,
        "rope_base": 10000.0,
        "hidden_act": "relu",
    }


def test_bad_model_section_surfaces_as_config_error():
    with pytest.raises(ConfigError, match="model.n_kv_head"):
        build_model(Section(n_kv_head=3))


def test_build_model_from_the_real_model_config():
    from speedtronic_config import ModelConfig

    model = build_model(ModelConfig(max_seq_len=32, n_layer=1, n_head=4, n_kv_head=2, d_model=32))
    assert (model.config.block_size, model.config.n_kv_head, model.config.d_ff) == (32, 2, 128)
