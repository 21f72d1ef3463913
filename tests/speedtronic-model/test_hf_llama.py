"""The reference transformer as a transformers Llama checkpoint: numbers checked against the real
`transformers` (skipped where it is not installed), files and errors checked without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from speedtronic_config import ConfigError
from speedtronic_model import (
    ReferenceTransformer,
    apply_init_from,
    hf_llama,
    load_llama,
    save_llama,
)
from speedtronic_model.hf_llama import INDEX_NAME, WEIGHTS_NAME, hf_folder, llama_config

SHAPE = dict(vocab_size=300, block_size=32, n_layer=2, n_head=4, d_model=32, rope_base=5000.0)
VARIANTS = {
    "mha-tied": dict(n_kv_head=4, tie_weights=True),
    "mha-untied": dict(n_kv_head=4, tie_weights=False, d_ff=72),  # d_ff not 4 * d_model
    "gqa-tied": dict(n_kv_head=2, tie_weights=True),
    "gqa-untied": dict(n_kv_head=1, tie_weights=False),
}


def model(seed: int = 0, **overrides) -> ReferenceTransformer:
    """A small model whose weights are far from init, so a wrong mapping cannot hide."""
    torch.manual_seed(seed)
    net = ReferenceTransformer(**{**SHAPE, **overrides}).eval()
    with torch.no_grad():
        for param in net.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return net


def batch(length: int = 32) -> torch.Tensor:
    return torch.randint(
        0, SHAPE["vocab_size"], (3, length), generator=torch.Generator().manual_seed(7)
    )


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- against transformers ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_logits_equal_ours(tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    ours = model(**VARIANTS[variant])
    save_llama(ours, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    assert theirs.dtype == torch.float32
    ids = batch()
    with torch.no_grad():
        difference = (ours(ids)["logits"] - theirs(ids).logits).abs().max().item()
    assert difference <= 1e-5, difference


@pytest.mark.parametrize("variant", ["mha-tied", "gqa-untied"])
def test_transformers_greedy_generate_matches(tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    ours = model(**VARIANTS[variant])
    save_llama(ours, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompt = batch(8)[:1]
    # prompt + new tokens within block_size: past it ours slides its window, Llama does not
    expected = ours.generate(prompt, 24, temperature=0)
    got = theirs.generate(prompt, max_new_tokens=24, do_sample=False)
    assert got.tolist() == expected.tolist()


def test_sharded_export_has_an_index_and_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = model(**VARIANTS["gqa-untied"])
    written = save_llama(ours, tmp_path, max_shard_bytes=20_000)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / WEIGHTS_NAME).exists()
    assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in ours.parameters())
    assert set(written) >= set(shards)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(ours(batch())["logits"], theirs(batch()).logits, atol=1e-5)


def test_a_folder_transformers_saved_loads_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = model(**VARIANTS["gqa-tied"])
    save_llama(ours, tmp_path / "a")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    theirs.save_pretrained(tmp_path / "b")  # transformers' own file layout and config keys
    again = load_llama(model(seed=1, **VARIANTS["gqa-tied"]), tmp_path / "b")
    assert torch.equal(again(batch())["logits"], ours(batch())["logits"])


# -- files and round trip ------------------------------------------------------------------------


def test_config_json_describes_the_model():
    config = llama_config(model(**VARIANTS["gqa-untied"]), bos_token_id=None, eos_token_id=3)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["head_dim"]) == (32, 128, 8)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 1)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 5000.0
    assert config["rms_norm_eps"] == 1e-5 and config["hidden_act"] == "silu"
    assert config["tie_word_embeddings"] is False and config["max_position_embeddings"] == 32
    assert (config["bos_token_id"], config["eos_token_id"]) == (None, 3)


@pytest.mark.parametrize("shard", [None, 20_000])
def test_save_load_save_is_byte_identical(tmp_path, shard):
    kwargs = {} if shard is None else {"max_shard_bytes": shard}
    save_llama(model(**VARIANTS["gqa-untied"]), tmp_path / "a", **kwargs)
    copy = load_llama(model(seed=3, **VARIANTS["gqa-untied"]), tmp_path / "a")
    save_llama(copy, tmp_path / "b", **kwargs)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_a_new_export_replaces_stale_weights(tmp_path):
    save_llama(model(), tmp_path, max_shard_bytes=20_000)
    save_llama(model(), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("model*")) == [WEIGHTS_NAME]


@pytest.mark.parametrize("shard", [None, 20_000])
def test_a_save_that_fails_midway_leaves_no_config_json(tmp_path, monkeypatch, shard):
    # config.json marks a loadable folder: beside missing or older weights it would mislead
    import speedtronic_model.hf_llama as hf_llama

    kwargs = {} if shard is None else {"max_shard_bytes": shard}
    save_llama(model(), tmp_path, **kwargs)
    real = hf_llama.atomic_write_bytes
    written = []

    def fail_on_the_last_weights(path, data):
        written.append(path)
        if len(written) == (1 if shard is None else 2):
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(hf_llama, "atomic_write_bytes", fail_on_the_last_weights)
    with pytest.raises(OSError, match="No space"):
        save_llama(model(seed=1), tmp_path, **kwargs)
    assert not (tmp_path / "config.json").exists()


def test_tied_export_stores_the_shared_matrix_once(tmp_path):
    from safetensors import safe_open

    save_llama(model(**VARIANTS["mha-tied"]), tmp_path)
    with safe_open(str(tmp_path / WEIGHTS_NAME), framework="pt") as handle:
        names = set(handle.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert len(names) == 1 + 9 * 2 + 1


def test_apply_init_from(tmp_path):
    source = model(**VARIANTS["gqa-tied"])
    save_llama(source, tmp_path)
    fresh = model(seed=5, **VARIANTS["gqa-tied"])
    assert apply_init_from(fresh, None) is fresh
    apply_init_from(fresh, f"hf:{tmp_path}")
    assert torch.equal(fresh(batch())["logits"], source(batch())["logits"])


# -- bad paths -----------------------------------------------------------------------------------


def saved(tmp_path: Path, **overrides) -> Path:
    save_llama(model(**{**VARIANTS["gqa-untied"], **overrides}), tmp_path)
    return tmp_path


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("spec", ["exports/x", "hf:", 7])
def test_init_from_must_be_hf_path(spec):
    with pytest.raises(ConfigError, match="model.init_from"):
        hf_folder(spec)


def test_folder_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        apply_init_from(model(), f"hf:{tmp_path}")


def test_a_hub_repository_id_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder meta-llama/Llama-3.2-1B here
    with pytest.raises(ConfigError) as caught:
        apply_init_from(model(), "hf:meta-llama/Llama-3.2-1B")
    message = str(caught.value)
    assert "meta-llama/Llama-3.2-1B is not a folder" in message
    assert "never the Hub" in message
    assert "hf download meta-llama/Llama-3.2-1B --local-dir DIR, then hf:DIR" in message
    with pytest.raises(ConfigError, match="is not a folder") as caught:
        apply_init_from(model(), f"hf:{tmp_path / 'missing'}")
    assert "hf download" not in str(caught.value)  # a path, not a repository id


def test_non_llama_config_is_refused(tmp_path):
    edit_config(saved(tmp_path), model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError, match="model_type 'gpt2'.*does not map"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)


def test_size_mismatches_are_named_with_the_fix(tmp_path):
    saved(tmp_path)
    target = model(n_layer=3, n_kv_head=4, tie_weights=True)
    with pytest.raises(ConfigError) as caught:
        load_llama(target, tmp_path)
    message = str(caught.value)
    assert "model.n_layer is 3 but the checkpoint has 2" in message
    assert "model.n_kv_head is 4 but the checkpoint has 1" in message
    assert "model.tie_weights is True but the checkpoint has False" in message
    assert message.endswith("set those model fields to the checkpoint's values")
    assert "\n" not in message


def test_swish_is_silu_as_transformers_maps_it(tmp_path):
    ours = model(**VARIANTS["gqa-untied"])
    edit_config(saved(tmp_path), hidden_act="swish")
    load_llama(ours, tmp_path)  # transformers' ACT2FN["swish"] is nn.SiLU, as "silu"


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' does not map"),
        ({"attention_bias": True}, "attention_bias True does not map"),
        ({"rms_norm_eps": 1e-6}, "rms_norm_eps 1e-06 does not map"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5000.0}}, "rope type 'llama3'"),
        ({"head_dim": 16}, "head_dim 16 does not map"),
        # quantized weights keep their Llama names (scales beside them, or in the config)
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config 'fp8' does not"),
    ],
)
def test_architecture_features_that_do_not_map(tmp_path, changes, fragment):
    edit_config(saved(tmp_path), **changes)
    with pytest.raises(ConfigError, match=fragment) as caught:
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)
    # No model field holds such a feature: the advice says so instead of naming fields.
    assert str(caught.value).endswith(
        "a feature that does not map has no setting: start from a checkpoint without it"
    )


ONLY_SCALING = {"rope_parameters": None, "rope_theta": None}


@pytest.mark.parametrize(
    "rope, loads",
    [
        # rope_scaling added to a transformers 5 config: transformers applies it (it replaces
        # rope_parameters whole), so it must be refused, not read as the default RoPE
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}}, False),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0, "rope_theta": 5000.0}}, False),
        # the theta held by rope_scaling alone, which transformers 5 reads too
        (
            {"rope_scaling": {"rope_type": "default", "rope_theta": 5000.0}, **ONLY_SCALING},
            True,
        ),
        (
            {"rope_scaling": {"rope_type": "default", "rope_theta": 7.0}, **ONLY_SCALING},
            False,
        ),
    ],
)
def test_rope_settings_are_read_as_transformers_reads_them(tmp_path, rope, loads):
    edit_config(saved(tmp_path), **rope)
    if loads:
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)
    else:
        with pytest.raises(ConfigError, match="rope"):
            load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = hf_llama._rope_theta(json.loads((tmp_path / "config.json").read_text()))
    assert ours == (theirs["rope_theta"], theirs["rope_type"])


def test_tensor_shape_mismatch_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    saved(tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(64, 32)
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ConfigError, match=r"up_proj.weight has shape \(64, 32\).*\(128, 32\)"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    saved(tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ConfigError, match="lacks tensor.*model.norm.weight"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)
    tensors["model.norm.weight"] = torch.ones(32)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ConfigError, match="q_proj.bias"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)


def test_the_rope_buffer_older_transformers_saved_is_ignored_as_transformers_does(tmp_path):
    from safetensors.torch import load_file, save_file

    ours = model(**VARIANTS["gqa-untied"])
    save_llama(ours, tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    for layer in range(SHAPE["n_layer"]):  # as transformers before 4.31 saved a Llama
        tensors[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = torch.rand(4)
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    loaded = load_llama(model(seed=1, **VARIANTS["gqa-untied"]), tmp_path)
    ids = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids)["logits"], ours(ids)["logits"], rtol=0, atol=0)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        difference = (ours(ids)["logits"] - theirs(ids).logits).abs().max().item()
    assert difference <= 1e-5, difference  # transformers, too, computes RoPE from rope_theta


def test_a_tied_config_with_another_stored_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    ours = model(**VARIANTS["gqa-tied"])
    save_llama(ours, tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # the same: loads
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    load_llama(model(seed=1, **VARIANTS["gqa-tied"]), tmp_path)
    # Another head: transformers 5 keeps it apart, so reading the embedding was silently wrong.
    tensors["lm_head.weight"] = torch.randn_like(tensors["lm_head.weight"])
    save_file(tensors, tmp_path / WEIGHTS_NAME)
    with pytest.raises(ConfigError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_llama(model(seed=1, **VARIANTS["gqa-tied"]), tmp_path)
    edit_config(tmp_path, tie_word_embeddings=False)  # the fix the error names
    untied = load_llama(model(seed=1, n_kv_head=2, tie_weights=False), tmp_path)
    assert torch.equal(untied.lm_head.weight, tensors["lm_head.weight"])
    transformers = pytest.importorskip("transformers")
    edit_config(tmp_path, tie_word_embeddings=True)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(theirs.lm_head.weight, tensors["lm_head.weight"])  # not tied


def test_missing_weights_and_missing_shards(tmp_path):
    saved(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(ConfigError, match="neither model.safetensors nor"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)
    save_llama(model(**VARIANTS["gqa-untied"]), tmp_path, max_shard_bytes=20_000)
    second = sorted(tmp_path.glob("model-*.safetensors"))[1]
    second.unlink()
    with pytest.raises(ConfigError, match=f"missing shard.*{second.name}"):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)


@pytest.mark.parametrize("damage", ["lfs-pointer", "truncated"])
def test_a_damaged_weights_file_is_named(tmp_path, damage):
    saved(tmp_path)
    weights = tmp_path / WEIGHTS_NAME
    if damage == "lfs-pointer":  # what a git clone without git-lfs leaves
        weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n")
    else:  # an interrupted download
        weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(
        ConfigError, match=f"model.init_from: cannot read {re.escape(str(weights))}: .*git-lfs"
    ):
        load_llama(model(**VARIANTS["gqa-untied"]), tmp_path)


def test_a_custom_model_does_not_map(tmp_path):
    custom = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    with pytest.raises(ConfigError, match="Sequential does not map onto transformers' Llama"):
        save_llama(custom, tmp_path)
    assert not list(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="model.name.*0.weight"):
        load_llama(custom, tmp_path)


def test_a_compiled_model_exports_and_loads_as_the_model_it_wraps(tmp_path):
    # torch.compile wraps the model in an OptimizedModule (compiling only when called), which was
    # refused as "does not map ... needs model.name: reference_transformer".
    ours = model(**VARIANTS["gqa-tied"])
    save_llama(ours, tmp_path / "plain")
    save_llama(torch.compile(ours), tmp_path / "compiled")
    assert files(tmp_path / "compiled") == files(tmp_path / "plain")
    again = model(seed=1, **VARIANTS["gqa-tied"])
    assert load_llama(torch.compile(again), tmp_path / "plain") is again
    assert torch.equal(again(batch())["logits"], ours(batch())["logits"])


def test_a_subclass_with_tensors_llama_lacks_is_refused_not_exported_without_them(tmp_path):
    # A registered subclass with a tensor of its own exported without it: transformers then
    # loaded a model whose logits differ, with no word said.
    class Scaled(ReferenceTransformer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.logit_scale = torch.nn.Parameter(torch.tensor(3.0))

    scaled = Scaled(**SHAPE, **VARIANTS["gqa-untied"])
    for export in (llama_config, hf_llama.llama_state_dict, lambda m: save_llama(m, tmp_path)):
        with pytest.raises(ConfigError, match="Scaled holds tensor logit_scale, which"):
            export(scaled)
    assert not list(tmp_path.iterdir())
    load_llama(scaled, saved(tmp_path / "plain"))  # init_from leaves its own tensor be
    assert scaled.logit_scale.item() == 3.0
