from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from speedtronic_config import ConfigError, ModelConfig
from speedtronic_model.registry import ModelRegistry, build_model, register_model, registry

GROUP = "speedtronic.models"  # the documented entry point group, pinned here


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
    ) as caught:
        reg.get("nope")
    assert GROUP not in str(caught.value)  # a private registry reads none


def test_a_mistyped_model_name_gets_the_closest_registered_one():
    reg = ModelRegistry(builtins=True)
    with pytest.raises(ConfigError) as caught:
        reg.get("referense_transformer")
    assert str(caught.value).startswith(
        "model.name: unknown model 'referense_transformer'; did you mean reference_transformer? "
        "registered models: gpt, reference_transformer. Register a factory with "
    )


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


def test_loss_chunk_size_is_passed_only_when_set():
    # Unset, a 2.0 factory naming only the 2.0 fields still binds; set, it is refused by name.
    def fields_of_2_0(
        vocab_size,
        block_size,
        n_layer,
        n_head,
        n_kv_head,
        d_model,
        d_ff,
        dropout,
        tie_weights,
        rope_base,
    ):
        return "built"

    register_model("test_registry_fields", fields_of_2_0)
    assert build_model(Section(name="test_registry_fields")) == "built"
    with pytest.raises(ConfigError, match="unexpected keyword argument 'loss_chunk_size'"):
        build_model({"name": "test_registry_fields", "loss_chunk_size": 64})
    model = build_model({"vocab_size": 64, "d_model": 16, "n_head": 2, "loss_chunk_size": 64})
    assert model.config.loss_chunk_size == 64


def test_a_factory_that_cannot_take_the_fields_or_returns_none_is_named():
    register_model("test_registry_narrow", lambda vocab_size, block_size: "built")
    with pytest.raises(ConfigError) as caught:
        build_model(Section(name="test_registry_narrow"))
    message = str(caught.value)
    assert "model 'test_registry_narrow', <lambda>(vocab_size, block_size)" in message
    assert "unexpected keyword argument 'n_layer'" in message
    assert "it is called with block_size, d_ff, d_model, dropout" in message
    assert message.endswith("give it **kwargs to take the ones it does not use")

    def broken(**kwargs):
        raise TypeError("a bug inside the factory")  # its own error, not a signature problem

    register_model("test_registry_broken", broken)
    with pytest.raises(TypeError, match="a bug inside the factory"):
        build_model(Section(name="test_registry_broken"))
    register_model("test_registry_none", lambda **kwargs: None)  # a forgotten return
    with pytest.raises(ConfigError, match="model 'test_registry_none'.*returned None"):
        build_model(Section(name="test_registry_none"))


def test_bad_model_section_surfaces_as_config_error():
    with pytest.raises(ConfigError, match="model.n_kv_head"):
        build_model(Section(n_kv_head=3))


def test_build_model_from_the_real_model_config():
    from speedtronic_config import ModelConfig

    model = build_model(ModelConfig(max_seq_len=32, n_layer=1, n_head=4, n_kv_head=2, d_model=32))
    assert (model.config.block_size, model.config.n_kv_head, model.config.d_ff) == (32, 2, 128)


PLUGIN_MODULES = ("stplug_models", "stplug_raises", "stplug_other")
STPLUG_ENTRY_POINTS = {
    "stplug_net": "stplug_models:build",
    "stplug_missing": "stplug_missing:build",
    "stplug_raises": "stplug_raises:build",
    "stplug_not_callable": "stplug_models:NOT_A_FACTORY",
    "gpt": "stplug_models:build",
}


