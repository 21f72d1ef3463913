"""Newton–Schulz orthogonalization (Muon's core) and Muon+'s post-polar normalization."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import forward_ad

from speedtronic_optim.checks import check_dtype, check_integer, check_number

Coefficients = tuple[float, float, float]

# Keller Jordan's quintic coefficients: one triple reused every step.
REFERENCE: tuple[Coefficients, ...] = ((3.4445, -4.7750, 2.0315),)

# Polar Express (arXiv 2505.16932) per-step minimax coefficients, safety factor 1.01 folded in;
# steps beyond the list reuse the last (fixed-point) triple.
POLAR_EXPRESS: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)

COEFFICIENT_SETS: dict[str, tuple[Coefficients, ...]] = {
    "reference": REFERENCE,
    "polar_express": POLAR_EXPRESS,
}
# Polar Express's steep early polynomials (b = -23.6, c = 17.3) amplify bf16 rounding: measured top
# singular values of 1.4-1.6 after 5 bf16 steps and divergence after 8, so it works in float32.
METHODS = ("auto", "standard", "gram")
NORMALIZE_MODES = ("none", "row", "col", "row_col", "col_row")

# Gram iteration costs 2*m*m*n + 17*m^3 flops-units vs 5*(2*m*m*n + m^3) for the standard one
# (5 steps, m <= n); it wins once n/m exceeds 1.5.
GRAM_MIN_ASPECT = 1.5
# The Gram form applies the accumulated polynomial (which stretches small singular values ~3.4x per
# step) to the rounded input once, so 16-bit rounding is amplified instead of corrected: measured
# singular values up to 1e4 (should be 0.7-1.2) on 128x512 bf16 gradients. It runs in these only.
GRAM_DTYPES = (torch.float32, torch.float64)


def compile_time_constant(probe: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `probe` for torch.compile to call while it traces, keeping its result as a constant
    (it cannot trace torch's CPU probes or a file read). This is what
    torch.compiler.assume_constant_result does, without importing torch._dynamo: that import
    took `import speedtronic_optim` from 1.0 s to about 3 s, for users who never compile.
    """
    probe._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return probe


