"""Hardware capability detection and mixed-precision helpers."""

from __future__ import annotations

import functools
import logging
import platform
import re
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from speedtronic_config import PrecisionConfig, resolve_section
from speedtronic_systems.parallel import ParallelContext

logger = logging.getLogger(__name__)

MODES = ("auto", "bf16", "fp16", "fp32")
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}

# Measured by tools/bench/bench_cpu_settings.py (`bf16` in tools/bench/results/cpu_settings.json;
# tools/bench/report.py --check keeps them equal): on a CPU with native BF16, the narrowest model
# width from which bf16 autocast trained faster than FP32 at every measured width (0.93x at 128,
# 1.33x at 256, 1.35x at 512 on an AMX Xeon). `precision.mode: auto` picks bf16 from here on.
# A Zen 4 EPYC (AVX512-BF16, no AMX) gains earlier (1.04x at 128, 1.14x at 192, 1.21x at 256;
# tools/bench/results/earlier/bf16_zen4.json), so 256 holds on both.
CPU_BF16_MIN_WIDTH = 256

# Fallback reasons already logged in this process: a run that resolves precision many times
# (trainer, runtime, benchmarks) says each one once.
_logged_fallbacks: set[tuple[str, str, str]] = set()


class DeviceError(ValueError):
    """A requested device is malformed or not present on this machine."""


class PrecisionError(ValueError):
    """A precision section names an unknown mode or dtype."""


@dataclass(frozen=True)
class PrecisionPlan:
    """The resolved precision of a run: what autocast and the GradScaler will do on
    `device_type`.
    """

    mode: str  # the resolved mode: "bf16", "fp16" or "fp32" (never "auto")
    dtype: torch.dtype
    use_scaler: bool
    autocast_enabled: bool
    device_type: str
    # Why `auto` chose this mode, where the choice depended on the machine and model (CPU).
    reason: str = field(default="", compare=False)

    def is_mixed_precision(self) -> bool:
        """Return True when forward passes run under a lower-precision autocast."""
        return self.autocast_enabled


