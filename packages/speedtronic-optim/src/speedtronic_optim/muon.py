"""Pure-PyTorch Muon (and Muon+) for 2-D hidden matrices."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from speedtronic_optim.adamw import DEFAULT_LR
from speedtronic_optim.checks import check_arguments, check_parameters, show_value
from speedtronic_optim.distributed_muon import (
    check_process_group,
    init_sharded_state,
    is_sharded,
    work_split,
)
from speedtronic_optim.facade import evaluate_closure
from speedtronic_optim.newton_schulz import (
    GRAM_DTYPES,
    METHODS,
    NORMALIZE_MODES,
    Coefficients,
    coefficient_schedule,
    compile_time_constant,
    match_polar_scale,
    orthogonalize,
    post_polar_normalize,
    work_dtype,
)
from speedtronic_optim.saved_state import check_layout, check_state_dict, check_state_shapes

ADJUST_LR = ("original", "match_rms_adamw", "none")
# torch.optim.Muon's adjust_lr_fn values (None is its "original") as this Muon's adjust_lr.
_TORCH_ADJUST_LR = {None: "original", "original": "original", "match_rms_adamw": "match_rms_adamw"}
# Group options every Muon state holds, speedtronic's since 2.0 and torch.optim.Muon's; newer ones
# a state may lack take the loading optimizer's values.
_SAVED = ("lr", "momentum", "nesterov", "ns_steps", "weight_decay", "eps")
# Group options checked like the constructor's arguments, so a per-group value fails when the
# group is added (constructor or add_param_group), not at step() or silently inside it.
_CHECKED = (
    "lr",
    "momentum",
    "nesterov",
    "ns_steps",
    "weight_decay",
    "eps",
    "norm_eps",
    "muon_plus",
    "ns_dtype",
    "transposed",
)
_CHOICES = {"adjust_lr": ADJUST_LR, "normalize_mode": NORMALIZE_MODES, "ns_method": METHODS}


def _check_options(owner: str, options: dict[str, Any]) -> None:
    """Raise naming the option when one of `options` (Muon arguments or group keys) is bad."""
    check_arguments(owner, **{key: options[key] for key in _CHECKED if key in options})
    for name, choices in _CHOICES.items():
        if name in options and options[name] not in choices:
            raise ValueError(
                f"{owner} {name}: expected one of {choices}, got {show_value(options[name])}"
            )
    method, dtype = options.get("ns_method"), options.get("ns_dtype")
    if method == "gram" and dtype is not None and dtype not in GRAM_DTYPES:
        raise ValueError(
            f"{owner} ns_method: 'gram' is numerically unstable in ns_dtype={dtype} (it amplifies "
            "rounding); use ns_dtype=torch.float32 or None, or ns_method 'auto' or 'standard'"
        )
    if "ns_coefficients" in options:
        coefficients = options["ns_coefficients"]
        try:
            coefficient_schedule(coefficients, 1)
        except (TypeError, ValueError):
            raise ValueError(
                f"{owner} ns_coefficients: expected 'reference', 'polar_express', one (a, b, c) "
                f"triple of finite numbers or a non-empty sequence of them, got "
                f"{show_value(coefficients)}"
            ) from None


def _from_torch_muon(groups: list[dict[str, Any]]) -> None:
    """Rename torch.optim.Muon's group key adjust_lr_fn to adjust_lr, in place, refusing a value
    that would change the update (a state saved by torch.optim.Muon then loads with its maths).
    """
    for index, group in enumerate(groups):
        if "adjust_lr_fn" not in group:
            continue
        value = group.pop("adjust_lr_fn")
        rule = _TORCH_ADJUST_LR.get(value) if value is None or isinstance(value, str) else None
        if rule is None or group.get("adjust_lr", rule) != rule:
            found = f"adjust_lr={group['adjust_lr']!r} and " if "adjust_lr" in group else ""
            raise ValueError(
                f"Muon.load_state_dict: group {index} has {found}torch.optim.Muon's "
                f"adjust_lr_fn={show_value(value)}, which Muon cannot run as saved; set the "
                "group's adjust_lr_fn to None, 'original' or 'match_rms_adamw' (and drop any "
                "adjust_lr) in the state dict, or start a new run"
            )
        group["adjust_lr"] = rule


def _add_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return the dtype updates are added to parameters of `dtype` in: their own, but float32 for
    fp16, as torch.optim.Muon's bf16 update promotes it to (an fp16 + fp16 add on CPU rounds
    ``lr * update`` to fp16 first: 1 ulp off torch on about 0.5% of the entries).
    """
    return torch.float32 if dtype == torch.float16 else dtype