# A CPU's instructions do not change while a program runs.
@compile_time_constant
def _cpu_has_bf16() -> bool:
    """Return True when this CPU has BF16 matmul instructions (AVX512-BF16 or AMX)."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in probes)


def fast_work_dtype(device: torch.device | str) -> torch.dtype:
    """Return bf16 where BF16 matmuls are fast (accelerators, AVX512-BF16/AMX CPUs), else fp32."""
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    # Without BF16 instructions torch emulates BF16 matmuls: measured 30x slower than float32 here.
    return torch.bfloat16 if _cpu_has_bf16() else torch.float32


def work_dtype(
    device: torch.device,
    coefficients: str | Coefficients | Sequence[Coefficients] = "reference",
    method: str = "auto",
    dtype: torch.dtype | None = None,
) -> torch.dtype:
    """Return the dtype Newton–Schulz works in: ``dtype`` when given; else float32 for Polar
    Express and the Gram method, which amplify 16-bit rounding (see POLAR_EXPRESS and
    GRAM_DTYPES), and :func:`fast_work_dtype` otherwise.
    """
    if dtype is not None:
        return dtype
    polar_express = isinstance(coefficients, str) and coefficients == "polar_express"
    return torch.float32 if polar_express or method == "gram" else fast_work_dtype(device)


def coefficient_schedule(
    coefficients: str | Coefficients | Sequence[Coefficients], steps: int
) -> list[Coefficients]:
    """Return the (a, b, c) triple of each of `steps` iterations from a set name, one triple
    (``torch.optim.Muon``'s ``ns_coefficients``) or a sequence of triples (the last one repeats);
    ValueError for an unknown name or anything else.
    """
    if isinstance(coefficients, str):
        if coefficients not in COEFFICIENT_SETS:
            raise ValueError(
                f"unknown Newton-Schulz coefficients {coefficients!r}; "
                f"use one of {sorted(COEFFICIENT_SETS)} or a sequence of (a, b, c) triples"
            )
        table = COEFFICIENT_SETS[coefficients]
    else:
        try:
            triples = list(coefficients)
            if triples and all(isinstance(v, numbers.Real) for v in triples):
                triples = [triples]  # one triple, as torch.optim.Muon takes it
            table = tuple(tuple(float(v) for v in triple) for triple in triples)
        except (TypeError, ValueError):
            table = ()
        # A NaN or infinite coefficient would make every update, then the weights, NaN.
        if not table or any(len(t) != 3 or not all(map(math.isfinite, t)) for t in table):
            raise ValueError(
                "Newton-Schulz coefficients must be one (a, b, c) triple of finite numbers or a "
                "non-empty sequence of them"
            )
    return [table[min(i, len(table) - 1)] for i in range(steps)]


def _check_matrices(owner: str, matrix: object, eps: object) -> None:
    """Raise unless ``matrix`` is a real floating (..., m, n) tensor and ``eps`` a number >= 0."""
    if not isinstance(matrix, torch.Tensor):
        raise TypeError(f"{owner} needs a (..., m, n) tensor; got a {type(matrix).__name__}")
    if not matrix.is_floating_point():
        # A cast would drop a complex input's imaginary part and round an integer one to zeros.
        raise TypeError(
            f"{owner} needs a real floating-point tensor; got {matrix.dtype}: pass a float "
            "tensor (torch.view_as_real of a complex one)"
        )
    if matrix.ndim < 2:
        raise ValueError(f"{owner} needs a (..., m, n) tensor; got shape {tuple(matrix.shape)}")
    check_number(f"{owner} eps", eps, 0.0)


# torch's probe for a torch.func wrapper is private (there since 2.0): were it gone, a vmap call
# would get torch's out= refusal rather than every Muon step an AttributeError.
_functorch_wrapped = getattr(
    getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda tensor: False
)


def _recorded(matrix: torch.Tensor) -> bool:
    """Return True when autograd, forward AD (a dual tensor) or a torch.func transform (vmap,
    grad, jvp) records what is done with `matrix`: they refuse out=, so only others reuse memory.
    torch.compile counts too: it plans its own buffers (and cannot trace the functorch probe).
    """
    if torch.compiler.is_compiling() or (matrix.requires_grad and torch.is_grad_enabled()):
        return True
    # A torch.func transform wraps its inputs; vmap's need not require grad.
    if _functorch_wrapped(matrix):
        return True
    return forward_ad.unpack_dual(matrix).tangent is not None


def _addmm(
    bias: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    beta: float,
    alpha: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    # Fused multiply-add keeps one kernel and one output allocation per product.
    if x.ndim == 2:
        return torch.addmm(bias, x, y, beta=beta, alpha=alpha, out=out)
    return torch.baddbmm(bias, x, y, beta=beta, alpha=alpha, out=out)


def _standard(x: torch.Tensor, schedule: list[Coefficients], reuse: bool) -> torch.Tensor:
    # With `reuse`, each product goes into the buffer of its last step (the same kernels, so the
    # same bits): a fresh megabyte-sized output per product came from the OS page by page, about
    # 4% of a 768x768 bf16 orthogonalization on one CPU thread.
    gram = poly = spare = None
    for index, (a, b, c) in enumerate(schedule):
        gram = torch.matmul(x, x.mT, out=gram if reuse else None)
        poly = _addmm(gram, gram, gram, beta=b, alpha=c, out=poly if reuse else None)
        # The x before last becomes the next x's buffer; the input (index 0) is not ours to reuse.
        x, spare = _addmm(x, poly, x, beta=a, out=spare if reuse else None), (x if index else None)
    return x


def _gram(x: torch.Tensor, schedule: list[Coefficients]) -> torch.Tensor:
    # X_{k+1} = p_k(A_k) X_k with A_k = X_k X_k^T, so A_{k+1} = A_k p_k(A_k)^2: iterate on the small
    # m x m Gram matrix and touch the wide m x n matrix only twice.
    gram = x @ x.mT
    product: torch.Tensor | None = None
    for index, (a, b, c) in enumerate(schedule):
        poly = _addmm(gram, gram, gram, beta=b, alpha=c)
        poly.diagonal(dim1=-2, dim2=-1).add_(a)
        product = poly if product is None else poly @ product
        if index < len(schedule) - 1:
            gram = (gram @ poly) @ poly
    return x if product is None else product @ x


def orthogonalize(
    matrix: torch.Tensor,
    steps: int = 5,
    eps: float = 1e-7,
    *,
    coefficients: str | Coefficients | Sequence[Coefficients] = "reference",
    method: str = "auto",
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Return the Newton–Schulz polar-factor estimate in the work ``dtype`` (input untouched)."""
    _check_matrices("newton_schulz", matrix, eps)
    check_integer("newton_schulz steps", steps, 0)
    check_dtype("newton_schulz dtype", dtype)
    dtype = work_dtype(matrix.device, coefficients, method, dtype)
    if method not in METHODS:
        raise ValueError(f"unknown Newton-Schulz method {method!r}; use one of {METHODS}")
    if method == "gram" and dtype not in GRAM_DTYPES:
        raise ValueError(
            f"Newton-Schulz method 'gram' is numerically unstable in {dtype} (it amplifies "
            "rounding); "
            "use dtype=torch.float32, or method 'standard' or 'auto' for 16-bit work"
        )
    schedule = coefficient_schedule(coefficients, steps)
    x = matrix.to(dtype)  # a copy whenever the dtype changes
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    batch_shape = x.shape[:-2]
    if x.ndim >= 3:
        x = x.flatten(0, -3)  # not reshape(-1, ...): that is ambiguous for empty matrices
        if x.size(0) == 1:
            # One matrix runs as 2-D mm/addmm, as torch.optim.Muon's: a CPU bf16 (b)addbmm of
            # batch 1 rounds some tall shapes (2048x768, 1024x512) differently, and is slower.
            x = x[0]
    # Frobenius norm >= spectral norm, so this puts every singular value in [0, 1]. eps 0 (which
    # torch.optim.Muon accepts too) must not make a zero matrix 0 / 0, a NaN update: the smallest
    # normal number instead adds nothing to a nonzero norm.
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    eps = eps or torch.finfo(dtype).tiny
    reuse = not _recorded(matrix)
    # In place on our own copy (one pass, no second copy), never on the caller's tensor.
    x = x.div_(norm + eps) if reuse and dtype != matrix.dtype else x / (norm + eps)
    m, n = x.size(-2), x.size(-1)
    use_gram = method == "gram" or (
        method == "auto" and dtype in GRAM_DTYPES and n >= GRAM_MIN_ASPECT * m
    )
    x = _gram(x, schedule) if use_gram else _standard(x, schedule, reuse)
    if matrix.ndim > 2:
        x = x.reshape(*batch_shape, m, n)
    return x.mT if tall else x


def newton_schulz(
    matrix: torch.Tensor,
    steps: int = 5,
    eps: float = 1e-7,
    *,
    coefficients: str | Coefficients | Sequence[Coefficients] = "reference",
    method: str = "auto",
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Return an approximate orthogonal polar factor of ``matrix`` (same shape/dtype; pure).

    ``coefficients`` is ``"reference"`` (3.4445, -4.7750, 2.0315), ``"polar_express"``, one
    (a, b, c) triple (as ``torch.optim.Muon`` takes) or a sequence of them; ``method`` is
    ``"standard"``, ``"gram"`` (iterate on X X^T, cheaper for rectangular matrices;
    float32/float64 only) or ``"auto"`` (Gram where it is cheaper and the work dtype allows it);
    ``dtype`` is the work precision: by default :func:`fast_work_dtype` (bf16 as
    ``torch.optim.Muon`` on GPUs and BF16-capable CPUs, float32 elsewhere) for the reference
    coefficients and float32 for Polar Express, whose early steps amplify bf16 rounding, and for
    ``method="gram"``.
    """
    result = orthogonalize(
        matrix, steps, eps, coefficients=coefficients, method=method, dtype=dtype
    )
    return result.to(
        matrix.dtype
    )  # orthogonalize never returns its input, so this is never an alias


def post_polar_normalize(
    update: torch.Tensor, *, mode: str = "row_col", eps: float = 1e-8
) -> torch.Tensor:
    """Return Muon+'s normalized update: rows and/or columns scaled to unit L2 norm (pure).

    ``mode`` is one of none, row, col, row_col (rows then columns) and col_row. A ``row_col`` result
    has unit columns, so its Frobenius norm is sqrt(cols), larger than an orthogonal factor's
    sqrt(min(rows, cols)) for a wide matrix; :class:`Muon` rescales it to the norm of the polar
    estimate it came from (:func:`match_polar_scale`) so Muon and Muon+ share one learning rate.
    """
    if mode not in NORMALIZE_MODES:
        raise ValueError(
            f"unknown post_polar_normalize mode {mode!r}; use one of {NORMALIZE_MODES}"
        )
    _check_matrices("post_polar_normalize", update, eps)
    result = update.float()
    for axis in {"none": (), "row": (-1,), "col": (-2,), "row_col": (-1, -2), "col_row": (-2, -1)}[
        mode
    ]:
        result = result / (torch.linalg.vector_norm(result, dim=axis, keepdim=True) + eps)
    return result.to(update.dtype)


def match_polar_scale(
    update: torch.Tensor, reference: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """Return ``update`` rescaled to the Frobenius norm of ``reference`` (per matrix)."""
    target = torch.linalg.vector_norm(reference.float(), dim=(-2, -1), keepdim=True)
    norm = torch.linalg.vector_norm(update.float(), dim=(-2, -1), keepdim=True)
    return (update.float() * (target / (norm + eps))).to(update.dtype)