def install(site: Path, dist: str, entry_points: dict[str, str], **modules: str) -> Path:
    """Write a real installed distribution into site (dist-info with METADATA and the entry points
    of GROUP, plus the modules given as name=source); return site.
    """
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)
    return site


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    """A sys.path folder holding distribution stplug: one working model, three broken ones and
    one that names a built-in.
    """
    site = install(
        tmp_path / "site",
        "stplug",
        STPLUG_ENTRY_POINTS,
        stplug_models="def build(**fields):\n    return ('stplug', fields)\n\nNOT_A_FACTORY = 3\n",
        stplug_raises="raise RuntimeError('needs a GPU\\nsecond line')\n",
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    for module in PLUGIN_MODULES:
        sys.modules.pop(module, None)


def test_entry_point_models_are_listed_without_importing_them(plugin_site):
    reg = ModelRegistry(builtins=True, plugins=True)
    assert "stplug_net" in reg.names() and "stplug_net" in reg
    assert "stplug_models" not in sys.modules  # named, not imported
    assert reg.build("stplug_net", n_layer=2) == ("stplug", {"n_layer": 2})
    assert "stplug_models" in sys.modules
    assert "stplug_net" not in ModelRegistry(builtins=True)  # entry points only where asked


def test_the_global_registry_reads_entry_points_on_first_lookup_not_on_import(plugin_site):
    # The folder joins sys.path after the import: only a scan at lookup time can see it.
    code = (
        "import sys, speedtronic_model.registry as r; "
        f"sys.path.insert(0, {str(plugin_site)!r}); "
        "print(r.build_model({'name': 'stplug_net', 'n_layer': 2})[1]['n_layer'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "2"


def test_register_model_wins_over_an_entry_point(plugin_site, caplog):
    early = ModelRegistry(plugins=True)
    early.register("stplug_net", dict)  # before the entry points are read
    late = ModelRegistry(plugins=True)
    assert "stplug_net" in late.names()
    late.register("stplug_net", list)  # after
    with caplog.at_level(logging.INFO, logger="speedtronic_model.registry"):
        assert "stplug_net" in early.names()
    assert early.get("stplug_net") is dict and late.get("stplug_net") is list
    assert "stplug_models" not in sys.modules
    assert (
        "model 'stplug_net': ignoring entry point stplug_net = stplug_models:build of "
        "distribution stplug 0.1: register_model() replaced it" in caplog.text
    )


def test_an_entry_point_cannot_take_a_builtin_name(plugin_site, caplog):
    from speedtronic_model.model import ReferenceTransformer

    reg = ModelRegistry(builtins=True, plugins=True)
    with caplog.at_level(logging.WARNING, logger="speedtronic_model.registry"):
        reg.names()
    assert reg.get("gpt") is ReferenceTransformer
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "model 'gpt': ignoring entry point gpt = stplug_models:build of distribution stplug 0.1: "
        "the built-in model keeps the name"
    )


def test_the_first_distribution_on_sys_path_keeps_a_name(
    plugin_site, tmp_path, monkeypatch, caplog
):
    later = install(
        tmp_path / "later",
        "stplug_other",
        {"stplug_net": "stplug_other:build"},
        stplug_other="def build(**fields):\n    return 'other'\n",
    )
    monkeypatch.setattr(sys, "path", [*sys.path, str(later)])
    reg = ModelRegistry(plugins=True)
    with caplog.at_level(logging.WARNING, logger="speedtronic_model.registry"):
        assert reg.build("stplug_net") == ("stplug", {})
    assert (
        "ignoring entry point stplug_net = stplug_other:build of distribution stplug_other 0.1: "
        "entry point stplug_net = stplug_models:build of distribution stplug 0.1 comes first"
        in caplog.text
    )


@pytest.mark.parametrize(
    "name, cause",
    [
        ("stplug_missing", "ModuleNotFoundError: No module named 'stplug_missing'"),
        ("stplug_raises", "RuntimeError: needs a GPU;"),  # the first line of the cause only
        ("stplug_not_callable", "not a callable factory (got int)"),
    ],
)
def test_a_broken_entry_point_is_a_one_line_error_that_spares_other_models(
    plugin_site, name, cause
):
    reg = ModelRegistry(builtins=True, plugins=True)
    for _ in range(2):  # a failed load leaves nothing half-registered: it fails again the same way
        with pytest.raises(ConfigError) as caught:
            reg.get(name)
        message = str(caught.value)
        assert message.startswith(
            f"model.name: model {name!r} comes from entry point {name} = "
            f"{STPLUG_ENTRY_POINTS[name]} of "
            f"distribution stplug 0.1, which fails: {cause}"
        ), message
        assert message.endswith(
            "; fix or uninstall stplug, or register the model with register_model"
        )
        assert "\n" not in message and "second line" not in message
    assert reg.build("stplug_net") == ("stplug", {})


def test_unknown_name_points_at_both_ways_to_register(plugin_site):
    with pytest.raises(ConfigError) as caught:
        ModelRegistry(builtins=True, plugins=True).get("nope")
    assert str(caught.value) == (
        "model.name: unknown model 'nope'; registered models: gpt, reference_transformer, "
        "stplug_missing, stplug_net, stplug_not_callable, stplug_raises. Register a factory with "
        "register_model('nope', factory), or as an entry point in group 'speedtronic.models'"
    )