def adjusted_lr(lr: float, rule: str, shape: torch.Size) -> float:
    """Return the per-matrix lr: sqrt(max(1, rows/cols)) (original) or 0.2*sqrt(max) (AdamW RMS)."""
    rows, cols = shape[-2], shape[-1]  # (out, in), as nn.Linear stores them
    if rule == "original":
        return lr * math.sqrt(max(1.0, rows / max(cols, 1)))  # a 0-column matrix: no update
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Muon(Optimizer):
    """A pure-PyTorch Muon optimizer for routed 2-D parameter groups.

    Same update as ``torch.optim.Muon``: EMA momentum ``buf.lerp_(grad, 1 - momentum)``, Nesterov
    ``grad.lerp(buf, momentum)``, Newton–Schulz, decoupled weight decay
    ``p *= 1 - lr * weight_decay`` (unscaled lr), then ``p -= adjusted_lr * update``.
    ``ns_dtype=None`` runs Newton–Schulz in bf16 (as torch does) on GPUs and BF16-capable CPUs,
    and in float32 on CPUs without BF16 instructions, where torch's bf16 is emulated and slow;
    ``ns_method="auto"`` uses the Gram iteration for matrices with aspect ratio >= 1.5.
    ``distributed`` splits Newton–Schulz over data-parallel ranks (``distributed_muon``): None
    splits FSDP2 (DTensor) parameters over their mesh; True also splits plain parameters, which
    must then be DDP replicas, over ``process_group`` (default: the world); False makes every
    rank do all the work. Without a process group of more than one rank nothing is split.
    ``transposed=True`` (a group option) marks matrices stored (in, out), as transformers'
    ``Conv1D`` stores GPT-2's: each is updated as its (out, in) transpose would be, for the rules
    that read rows and columns (``adjust_lr="original"``, Muon+'s ``normalize_mode``).
    ``route_parameters(model).muon_param_groups()`` sets it for Conv1D weights.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = DEFAULT_LR,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        eps: float = 1e-7,
        norm_eps: float = 1e-8,
        muon_plus: bool = False,
        *,
        adjust_lr: str = "original",
        normalize_mode: str = "row_col",
        ns_coefficients: str | Coefficients | Sequence[Coefficients] = "reference",
        ns_method: str = "auto",
        ns_dtype: torch.dtype | None = None,
        transposed: bool = False,
        distributed: bool | None = None,
        process_group: Any = None,
    ) -> None:
        # Attributes, not group entries: state dicts saved before these existed still load.
        self.distributed = distributed
        self.process_group = process_group
        check_parameters("Muon params", params)
        check_arguments("Muon", distributed=distributed)
        check_process_group("Muon process_group", process_group)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            weight_decay=weight_decay,
            eps=eps,
            norm_eps=norm_eps,
            muon_plus=muon_plus,
            adjust_lr=adjust_lr,
            normalize_mode=normalize_mode,
            ns_coefficients=ns_coefficients,
            ns_method=ns_method,
            ns_dtype=ns_dtype,
            transposed=transposed,
        )
        # Checked here, not first at step(): a typo fails when the optimizer is built.
        _check_options("Muon", defaults)
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        """Return what pickling keeps: torch's defaults, state and groups, and the split mode."""
        mode = {"distributed": self.distributed, "process_group": self.process_group}
        return {**super().__getstate__(), **mode}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled Muon (one pickled before the split mode existed runs in auto mode),
        or load_state_dict's groups and state (the split mode is kept: it is not saved).
        """
        # load_state_dict hands its result here, after its pre-hooks and before anything changes.
        _from_torch_muon(state.get("param_groups", []))
        check_state_shapes(
            "Muon.load_state_dict", state.get("param_groups", []), state.get("state", {})
        )
        mode = {name: self.__dict__.get(name) for name in ("distributed", "process_group")}
        super().__setstate__({**mode, **state})
        # Groups saved before an option existed (2.0's Muon) take this optimizer's value.
        for group in self.param_groups:
            for key in (*_CHECKED, *_CHOICES, "ns_coefficients"):  # every Muon option
                if key in self.defaults:
                    group.setdefault(key, self.defaults[key])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a saved state; each group keeps its own ``transposed``: it describes how this
        optimizer's parameters are stored, which a state saved before it existed cannot know.
        """
        check_state_dict("Muon.load_state_dict", state_dict)
        layouts = [group["transposed"] for group in self.param_groups]
        # Checked as torch reads it: after the caller's pre hooks, which may convert the state.
        check = self.register_load_state_dict_pre_hook(
            lambda _, saved: check_layout("Muon.load_state_dict", saved, _SAVED)
        )
        try:
            super().load_state_dict(state_dict)
        finally:
            check.remove()
        for group, transposed in zip(self.param_groups, layouts, strict=True):
            group["transposed"] = transposed

    def _split_names(
        self, owner: str, param_group: dict[str, Any], params: list[Any]
    ) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Return the group with ``param_names`` and its bare tensors, as torch.optim records
        (name, parameter) pairs; done here because torch.optim only takes them from torch 2.6.
        """
        names = [item[0] for item in params if isinstance(item, tuple)]
        if names and len(names) != len(params):
            raise ValueError(
                f"{owner}: {len(names)} of {len(params)} parameters are (name, parameter) pairs; "
                "name every parameter of a group (named_parameters()) or none"
            )
        named = bool(names) or "param_names" in param_group
        if any(("param_names" in group) != named for group in self.param_groups):
            raise ValueError(
                f"{owner} {'names' if named else 'does not name'} its parameters but an earlier "
                "group does the opposite; name the parameters of every group or of none"
            )
        if not names:
            return param_group, params
        return {**param_group, "param_names": names}, [item[1] for item in params]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group after checking every parameter is a 2-D matrix."""
        owner = f"Muon param group {len(self.param_groups)}"
        if not isinstance(param_group, dict):
            raise TypeError(
                f"{owner}: expected a dict with a 'params' key, got a "
                f"{type(param_group).__name__}; pass {{'params': [...], ...}}"
            )
        if "params" not in param_group:
            raise ValueError(f"{owner} has no 'params': pass {{'params': [...], ...}}")
        params = param_group["params"]
        # A set stays one for torch to refuse (its order changes between runs).
        params = [params] if isinstance(params, torch.Tensor) else params
        params = params if isinstance(params, set) else list(params)
        for index, item in enumerate(params):
            # (name, parameter) pairs, as from named_parameters(): torch records the names.
            named = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            param = item[1] if named else item
            where = f"{item[0]!r}" if named else f"{index} of the group"
            if not isinstance(param, torch.Tensor):
                raise TypeError(
                    f"Muon params: parameter {where} is a {type(param).__name__}, "
                    "not a tensor; pass 2-D parameters (route_parameters(model).muon)"
                )
            if param.ndim != 2:
                raise ValueError(
                    f"Muon only optimizes 2-D matrices; parameter {where} has shape "
                    f"{tuple(param.shape)}. Route biases, norms, embeddings and other tensors to "
                    "AdamW "
                    "(route_parameters does this)."
                )
            if not param.is_floating_point():
                why = (
                    "Newton-Schulz would drop its imaginary part; optimize torch.view_as_real of "
                    "it or route it to AdamW"
                    if param.is_complex()
                    else "route it to AdamW or make it a float tensor"
                )
                raise ValueError(
                    f"Muon only optimizes real floating-point matrices; parameter {where} is "
                    f"{param.dtype}: {why}"
                )
        options = {key: value for key, value in param_group.items() if key != "params"}
        # With the defaults: a group's ns_method must suit the ns_dtype it inherits, and back.
        _check_options(owner, {**self.defaults, **options})
        if not isinstance(params, set):
            param_group, params = self._split_names(owner, param_group, params)
        super().add_param_group({**param_group, "params": params})
        init_sharded_state(self.state, self.param_groups[-1]["params"])

    def _direction(self, param: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        grad = param.grad
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1 - group["momentum"])
        return grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one Muon step; returns the closure's loss (closure called once) or None."""
        loss = evaluate_closure(closure)
        check_dense("Muon", self.param_groups)
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            split = work_split(params, self.distributed, self.process_group)
            if split is not None:
                directions = [self._direction(param, group) for param in params]
                apply = functools.partial(self._apply, group)
                split.step(
                    params, directions, functools.partial(self._orthogonalized, group), apply
                )
                continue
            for batch in _same_shape_batches(params, group):
                batch_params = [params[i] for i in batch]
                # Made just before use: all of a model's directions at once outgrow the cache.
                directions = [self._direction(param, group) for param in batch_params]
                self._update(group, batch_params, directions)
        return loss

    def _update(
        self, group: dict[str, Any], params: list[torch.Tensor], directions: list[torch.Tensor]
    ) -> None:
        """Orthogonalize same-shaped directions in one batched Newton–Schulz and apply them."""
        update = self._polar(group, directions)
        self._apply(group, params, list(update.unbind(0)), params[0].shape)

    def _orthogonalized(
        self, group: dict[str, Any], directions: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Return the update of each whole matrix, batched by shape as in the local step."""
        updates: dict[int, torch.Tensor] = {}
        for batch in _same_shape_batches(directions, group):
            stacked = self._polar(group, [directions[i] for i in batch])
            updates.update(zip(batch, stacked.unbind(0), strict=True))
        return [updates[index] for index in range(len(directions))]

    def _polar(self, group: dict[str, Any], directions: list[torch.Tensor]) -> torch.Tensor:
        """Return the stacked (Muon+ normalized) orthogonal updates of same-shaped directions."""
        # One direction is viewed as a batch of one, not copied: orthogonalize never writes to it.
        stacked = torch.stack(directions) if len(directions) > 1 else directions[0].unsqueeze(0)
        if group["transposed"]:  # work on the (out, in) matrices: rows are output features
            stacked = stacked.mT
        polar = orthogonalize(
            stacked,
            group["ns_steps"],
            group["eps"],
            coefficients=group["ns_coefficients"],
            method=group["ns_method"],
            dtype=group["ns_dtype"],
        )
        update = polar
        if group["muon_plus"]:
            # Same size as the plain Muon update, so Muon and Muon+ share one learning rate.
            update = post_polar_normalize(
                polar, mode=group["normalize_mode"], eps=group["norm_eps"]
            )
            update = match_polar_scale(update, polar, eps=group["norm_eps"])
        return update.mT if group["transposed"] else update

    def _apply(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        updates: list[torch.Tensor],
        shape: torch.Size,
    ) -> None:
        """Decay and update `params` (whole matrices or shards of matrices of `shape`)."""
        lr, weight_decay = group["lr"], group["weight_decay"]
        if group["transposed"]:
            shape = torch.Size((shape[-1], shape[-2]))
        if weight_decay:
            decay = 1 - lr * weight_decay
            # A tensor factor: on CPU _foreach_mul_ rounds a float one to the parameters' dtype
            # (bf16: 1 - 0.002 became 1 - 2**-8, twice the decay); torch.optim.Muon's mul_ and a
            # tensor factor multiply in float32.
            if not isinstance(decay, torch.Tensor):
                decay = torch.tensor(decay, dtype=torch.float64)
            torch._foreach_mul_(params, decay)
        # Updates arrive in the work dtype (local step) or the parameters' (distributed Muon). A
        # tall matrix's arrives transposed (Newton–Schulz works on the wide side): on CPU a
        # blocked copy first lets the add read it in order; read strided, a 2048x768 add took 4x
        # as long. Not onto bf16 parameters: the CPU's bf16 add rounds its in-order loop unlike
        # the strided one, which torch.optim.Muon's add takes.
        dtype = _add_dtype(params[0].dtype)
        in_order = params[0].device.type == "cpu" and params[0].dtype != torch.bfloat16
        updates = [(update.contiguous() if in_order else update).to(dtype) for update in updates]
        torch._foreach_add_(params, updates, alpha=-adjusted_lr(lr, group["adjust_lr"], shape))


# One batched Newton–Schulz call per shape, in chunks capped so the stacked copy stays small next
# to the model. On accelerators large batches save kernel launches. On CPU a stack past a few
# million elements costs more in copies than batching saves: 12 layers x d_model 768 in bf16 ran
# at 1.26x torch.optim.Muon with 2^22-element chunks, 1.14x with 2^23, 0.93x with 2^26 and 1.07x
# one matrix at a time (tools/bench/bench_optim.py measures the shipped cap against 2^26).
MAX_BATCH_ELEMENTS = 1 << 26
MAX_CPU_BATCH_ELEMENTS = 1 << 22


@functools.cache  # read at the first one-thread CPU step: an import never touches sysfs
def _l2_cache_bytes() -> int:
    """Return one CPU core's L2 cache size (Linux sysfs), or 1 MiB, common today, where unknown."""
    for index in range(8):
        folder = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        try:
            with open(f"{folder}/level") as level, open(f"{folder}/size") as size:
                if level.read().strip() == "2":
                    text = size.read().strip().upper()  # e.g. "2048K"
                    return int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1:], 0)
        except (OSError, ValueError):
            continue
    return 1 << 20


