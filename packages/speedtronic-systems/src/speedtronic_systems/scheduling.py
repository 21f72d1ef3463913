"""Dependency-aware forward/backward stream scheduling (out-of-order backprop) for CUDA."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from speedtronic_config.config import OOO_STREAMS_RANGE
from speedtronic_systems.parallel import unwrap_model

_logger = logging.getLogger(__name__)

# Containers are not work of their own: their children are the stages.
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


@dataclass(frozen=True)
class StageInfo:
    """One stage root: its dotted module name and the index of the CUDA stream it runs on."""

    name: str
    stream_index: int


def _iter_tensors(value: Any) -> Iterable[torch.Tensor]:
    """Yield every tensor inside nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _iter_tensors(item)


def _expand_stage_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Find disjoint, meaningful stage roots without nesting hooks.

    The model's children are the stages, except that containers are replaced by their children
    (recursively) and modules without parameters (dropout, activations) are skipped, because they
    have no backward work worth a stream. No returned module contains another. A DDP wrapper's
    one child is the whole model: the stages are the wrapped model's.
    """
    stages: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(child, _CONTAINERS):
                visit(path, child)
            elif any(True for _ in child.parameters()):
                stages.append((path, child))

    visit("", unwrap_model(model))
    return stages


class StageStreamScheduler:
    """Run disjoint module stages on CUDA streams for autograd's DAG engine.

    PyTorch's autograd engine already performs dependency-aware out-of-order node execution. The
    engine still routes a node to the forward stream that created it, so this scheduler assigns
    disjoint forward stages to multiple streams. Cross-stream inputs wait on their producer and
    record_stream protects allocator reuse. CPU and MPS intentionally fall back to the standard
    sequential path: no hooks are installed and nothing changes.
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device | str,
        *,
        num_streams: int = 4,
        logger: Any | None = None,
    ) -> None:
        low, high = OOO_STREAMS_RANGE  # ooo_streams' range, defined with the setting
        if (
            isinstance(num_streams, bool)
            or not isinstance(num_streams, int)
            or not low <= num_streams <= high
        ):
            raise ValueError(
                f"ooo_streams must be an integer in {low}..{high}; got {num_streams!r}"
            )
        self.device = torch.device(device)
        self.num_streams = num_streams
        self.logger = logger if logger is not None else _logger
        self.stages: list[StageInfo] = []
        self._streams: list[torch.cuda.Stream] = []
        self._handles: list[Any] = []
        self._stream_of: dict[int, torch.cuda.Stream] = {}  # id(module) -> its stage stream
        self._outer: list[torch.cuda.Stream] = []  # the stream each running stage was entered from
        self.active = self.device.type == "cuda" and torch.cuda.is_available()
        if not self.active:
            self.reason = (
                f"out-of-order backprop needs CUDA streams; {self.device.type} uses "
                "sequential backward"
            )
            self.logger.info("ooo_backprop: %s", self.reason)
            return
        self.reason = "active"
        self._streams = [torch.cuda.Stream(device=self.device) for _ in range(num_streams)]
        self._install_hooks(_expand_stage_modules(model))

    def _install_hooks(self, modules: list[tuple[str, nn.Module]]) -> None:
        for index, (name, module) in enumerate(modules):
            stream = self._streams[index % self.num_streams]
            self.stages.append(StageInfo(name, index % self.num_streams))
            self._stream_of[id(module)] = stream
            self._handles.append(module.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post_hook))

    def remove_hooks(self) -> None:
        """Remove every installed hook; later forwards run on the caller's stream."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        outer = torch.cuda.current_stream(self.device)
        stream = self._stream_of[id(module)]
        # The stage reads tensors the outer stream produced: wait for them, and keep the allocator
        # from reusing their memory before this stream is done with them.
        stream.wait_stream(outer)
        for tensor in _iter_tensors((args, kwargs)):
            if tensor.is_cuda:
                tensor.record_stream(stream)
        self._outer.append(outer)
        torch.cuda.set_stream(stream)

    def _post_hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        stream = self._stream_of[id(module)]
        outer = self._outer.pop()
        torch.cuda.set_stream(outer)
        outer.wait_stream(stream)
        for tensor in _iter_tensors(output):
            if tensor.is_cuda:
                tensor.record_stream(outer)

    def begin(self) -> None:
        """Start an optimizer step: stage streams wait for the caller's stream (the last update)."""
        if not self.active:
            return
        self._outer.clear()
        current = torch.cuda.current_stream(self.device)
        for stream in self._streams:
            stream.wait_stream(current)

    def finish(self) -> None:
        """End the backward pass: the caller's stream waits for every stage stream before the
        update.
        """
        if not self.active:
            return
        if self._outer:  # a stage's forward raised: its stream is still the current one
            torch.cuda.set_stream(self._outer[0])
            self._outer.clear()
        current = torch.cuda.current_stream(self.device)
        for stream in self._streams:
            current.wait_stream(stream)

    def dispose(self) -> None:
        """Remove the hooks and drain the streams; the model then runs exactly as before."""
        self.finish()
        self.remove_hooks()
        self._stream_of.clear()
        self._streams = []
        self.active = False

    def as_dict(self) -> dict[str, Any]:
        """Return the scheduler's state as plain data (for logs and run artifacts)."""
        return {
            "active": self.active,
            "device": str(self.device),
            "num_streams": self.num_streams,
            "reason": self.reason,
            "stages": [asdict(stage) for stage in self.stages],
        }


__all__ = ["StageInfo", "StageStreamScheduler"]
