"""2.0 import path `speedtronic.distributed.tensors`: speedtronic_diloco's tensor helpers."""

from __future__ import annotations

from speedtronic_diloco.tensors import (
    average_deltas,
    compute_pseudo_gradient,
    cpu_state_dict,
    cpu_tensor,
    floating_state,
    load_delta,
    load_safetensors,
    metadata_json,
    parse_delta_path,
    read_metadata,
    save_safetensors,
)

__all__ = [
    "average_deltas",
    "compute_pseudo_gradient",
    "cpu_state_dict",
    "cpu_tensor",
    "floating_state",
    "load_delta",
    "load_safetensors",
    "metadata_json",
    "parse_delta_path",
    "read_metadata",
    "save_safetensors",
]
