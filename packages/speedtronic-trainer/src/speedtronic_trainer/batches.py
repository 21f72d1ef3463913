"""The batch and model-output protocol of the trainer: forward calls, losses and token counts."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from speedtronic_systems.loss import IGNORE_INDEX, causal_lm_loss


def move_batch(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Return the batch with every tensor moved to `device`, preserving dict/tuple/list
    structure.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: move_batch(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_batch(v, device, non_blocking) for v in batch)
    return batch


def shifts_labels_itself(model: torch.nn.Module) -> bool:
    """Return True for a `transformers` causal LM (a `*ForCausalLM` or `*LMHeadModel` such as
    GPT-2's, a class `AutoModelForCausalLM` builds, or a subclass of one): its forward shifts
    `labels` by one position, and the trainer's labels are shifted already.
    """
    names = [
        cls.__name__ for cls in type(model).__mro__ if cls.__module__.startswith("transformers.")
    ]
    if not names:
        return False
    causal = _causal_lm_classes()
    return any(name.endswith(("ForCausalLM", "LMHeadModel")) or name in causal for name in names)


def _causal_lm_classes() -> frozenset[str]:
    """Return the class names `AutoModelForCausalLM` builds, when transformers has loaded that
    table (it has for any model it built): transformers is not a dependency of this package.
    """
    auto = sys.modules.get("transformers.models.auto.modeling_auto")
    table = getattr(auto, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", {})
    names: set[str] = set()
    for value in table.values():
        names.update([value] if isinstance(value, str) else value)
    return frozenset(names)


def call_model(model: Any, batch: Any, *, labels: bool = True) -> Any:
    """Call the model with a dict batch as keywords, or a tuple/list batch as (inputs, labels);
    without `labels`, the batch's labels are left out of the call.
    """
    if isinstance(batch, Mapping):
        return model(**(batch if labels else {k: v for k, v in batch.items() if k != "labels"}))
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return model(batch[0], batch[1]) if labels else model(batch[0])
    raise TypeError(
        f"unsupported batch of type {type(batch).__name__}: the trainer needs a dict (called as "
        "model(**batch)) "
        "or a tuple/list of at least two items (called as model(batch[0], batch[1]))"
    )


def batch_labels(batch: Any) -> torch.Tensor | None:
    """Return the labels of a batch: its 'labels' entry, or the second item of a tuple/list."""
    if isinstance(batch, Mapping):
        labels = batch.get("labels")
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        labels = batch[1]
    else:
        labels = None
    return labels if isinstance(labels, torch.Tensor) else None


def batch_size_and_tokens(batch: Any) -> tuple[int, int]:
    """Return (samples, input tokens) of a batch from tensor shapes alone (no device sync)."""
    if isinstance(batch, Mapping):
        inputs = batch.get("input_ids")
        if not isinstance(inputs, torch.Tensor):
            inputs = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, (tuple, list)) and batch:
        inputs = batch[0]
    else:
        inputs = None
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
        return 1, 0
    return int(inputs.shape[0]), int(inputs.numel())


def valid_label_count(batch: Any) -> int | None:
    """Return how many label positions are not IGNORE_INDEX, or None when the batch has no
    labels.
    """
    labels = batch_labels(batch)
    if labels is None or labels.is_floating_point():
        return None
    return int((labels != IGNORE_INDEX).sum())


def unshifted_labels(batch: Any) -> bool:
    """Return True when a batch's labels are its input ids (transformers' unshifted convention).

    That is: equal to the input ids at every labelled position, and not the next input ids there
    (a constant row is both). Such a model shifts labels itself; the trainer's are shifted already.
    """
    labels = batch_labels(batch)
    if labels is None:
        return False
    inputs = batch.get("input_ids") if isinstance(batch, Mapping) else batch[0]
    if not isinstance(inputs, torch.Tensor) or inputs.shape != labels.shape:
        return False
    if labels.dim() < 1 or labels.is_floating_point() or inputs.is_floating_point():
        return False
    valid = labels != IGNORE_INDEX
    if int(valid.sum()) < 2:
        return False
    same = bool(((labels == inputs) | ~valid).all())
    ahead = valid[..., :-1]
    shifted = bool(((labels[..., :-1] == inputs[..., 1:]) | ~ahead).all())
    return same and not shifted


def _loss_from_logits(logits: torch.Tensor, batch: Any) -> torch.Tensor:
    labels = batch_labels(batch)
    if labels is None:
        raise ValueError(
            "the model returned logits but the batch has no labels ('labels' key or second item)"
        )
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits of shape {tuple(logits.shape)} do not match labels of shape "
            f"{tuple(labels.shape)}; "
            "labels must already be shifted, one next-token label per input position"
        )
    return causal_lm_loss(logits, labels)


def _one_element(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 1 and tensor.numel() == 1


def loss_from_output(output: Any, batch: Any) -> torch.Tensor:
    """Return the scalar loss of any supported model output form (loss, mapping, tuple, logits)."""
    if isinstance(output, torch.Tensor):
        if _one_element(output):  # a [1] loss (nn.DataParallel returns one): backward takes it
            return output.reshape(())
        if output.dim() != 0:
            raise ValueError(
                f"the model returned a tensor of shape {tuple(output.shape)}; a bare tensor is "
                "read as the loss "
                "and must be a scalar (return {'logits': ...} to have the trainer compute the loss)"
            )
        return output
    if isinstance(output, Mapping):
        if output.get("loss") is not None:
            return loss_from_output(output["loss"], batch)
        if isinstance(output.get("logits"), torch.Tensor):
            return _loss_from_logits(output["logits"], batch)
        raise ValueError(
            f"the model returned a mapping without 'loss' or 'logits' (keys: {sorted(output)})"
        )
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        first = output[0]
        if first.dim() == 0 or _one_element(first):
            return first.reshape(())
        if first.dim() == 3:
            return _loss_from_logits(first, batch)
        raise ValueError(
            f"the model's first output has shape {tuple(first.shape)}; expected a scalar loss "
            "or 3-D logits [batch, sequence, vocab]"
        )
    raise TypeError(
        f"unsupported model output of type {type(output).__name__}: return a scalar loss, a "
        "mapping with "
        "'loss' or 'logits', or a tuple/list whose first item is a loss or 3-D logits"
    )


__all__ = [
    "batch_labels",
    "batch_size_and_tokens",
    "call_model",
    "loss_from_output",
    "move_batch",
    "shifts_labels_itself",
    "unshifted_labels",
    "valid_label_count",
]
