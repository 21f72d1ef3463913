"""The reference transformer as a Hugging Face `transformers` Llama checkpoint, both ways.

The reference model is a Llama-style decoder (RMSNorm, rotate-half RoPE, grouped-query attention,
SwiGLU, optional tied head), so its weights map one to one onto `LlamaForCausalLM`: the same
matrices under other names, no permutation (both rotate halves, GPT-NeoX style). `save_llama`
writes config.json, generation_config.json and safetensors weights that `transformers` loads with
no custom code; `load_llama` reads such a folder back into a reference model after checking the
architecture and every shape. Neither needs `transformers` installed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from speedtronic_config import ConfigError
from speedtronic_config.atomic import atomic_write_bytes, atomic_write_text
from speedtronic_model.model import ReferenceTransformer

ARCHITECTURE = "LlamaForCausalLM"
HF_PREFIX = "hf:"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
GENERATION_CONFIG_NAME = "generation_config.json"
# Every weight file an export may write: one left by an earlier export with other sharding would
# shadow or confuse the new ones.
WEIGHT_FILES = ("model*.safetensors", INDEX_NAME)
# A RoPE buffer older transformers saved per layer and transformers ignores on load, as we do.
_ROPE_BUFFER = ".self_attn.rotary_emb.inv_freq"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' own default shard size, "5GB" (not GiB)

# Per-layer tensors: (reference model name, Llama name), in the order transformers writes them.
_LAYER_NAMES = (
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn.q_proj.weight", "self_attn.q_proj.weight"),
    ("attn.k_proj.weight", "self_attn.k_proj.weight"),
    ("attn.v_proj.weight", "self_attn.v_proj.weight"),
    ("attn.o_proj.weight", "self_attn.o_proj.weight"),
    ("mlp_norm.weight", "post_attention_layernorm.weight"),
    ("mlp.w_gate.weight", "mlp.gate_proj.weight"),
    ("mlp.w_up.weight", "mlp.up_proj.weight"),
    ("mlp.w_down.weight", "mlp.down_proj.weight"),
)


def llama_names(model: ReferenceTransformer) -> list[tuple[str, str]]:
    """Return (reference name, Llama name) for every tensor the Llama checkpoint holds, in order."""
    names = [("tok_emb.weight", "model.embed_tokens.weight")]
    for layer in range(model.config.n_layer):
        names += [
            (f"blocks.{layer}.{ours}", f"model.layers.{layer}.{hf}") for ours, hf in _LAYER_NAMES
        ]
    names.append(("norm.weight", "model.norm.weight"))
    if not model.config.tie_weights:  # a tied head is the embedding: transformers re-ties it
        names.append(("lm_head.weight", "lm_head.weight"))
    return names


def _require_reference(model: Any, what: str) -> ReferenceTransformer:
    """Return the reference model itself, seen through torch.compile's wrapper; ConfigError for
    any other model.
    """
    model = getattr(model, "_orig_mod", model)  # an OptimizedModule shares the model's weights
    if isinstance(model, ReferenceTransformer):
        return model
    params = [name for name, _ in getattr(model, "named_parameters", lambda: [])()]
    shown = ", ".join(params[:4]) + (", ..." if len(params) > 4 else "")
    raise ConfigError(
        "model.name",
        f"{type(model).__name__} does not map onto transformers' {ARCHITECTURE} "
        f"(its parameters: {shown or 'none'}); only the reference transformer does",
        allowed=f"{what} needs model.name: reference_transformer",
    )


def _require_exportable(model: Any) -> ReferenceTransformer:
    """Return the reference model to export; ConfigError for a subclass holding a tensor that
    LlamaForCausalLM has no place for (the export would leave it out and change the logits).
    """
    model = _require_reference(model, "a Llama export")
    mapped = {ours for ours, _ in llama_names(model)} | {"lm_head.weight"}  # a tied head too
    extra = [name for name in model.state_dict() if name not in mapped]
    if extra:
        shown = ", ".join(extra[:4]) + (", ..." if len(extra) > 4 else "")
        raise ConfigError(
            "model.name",
            f"{type(model).__name__} holds tensor{'s' if len(extra) > 1 else ''} {shown}, which "
            f"transformers' {ARCHITECTURE} has no place for",
            allowed="export it with --format speedtronic (safetensors of every tensor)",
        )
    return model


def _norm_eps(model: ReferenceTransformer) -> float:
    """Return the one RMSNorm epsilon every norm of the model uses."""
    norms = [model.norm] + [n for b in model.blocks for n in (b.attn_norm, b.mlp_norm)]
    values = {n.eps for n in norms}
    if len(values) != 1:
        raise ConfigError("model", f"RMSNorm eps differs between layers ({sorted(values)})")
    return values.pop()


def llama_config(
    model: ReferenceTransformer,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """Return the `transformers` LlamaConfig (config.json) that describes the model exactly."""
    cfg = _require_exportable(model).config
    dtype = str(model.tok_emb.weight.dtype).removeprefix("torch.")
    return {
        "architectures": [ARCHITECTURE],
        "attention_bias": False,
        # dropout is a training setting of this run, not part of the network
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.d_model,
        "initializer_range": 0.02,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.block_size,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": cfg.n_head,
        "num_hidden_layers": cfg.n_layer,
        "num_key_value_heads": cfg.n_kv_head,
        "pad_token_id": None,
        "rms_norm_eps": _norm_eps(model),
        # transformers 5 reads rope_parameters; 4.x and most other tools read rope_theta
        "rope_parameters": {"rope_theta": float(cfg.rope_base), "rope_type": "default"},
        "rope_theta": float(cfg.rope_base),
        "tie_word_embeddings": cfg.tie_weights,
        "torch_dtype": dtype,
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
    }


def llama_state_dict(model: ReferenceTransformer) -> dict[str, torch.Tensor]:
    """Return the model's tensors under their Llama names (CPU, contiguous, tied head once)."""
    ours = _require_exportable(model).state_dict()
    return {hf: ours[name].detach().to("cpu").contiguous() for name, hf in llama_names(model)}