# torch.compile cannot trace these probes (get_num_threads, the sysfs read): it runs them while it
# compiles a step, whose batching then keeps what they said (batch sizes set speed, not maths).
@compile_time_constant
def _several_cpu_threads() -> bool:
    """Return True when torch runs CPU operators on more than one thread."""
    return torch.get_num_threads() > 1


@compile_time_constant
def _one_thread_batch(shape: torch.Size, dtype: torch.dtype) -> int:
    """Return how many matrices of `shape` one batched Newton–Schulz call takes on one CPU thread.

    With several threads a batched product spreads whole matrices over them (1.3x
    torch.optim.Muon's one at a time on two), so only the element cap bounds it. On one thread
    batching saves only per-call overhead, so a batch holds what the L2 cache holds of one step's
    working set (X, X X^T, the polynomial and the next X, in the work `dtype`); past that every
    product streams its operands from memory: with a 2 MiB L2, 768x768 bf16 ran 40% slower in
    batches of 7 than alone, while 256x256 ran best in batches of 4 and 128x128 of 14.
    """
    rows, cols = sorted(shape[-2:])
    working = dtype.itemsize * 2 * (rows * cols + rows * rows)
    return max(1, _l2_cache_bytes() // max(1, working))


def _same_shape_batches(params: list[torch.Tensor], group: dict[str, Any]) -> list[list[int]]:
    """Return indices of params grouped by (shape, dtype, device, DTensor layout), in chunks of at
    most MAX_BATCH_ELEMENTS (on CPU: MAX_CPU_BATCH_ELEMENTS, and `_one_thread_batch` matrices
    when torch runs on one thread).
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, param in enumerate(params):
        # torch.stack refuses plain tensors mixed with DTensors (a partly FSDP2-wrapped model).
        layout = (param.device_mesh, tuple(param.placements)) if is_sharded(param) else None
        key = (tuple(param.shape), param.dtype, param.device, layout)
        if key not in groups:  # not setdefault: torch 2.4 cannot compile dict.setdefault
            groups[key] = []
        groups[key].append(index)
    batches = []
    for indices in groups.values():
        first = params[indices[0]]
        numel = max(1, first.numel())  # an empty matrix (0 x n) costs nothing
        if first.device.type != "cpu":
            size = MAX_BATCH_ELEMENTS // numel
        elif _several_cpu_threads():
            size = MAX_CPU_BATCH_ELEMENTS // numel
        else:
            options = (group["ns_coefficients"], group["ns_method"], group["ns_dtype"])
            dtype = work_dtype(first.device, *options)
            size = min(MAX_CPU_BATCH_ELEMENTS // numel, _one_thread_batch(first.shape, dtype))
        size = max(1, size)
        batches.extend(indices[start : start + size] for start in range(0, len(indices), size))
    return batches


def check_dense(owner: str, groups: list[dict[str, Any]]) -> None:
    """Raise before any group changes when a gradient is sparse."""
    for param in (param for group in groups for param in group["params"]):
        if param.grad is not None and param.grad.is_sparse:
            raise RuntimeError(
                f"{owner} does not support sparse gradients (parameter of shape "
                f"{tuple(param.shape)}); use dense gradients, e.g. nn.Embedding(sparse=False)"
            )