# ----------------------------------------------------------------------------- capability queries
# Small module-level functions so tests can fake a CUDA or MPS machine with monkeypatch.


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _cuda_device_count() -> int:
    return torch.cuda.device_count()


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _cuda_bf16_supported(device: torch.device) -> bool:
    """Return True when the CUDA `device` (the current one without an index) has BF16 in
    hardware: compute capability 8.0+, or any ROCm GPU.
    """
    # Not torch.cuda.is_bf16_supported(): since torch 2.3 it is also true where a BF16 tensor can
    # merely be made (V100, T4), whose emulated BF16 matmuls are far slower than FP16's.
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def _cuda_device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def _x86_bf16_instructions() -> bool | None:
    """Return whether this x86 CPU has BF16 instructions (AVX512-BF16 or AMX), or None where that
    cannot be told (another architecture, or a torch without these probes).
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    names = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    probes = [probe for name in names if callable(probe := getattr(torch.cpu, name, None))]
    if not probes:
        return None
    try:
        return any(probe() for probe in probes)
    except Exception:  # a probe that cannot run tells nothing: leave it to oneDNN's
        return None


def cpu_bf16_supported() -> bool:
    """Return True when this CPU has native BF16 matmuls: oneDNN supports BF16 and, on x86, the
    CPU has AVX512-BF16 or AMX.
    """
    probe = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if probe is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        supported = bool(probe())
    except Exception:  # an unusual build without the op: treat BF16 as emulated, i.e. unsupported
        return False
    # oneDNN's probe is true on every AVX512 CPU, where it emulates BF16: with oneDNN held to
    # AVX512_CORE, bf16 autocast trained at 0.80-0.84x FP32's speed at d_model 256-512.
    return supported and _x86_bf16_instructions() is not False


# ------------------------------------------------------------------------------------------ device


def resolve_device(requested: str | torch.device | None = "auto") -> torch.device:
    """Return the torch.device for "auto" (CUDA, then MPS, then CPU), "cpu", "cuda", "cuda:N" or
    "mps".
    """
    if requested is None:
        requested = "auto"
    text = str(requested).strip().lower()
    if text == "auto":
        if _cuda_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise DeviceError(
            f"device {requested!r} is not a device name; use auto, cpu, cuda, cuda:N or mps"
        ) from exc
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not _cuda_available():
            raise DeviceError(
                f"device {requested!r} requested but CUDA is not available; "
                f"available: {', '.join(available_devices())}"
            )
        count = _cuda_device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"device {requested!r} requested but only {count} CUDA device(s) exist; "
                f"available: {', '.join(available_devices())}"
            )
        return device
    if device.type == "mps":
        if not _mps_available():
            raise DeviceError(
                f"device {requested!r} requested but MPS is not available; "
                f"available: {', '.join(available_devices())}"
            )
        return device
    raise DeviceError(f"device {requested!r} is not supported; use auto, cpu, cuda, cuda:N or mps")


def available_devices() -> list[str]:
    """Return the device names this machine can run on, e.g. ["cpu", "cuda:0", "cuda:1"]."""
    names = ["cpu"]
    if _cuda_available():
        names += [f"cuda:{i}" for i in range(_cuda_device_count())]
    if _mps_available():
        names.append("mps")
    return names


# --------------------------------------------------------------------------------------- precision


def _read_section(section: Any) -> tuple[str, str | None]:
    """Return (mode, dtype) of a precision section, its string shorthand, or None (auto)."""
    if isinstance(section, str):
        section = PrecisionConfig(mode=section)
    section = resolve_section(section, "precision")
    return section.mode, section.dtype


def _plan(mode: str, device_type: str) -> PrecisionPlan:
    mixed = mode != "fp32"
    return PrecisionPlan(
        mode=mode,
        dtype=DTYPES[mode],
        use_scaler=mode == "fp16" and device_type == "cuda",
        autocast_enabled=mixed,
        device_type=device_type,
    )


def matmul_width(model: torch.nn.Module) -> int:
    """Return the median over the model's `nn.Linear` layers of their narrower side (0 without
    any): the width that decides whether BF16 matmuls pay on a CPU.
    """
    sides = sorted(
        min(module.in_features, module.out_features)
        for module in model.modules()
        if isinstance(module, torch.nn.Linear)
    )
    return sides[len(sides) // 2] if sides else 0


def _cpu_auto(model: torch.nn.Module) -> PrecisionPlan:
    width = matmul_width(model)
    if width < CPU_BF16_MIN_WIDTH:
        why = f"matmuls {width} wide; bf16 autocast pays on CPU from {CPU_BF16_MIN_WIDTH}"
        return replace(_plan("fp32", "cpu"), reason=why)
    if not cpu_bf16_supported():
        why = "this CPU has no native BF16 (AVX512-BF16/AMX)"
        return replace(_plan("fp32", "cpu"), reason=why)
    why = (
        f"native BF16 and matmuls {width} wide (bf16 autocast pays from {CPU_BF16_MIN_WIDTH}); "
        "precision.mode: fp32 keeps FP32"
    )
    return replace(_plan("bf16", "cpu"), reason=why)


def _fallback(requested: str, device_type: str, reason: str, resolved: str) -> PrecisionPlan:
    """Log (once per process) why `requested` became `resolved`, and return the resolved plan."""
    key = (requested, device_type, reason)
    if key not in _logged_fallbacks:
        _logged_fallbacks.add(key)
        logger.warning(
            "precision %s on %s falls back to %s: %s", requested, device_type, resolved, reason
        )
    return _plan(resolved, device_type)


def resolve_precision(
    config: Any, device: torch.device | str, model: torch.nn.Module | None = None
) -> PrecisionPlan:
    """Resolve a precision section against the actual device (and, for `auto` on CPU, the model
    it will train).

    The explicit mode wins, except that an explicit unsupported mixed mode falls back to a safe mode
    rather than making a run unusable.
    """
    mode, dtype = _read_section(config)
    device = torch.device(device)
    device_type = device.type
    if mode == "auto":
        return _resolve_auto(dtype, device, model)
    if mode == "fp32":
        return _plan("fp32", device_type)
    if device_type == "cuda":
        if mode == "bf16" and not _cuda_bf16_supported(device):
            return _fallback("bf16", device_type, "this CUDA device does not support BF16", "fp32")
        return _plan(mode, device_type)
    if device_type == "cpu":
        if mode == "fp16":
            return _fallback(
                "fp16", device_type, "FP16 autocast on CPU is slow and has no GradScaler", "fp32"
            )
        if not cpu_bf16_supported():
            return _fallback(
                "bf16",
                device_type,
                "PyTorch reports no native BF16 support on this CPU "
                "(needs AVX512-BF16/AMX); BF16 would be emulated and slower",
                "fp32",
            )
        return _plan("bf16", device_type)
    if device_type == "mps":
        return _fallback(mode, device_type, "mixed precision is not supported on MPS", "fp32")
    return _fallback(
        mode,
        device_type,
        f"mixed precision is not supported on device type {device_type!r}",
        "fp32",
    )


def _resolve_auto(
    dtype: str | None, device: torch.device, model: torch.nn.Module | None
) -> PrecisionPlan:
    """Apply auto's rules: CUDA BF16, else CUDA FP16 + GradScaler; on CPU BF16 where it is native
    and the model is wide enough to gain, else FP32; `dtype` steers CUDA only (`fp32` keeps FP32
    everywhere).
    """
    device_type = device.type
    if device_type != "cuda":
        # A bf16/fp16 hint is for CUDA: on CPU the hardware and the model decide, as without one.
        if device_type == "cpu" and dtype != "fp32" and model is not None:
            return _cpu_auto(model)
        if dtype in ("bf16", "fp16"):
            # Only a CPU can be asked for BF16 explicitly; MPS falls back from it too.
            why = (
                "auto precision is FP32 on CPU without a model to size; set precision.mode: bf16 "
                "to request BF16"
                if device_type == "cpu"
                else f"mixed precision is not supported on {device_type.upper()}"
            )
            return _fallback(f"auto (dtype {dtype})", device_type, why, "fp32")
        return _plan("fp32", device_type)
    preferred = dtype or "bf16"
    if preferred == "bf16" and not _cuda_bf16_supported(device):
        return _fallback(
            "auto (bf16)", device_type, "this CUDA device does not support BF16", "fp16"
        )
    return _plan(preferred, device_type)


def agree_precision(plan: PrecisionPlan, group: ParallelContext) -> PrecisionPlan:
    """Return the precision every rank of `group` trains in: `plan` when all ranks resolved the
    same mode, else FP32 with the reason (ranks on different hardware can resolve `auto`, or an
    explicit mode's fallback, differently; their gradients would then be averaged across
    precisions, and only FP16 ranks would scale theirs). Every rank must call it.
    """
    split = group.disagreement(plan.mode)
    if split is None:
        return plan
    why = f"the ranks resolved different precisions ({split}); every rank trains in fp32"
    return replace(_plan("fp32", plan.device_type), reason=why)


def autocast_context(
    plan: PrecisionPlan, device: torch.device | str | None = None
) -> AbstractContextManager:
    """Return the autocast context for a plan, or a no-op context when the plan is FP32."""
    if not plan.autocast_enabled:
        return nullcontext()
    device_type = torch.device(device).type if device is not None else plan.device_type
    return torch.autocast(device_type=device_type, dtype=plan.dtype)


def make_grad_scaler(plan: PrecisionPlan) -> torch.amp.GradScaler | None:
    """Return a GradScaler when the plan needs one (CUDA FP16), else None."""
    if not plan.use_scaler:
        return None
    return torch.amp.GradScaler(plan.device_type)


@functools.cache
def _fused_adamw_probe(device: str) -> bool:
    param = torch.zeros(1, device=device, requires_grad=True)
    param.grad = torch.ones_like(param)
    torch.optim.AdamW([param], lr=1e-3, fused=True).step()
    return True


def supports_fused_adamw(device: torch.device | str) -> bool:
    """Return True when a fused AdamW can be built and stepped on `device` (probed once per
    device).
    """
    try:
        return _fused_adamw_probe(str(torch.device(device)))
    except Exception:  # the fused kernel is a speed-up, never a requirement
        return False


def parameter_count(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Return the number of (shared-once) parameters in `model`, optionally only those requiring
    grad.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ------------------------------------------------------------------------------------ peak FLOPs

# Dense (no sparsity) matmul peaks in FLOP/s from the vendors' datasheets: (BF16, FP16, FP32).
# FP32 is the non-tensor-core rate, since PyTorch's default matmul precision does not use TF32.
# A key matches whole words of the device name (an "L40" is not an "L4", an "RTX A1000" not an
# "A100"); the longest matching key wins ("H100 PCIe" over "H100"). The H100 NVL and PCIe cards
# run the same chip at lower clocks and power than the SXM part that plain "H100" stands for.
PEAK_FLOPS: tuple[tuple[str, tuple[float | None, float, float]], ...] = (
    ("GH200", (989e12, 989e12, 67e12)),
    ("H200", (989e12, 989e12, 67e12)),
    ("H100 NVL", (835e12, 835e12, 60e12)),
    ("H100 PCIe", (756e12, 756e12, 51e12)),
    ("H100", (989e12, 989e12, 67e12)),
    ("A100", (312e12, 312e12, 19.5e12)),
    ("L40S", (362e12, 362e12, 91.6e12)),
    ("L4", (121e12, 121e12, 30.3e12)),
    ("RTX 4090", (165e12, 165e12, 82.6e12)),
    ("A10G", (70e12, 70e12, 31.2e12)),
    ("V100", (None, 125e12, 15.7e12)),
    ("T4", (None, 65e12, 8.1e12)),
)


def _dtype_of(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise PrecisionError(
            f"dtype must be one of {', '.join(DTYPES)} or a torch.dtype; got {dtype!r}"
        ) from None


def datasheet_peak_flops(
    device: torch.device | str, dtype: torch.dtype | str | None = torch.float32
) -> float | None:
    """Return a known GPU's datasheet dense matmul peak FLOP/s for `dtype`, else None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    resolved = _dtype_of(dtype)
    words = _name_words(_cuda_device_name(device))
    matches = [
        (len(key), peaks) for key, peaks in PEAK_FLOPS if _contains_words(words, _name_words(key))
    ]
    if not matches:
        return None
    _, peaks = max(matches, key=lambda match: match[0])
    # None: the GPU lacks this dtype in hardware (the probe measures what emulation does)
    return peaks[(torch.bfloat16, torch.float16, torch.float32).index(resolved)]