def _write_json(path: Path, value: Any) -> Path:
    """Write value as sorted, indented JSON atomically (the same value gives the same bytes)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return atomic_write_text(path, text)


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Split tensors, in order, into groups of at most max_bytes (a larger tensor stands alone)."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    return groups


def save_llama(
    model: Any,
    out_dir: str | os.PathLike[str],
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[Path]:
    """Write the safetensors weights (sharded with an index above max_shard_bytes),
    generation_config.json and config.json that `LlamaForCausalLM.from_pretrained` loads; return
    the paths. config.json comes last (an earlier one goes first): a save that fails midway leaves
    no folder that looks loadable.
    """
    from safetensors.torch import save

    if not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive integer, got {max_shard_bytes!r}")
    model = _require_reference(model, "a Llama export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = llama_config(model, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    generation = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": None}
    (out / "config.json").unlink(missing_ok=True)
    written = []
    tensors = llama_state_dict(model)
    groups = _shards(tensors, max_shard_bytes)
    names = (
        [WEIGHTS_NAME]
        if len(groups) == 1
        else [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    )
    for name, group in zip(names, groups, strict=True):
        written.append(atomic_write_bytes(out / name, save(group, metadata={"format": "pt"})))
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": {
                t: name for name, group in zip(names, groups, strict=True) for t in group
            },
        }
        written.append(_write_json(out / INDEX_NAME, index))
    for stale in (path for pattern in WEIGHT_FILES for path in out.glob(pattern)):
        if stale not in written:
            stale.unlink()
    written.append(_write_json(out / GENERATION_CONFIG_NAME, generation))
    written.append(_write_json(out / "config.json", config))
    return written


def hf_folder(init_from: str) -> Path:
    """Return the folder an `hf:PATH` spec names, checking it holds a config.json."""
    if not isinstance(init_from, str) or not init_from.startswith(HF_PREFIX):
        raise ConfigError(
            "model.init_from",
            "must be hf:PATH",
            value=init_from,
            allowed="e.g. hf:exports/my-model",
        )
    folder = Path(init_from[len(HF_PREFIX) :]).expanduser()
    if not folder.is_dir():
        # `hf:owner/name` reads like a Hub repository id, but nothing is ever downloaded.
        hub = (
            f"; to start from a Hub repository, download it first: hf download {folder} "
            "--local-dir DIR, then hf:DIR"
            if len(folder.parts) == 2 and not folder.is_absolute()
            else ""
        )
        raise ConfigError(
            "model.init_from",
            f"{folder} is not a folder (init_from reads local folders only, never the Hub)",
            allowed=f"point it at a folder written by save_pretrained or `speedtronic export "
            f"--format hf`{hub}",
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(
            "model.init_from",
            f"{folder} has no config.json",
            allowed="point it at a folder written by save_pretrained or `speedtronic export "
            "--format hf`",
        )
    return folder


def read_llama_config(folder: Path) -> dict[str, Any]:
    """Return config.json of a transformers folder after checking it describes a Llama model."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError("model.init_from", f"cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError("model.init_from", f"{path} is not a JSON object")
    kind, architectures = config.get("model_type"), config.get("architectures") or [ARCHITECTURE]
    if kind != "llama" or ARCHITECTURE not in architectures:
        raise ConfigError(
            "model.init_from",
            f"{path} describes model_type {kind!r} ({', '.join(map(str, architectures))}), "
            f"which does not map onto the reference transformer",
            allowed=f"only Llama-architecture checkpoints ({ARCHITECTURE}) do",
        )
    return config


