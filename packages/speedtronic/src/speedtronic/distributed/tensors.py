"""2.0 import path `speedtronic.distributed.tensors`: the tensor helpers, 2.0's path parser.

The helpers are speedtronic_diloco's; parse_delta_path is 2.0's form of its parse_delta_ref.
"""

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
    parse_delta_ref,
    read_metadata,
    save_safetensors,
)


def parse_delta_path(path: str) -> tuple[str, int] | None:
    """Return (node_id, local_step) for a delta path (2.0's form of parse_delta_ref), or None."""
    ref = parse_delta_ref(path)
    return None if ref is None else (ref.node_id, ref.local_step)


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
