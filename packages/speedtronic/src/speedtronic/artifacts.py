"""What a finished run leaves behind, used again: sampling text and exporting to safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speedtronic.errors import UsageError


def load_checkpoint_model(path: Path) -> tuple[Any, Any]:
    """Return (model in eval mode, its SpeedtronicConfig) rebuilt from a trainer checkpoint."""
    if not path.is_file():
        raise UsageError(
            f"{path}: no such checkpoint file (look in <output_dir>/checkpoints/step_<n>.pt)"
        )
    import torch

    from speedtronic_config import SpeedtronicConfig
    from speedtronic_model import build_model

    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise UsageError(f"{path}: not a Speedtronic trainer checkpoint (no model/config entries)")
    config = SpeedtronicConfig.from_dict(state["config"])
    model = build_model(config.model)
    model.load_state_dict(state["model"])
    return model.eval(), config


def sample_text(
    path: Path,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """Return the prompt continued by the checkpoint's model, decoded byte-level."""
    import torch

    from speedtronic_data import CharTokenizer

    model, config = load_checkpoint_model(path)
    if not hasattr(model, "generate"):
        raise UsageError(
            f"{path}: model {config.model.name!r} has no generate(); sample needs the reference "
            "model"
        )
    tokenizer = CharTokenizer(vocab_size=config.model.vocab_size)
    ids = torch.tensor([tokenizer.encode(prompt or "\n")], dtype=torch.long)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k)
    return tokenizer.decode(out[0].tolist())


def export_checkpoint(path: Path, out_dir: Path) -> Path:
    """Write model.safetensors and config.json (the model section) to out_dir; return out_dir."""
    from safetensors.torch import save_model

    model, config = load_checkpoint_model(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(
        model, str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )  # dedupes tied tensors
    model_config = config.to_dict()["model"]
    (out_dir / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")
    return out_dir


def load_exported(out_dir: Path) -> Any:
    """Return the model that export_checkpoint wrote to out_dir, ready for inference."""
    from safetensors.torch import load_model

    from speedtronic_config import ModelConfig
    from speedtronic_model import build_model

    model = build_model(ModelConfig(**json.loads((out_dir / "config.json").read_text())))
    load_model(model, str(out_dir / "model.safetensors"))  # strict: raises on any mismatch
    return model.eval()