def _rope_theta(config: dict[str, Any]) -> tuple[float, str]:
    """Return (theta, rope type) as transformers reads them: a set `rope_scaling` (4.x's key)
    replaces `rope_parameters` (5's) whole, and a theta that neither holds is `rope_theta`.
    """
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0))), kind


def llama_mismatches(config: dict[str, Any], model: ReferenceTransformer) -> list[str]:
    """Return how a Llama config.json differs from the model (empty when the weights map)."""
    cfg = model.config
    theta, rope_type = _rope_theta(config)
    heads = config.get("num_attention_heads")
    sizes = [
        ("vocab_size", cfg.vocab_size, config.get("vocab_size")),
        ("d_model", cfg.d_model, config.get("hidden_size")),
        ("d_ff", cfg.d_ff, config.get("intermediate_size")),
        ("n_layer", cfg.n_layer, config.get("num_hidden_layers")),
        ("n_head", cfg.n_head, heads),
        ("n_kv_head", cfg.n_kv_head, config.get("num_key_value_heads") or heads),
        ("rope_base", cfg.rope_base, theta),
        ("tie_weights", cfg.tie_weights, bool(config.get("tie_word_embeddings", False))),
    ]
    problems = [
        f"model.{field} is {ours} but the checkpoint has {theirs}"
        for field, ours, theirs in sizes
        if ours != theirs
    ]
    hidden, head_dim = config.get("hidden_size"), config.get("head_dim")
    fixed = [
        # transformers' ACT2FN maps "swish" to the same nn.SiLU
        (
            "hidden_act",
            {"swish": "silu"}.get(config.get("hidden_act"), config.get("hidden_act", "silu")),
            "silu",
        ),
        ("attention_bias", bool(config.get("attention_bias", False)), False),
        ("mlp_bias", bool(config.get("mlp_bias", False)), False),
        ("rope type", rope_type, "default"),
        ("rms_norm_eps", config.get("rms_norm_eps", 1e-6), _norm_eps(model)),
        # quantized weights keep their Llama names, so only the config tells them apart
        ("quantization_config", _quant_method(config), None),
    ]
    if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        fixed.append(("head_dim", head_dim, hidden // heads))
    problems += [
        f"{name} {theirs!r} does not map (the reference transformer has {ours!r})"
        for name, theirs, ours in fixed
        if not (theirs == ours or _same_float(theirs, ours))
    ]
    return problems


def _quant_method(config: dict[str, Any]) -> Any:
    """Return the quant_method of a quantized checkpoint's config (None when unquantized)."""
    quantization = config.get("quantization_config")
    if isinstance(quantization, dict) and quantization:
        return quantization.get("quant_method") or "unnamed"
    return quantization or None


def _same_float(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9)


def _weight_files(folder: Path) -> list[Path]:
    """Return the safetensors files of a folder: the single file, or every shard its index names."""
    if (folder / WEIGHTS_NAME).is_file():
        return [folder / WEIGHTS_NAME]
    index = folder / INDEX_NAME
    if not index.is_file():
        raise ConfigError(
            "model.init_from",
            f"{folder} has neither {WEIGHTS_NAME} nor {INDEX_NAME}",
            allowed="only safetensors weights are read (not pytorch_model.bin); re-save them "
            "with save_pretrained(safe_serialization=True)",
        )
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError("model.init_from", f"cannot read {index}: {error}") from None
    files = [folder / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError("model.init_from", f"{index} names missing shard(s) {', '.join(missing)}")
    return files


def _read_tensors(files: list[Path]) -> Iterator[tuple[str, Any]]:
    from safetensors import SafetensorError, safe_open

    for path in files:
        # A damaged file (a cut download, a git-lfs pointer) would otherwise fail as safetensors'
        # bare "Error while deserializing header", naming neither the file nor the setting.
        try:
            with safe_open(str(path), framework="pt") as handle:
                tensors = [(name, handle.get_tensor(name)) for name in handle.keys()]
        except (OSError, SafetensorError) as error:
            raise ConfigError(
                "model.init_from",
                f"cannot read {path}: {error}",
                allowed=None
                if isinstance(error, OSError)
                else "download the checkpoint again (a git clone without git-lfs leaves "
                "pointer files in place of the weights)",
            ) from None
        yield from tensors


def load_llama(model: Any, folder: str | os.PathLike[str]) -> ReferenceTransformer:
    """Copy a transformers Llama folder's weights into the reference model, in place; ConfigError
    naming every mismatch when the architecture, a size, a tensor name or a shape differs.
    """
    model = _require_reference(model, "model.init_from")
    folder = Path(folder)
    problems = llama_mismatches(read_llama_config(folder), model)
    if problems:
        sizes = [p for p in problems if p.startswith("model.")]  # the rest have no model field
        advice = ["set those model fields to the checkpoint's values"] if sizes else []
        if len(sizes) < len(problems):
            advice.append(
                "a feature that does not map has no setting: start from a checkpoint without it"
            )
        raise ConfigError(
            "model.init_from",
            f"{folder} does not match the model section: {'; '.join(problems)}",
            allowed="; ".join(advice),
        )
    expected = dict((hf, ours) for ours, hf in llama_names(model))
    params = model.state_dict()
    found: dict[str, torch.Tensor] = {}
    tied_head = None
    for name, tensor in _read_tensors(_weight_files(folder)):
        if name == "lm_head.weight" and model.config.tie_weights:
            tied_head = tensor  # some writers store the tied head too: checked below
            continue
        if name.endswith(_ROPE_BUFFER):
            continue  # transformers before 4.31 saved it; it is computed from rope_theta instead
        if name not in expected:
            raise ConfigError(
                "model.init_from", f"{folder} holds tensor {name!r}, which the model does not have"
            )
        target = params[expected[name]]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ConfigError(
                "model.init_from",
                f"{folder}: tensor {name} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(target.shape)}",
            )
        found[name] = tensor
    missing = [name for name in expected if name not in found]
    if missing:
        raise ConfigError("model.init_from", f"{folder} lacks tensor(s) {', '.join(missing[:5])}")
    embedding = found["model.embed_tokens.weight"]
    if tied_head is not None and not torch.equal(tied_head.to(embedding.dtype), embedding):
        # transformers 5 then keeps the stored head (4.x tied it to the embedding): no one answer
        raise ConfigError(
            "model.init_from",
            f"{folder}: config.json sets tie_word_embeddings but its lm_head.weight differs from "
            "model.embed_tokens.weight, so transformers does not tie them",
            allowed="set tie_word_embeddings: false in its config.json and model.tie_weights: "
            "false to load both",
        )
    with torch.no_grad():
        for name, tensor in found.items():
            params[expected[name]].copy_(tensor)
    return model


def apply_init_from(model: Any, spec: str | None) -> Any:
    """Apply `model.init_from` to a freshly built model: load `hf:PATH` into it, or leave it be."""
    if spec is None:
        return model
    return load_llama(model, hf_folder(spec))


__all__ = [
    "ARCHITECTURE",
    "DEFAULT_MAX_SHARD_BYTES",
    "HF_PREFIX",
    "GENERATION_CONFIG_NAME",
    "INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHT_FILES",
    "hf_folder",
    "apply_init_from",
    "llama_config",
    "llama_mismatches",
    "llama_names",
    "llama_state_dict",
    "load_llama",
    "read_llama_config",
    "save_llama",
]