def _name_words(name: str) -> tuple[str, ...]:
    """Return a GPU name's words, lower-cased: `NVIDIA A100-SXM4-80GB` -> (nvidia, a100, sxm4,
    80gb).
    """
    return tuple(re.findall(r"[a-z0-9]+", name.lower()))


def _contains_words(words: tuple[str, ...], key: tuple[str, ...]) -> bool:
    return any(words[i : i + len(key)] == key for i in range(len(words) - len(key) + 1))


def device_peak_flops(
    device: torch.device | str, dtype: torch.dtype | str | None = torch.float32
) -> float | None:
    """Return the dense matmul peak FLOP/s utilization is measured against: a datasheet value for
    known GPUs, else a measured matmul probe.
    """
    device = torch.device(device)
    resolved = _dtype_of(dtype)
    peak = datasheet_peak_flops(device, resolved)
    if peak is not None:
        return peak
    try:
        return measured_matmul_flops(str(device), resolved)
    # MFU is reporting only: a device that cannot run the probe reports none.
    except Exception as exc:
        logger.warning(
            "peak FLOPs probe on %s (%s) failed: %s; MFU will not be reported",
            device,
            resolved,
            exc,
        )
        return None


def _synchronizer(device: str) -> Any:
    """Return a function that waits for queued kernels on `device` (asynchronous on CUDA and
    MPS).
    """
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    if device.startswith("mps"):
        return torch.mps.synchronize
    return lambda: None


@functools.cache
def measured_matmul_flops(
    device: str, dtype: torch.dtype, size: int = 512, repeats: int = 8
) -> float:
    """Return the best FLOP/s of a few square `size` matmuls on `device` (measured once per
    process).
    """
    # A private generator: probing the peak must never shift the caller's random stream.
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=generator).to(dtype)
    b = torch.randn(size, size, device=device, generator=generator).to(dtype)
    synchronize = _synchronizer(device)
    torch.matmul(a, b)  # warm-up: first calls pay for kernel selection and allocation
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / max(best, 1e-9)


__all__ = [
    "DTYPES",
    "DeviceError",
    "MODES",
    "PEAK_FLOPS",
    "PrecisionError",
    "PrecisionPlan",
    "agree_precision",
    "autocast_context",
    "available_devices",
    "cpu_bf16_supported",
    "datasheet_peak_flops",
    "device_peak_flops",
    "make_grad_scaler",
    "measured_matmul_flops",
    "parameter_count",
    "resolve_device",
    "resolve_precision",
    "supports_fused_adamw",
]
