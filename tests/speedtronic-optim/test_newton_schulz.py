from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

from speedtronic_optim import newton_schulz, post_polar_normalize
from speedtronic_optim.newton_schulz import match_polar_scale, orthogonalize


def _svals(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(x.float())


@pytest.mark.parametrize("shape", [(96, 40), (40, 96), (64, 200), (200, 64)])
@pytest.mark.parametrize("method", ["standard", "gram", "auto"])
def test_reference_singular_values_in_band(shape: tuple[int, int], method: str) -> None:
    torch.manual_seed(sum(shape))
    dtype = (
        torch.float32 if method == "gram" else None
    )  # Gram refuses 16-bit work (the default on BF16 CPUs)
    s = _svals(newton_schulz(torch.randn(*shape), method=method, dtype=dtype))
    assert s.min() >= 0.66 and s.max() <= 1.16, (s.min(), s.max())


def test_output_is_near_polar_factor() -> None:
    torch.manual_seed(1)
    g = torch.randn(48, 128)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    out = newton_schulz(g, steps=5)
    cosine = (out * polar).sum() / (out.norm() * polar.norm())
    assert cosine > 0.97


def test_polar_express_converges_closer_than_reference() -> None:
    torch.manual_seed(2)
    g = torch.randn(64, 160)
    ref = _svals(newton_schulz(g, steps=6))
    pe = _svals(newton_schulz(g, steps=6, coefficients="polar_express"))
    assert (pe - 1).abs().max() < 0.01 < (ref - 1).abs().max()


def test_purity_shape_and_dtype_kept() -> None:
    g = torch.randn(30, 50)
    before = g.clone()
    out = newton_schulz(g)
    assert torch.equal(g, before)
    assert out.shape == g.shape and out.dtype == g.dtype
    assert out.data_ptr() != g.data_ptr()
    bf = g.bfloat16()
    bf_before = bf.clone()
    newton_schulz(bf)
    assert torch.equal(bf, bf_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_runs_through_and_reused_buffers_change_no_bits(dtype: torch.dtype) -> None:
    # Unrecorded, the work copy is divided in place and products reuse buffers (out=, which
    # autograd refuses): a recorded call takes fresh outputs and gets the same bits.
    g = torch.randn(40, 24, requires_grad=True)
    out = newton_schulz(g, dtype=dtype, method="standard")
    out.square().sum().backward()
    assert g.grad is not None and torch.isfinite(g.grad).all() and g.grad.abs().max() > 0
    with torch.no_grad():
        assert torch.equal(newton_schulz(g, dtype=dtype, method="standard"), out)


# torch's first forward-AD division imports its decompositions, which call torch.jit.script.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_vmap_and_forward_ad_run_through() -> None:
    # Both refuse out= ("Batching rule not implemented for aten::matmul.out", "forward AD with
    # mm_out") and neither makes the input require grad: the reused product buffers broke them.
    torch.manual_seed(5)
    run = functools.partial(newton_schulz, dtype=torch.float64, method="standard")
    g, tangent = torch.randn(3, 6, 10, dtype=torch.float64), torch.randn(6, 10, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(run)(g), run(g))
    with forward_ad.dual_level():
        value, derivative = forward_ad.unpack_dual(run(forward_ad.make_dual(g[0], tangent)))
    assert torch.equal(value, run(g[0]))
    step = 1e-6
    slope = (run(g[0] + step * tangent) - run(g[0] - step * tangent)) / (2 * step)
    torch.testing.assert_close(derivative, slope, atol=1e-6, rtol=1e-5)


def test_scale_invariance() -> None:
    torch.manual_seed(3)
    g = torch.randn(40, 72)
    a = newton_schulz(g, dtype=torch.float32)
    b = newton_schulz(g * 1000.0, dtype=torch.float32)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("eps", [1e-7, 0.0])  # eps 0 divided 0 by 0: a NaN update
def test_zero_input_gives_zero(method: str, eps: float) -> None:
    out = newton_schulz(torch.zeros(12, 20), method=method, dtype=torch.float32, eps=eps)
    assert torch.isfinite(out).all() and torch.count_nonzero(out) == 0
    out = newton_schulz(torch.zeros(3, 8, 4), method="standard", dtype=torch.bfloat16, eps=eps)
    assert torch.isfinite(out).all() and torch.count_nonzero(out) == 0


def test_eps_zero_changes_no_bit_of_a_nonzero_input() -> None:
    g = torch.randn(3, 16, 24, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16):
        exact = newton_schulz(g, dtype=dtype, eps=0.0)
        assert torch.equal(exact, newton_schulz(g, dtype=dtype, eps=1e-45))


def test_batched_matches_per_matrix() -> None:
    torch.manual_seed(4)
    g = torch.randn(2, 3, 24, 40)
    out = newton_schulz(g, dtype=torch.float32)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(
                out[i, j], newton_schulz(g[i, j], dtype=torch.float32), atol=1e-4, rtol=1e-4
            )


def test_tall_is_transpose_of_wide() -> None:
    g = torch.randn(20, 50)
    torch.testing.assert_close(
        newton_schulz(g.T.contiguous(), dtype=torch.float32),
        newton_schulz(g, dtype=torch.float32).T,
    )


def _low_rank_heavy(shape: tuple[int, ...]) -> torch.Tensor:
    """A gradient-like matrix: noise plus a dominant rank-2 part (what MLP gradients look like)."""
    *batch, m, n = shape
    return torch.randn(*shape) + 20 * torch.randn(*batch, m, 2) @ torch.randn(*batch, 2, n)


@pytest.mark.parametrize("shape", [(4, 128, 512), (4, 512, 128)])
def test_auto_stays_in_band_in_bf16_on_rectangular_gradients(shape: tuple[int, ...]) -> None:
    torch.manual_seed(6)
    s = _svals(orthogonalize(_low_rank_heavy(shape), method="auto", dtype=torch.bfloat16))
    assert s.min() >= 0.6 and s.max() <= 1.25, (
        s.min(),
        s.max(),
    )  # the bf16 Gram form gave 0.1..1e4


def test_gram_refuses_16_bit_work() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        with pytest.raises(ValueError, match="unstable in torch..?float"):
            orthogonalize(torch.randn(8, 32), method="gram", dtype=dtype)
    torch.manual_seed(7)
    s = _svals(orthogonalize(_low_rank_heavy((128, 512)), method="gram", dtype=torch.float32))
    assert s.min() >= 0.6 and s.max() <= 1.25, (s.min(), s.max())


def test_gram_and_standard_agree() -> None:
    torch.manual_seed(5)
    g = torch.randn(32, 128)
    a = orthogonalize(g, method="standard", dtype=torch.float32)
    b = orthogonalize(g, method="gram", dtype=torch.float32)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def test_custom_coefficients_and_errors() -> None:
    g = torch.randn(8, 12)
    torch.testing.assert_close(
        newton_schulz(g, coefficients=[(3.4445, -4.7750, 2.0315)]),
        newton_schulz(g, coefficients="reference"),
    )
    with pytest.raises(ValueError, match="coefficients"):
        newton_schulz(g, coefficients="fastest")
    with pytest.raises(ValueError, match=r"\(a, b, c\)"):
        newton_schulz(g, coefficients=[(1.0, 2.0)])
    # A NaN or infinite coefficient would turn every update (and then the weights) into NaN.
    for bad in ([(float("nan"), -4.775, 2.0315)], (3.4445, float("inf"), 2.0315)):
        with pytest.raises(ValueError, match="finite"):
            newton_schulz(g, coefficients=bad)


def test_one_triple_is_taken_as_torch_optim_muon_takes_it() -> None:
    # torch.optim.Muon(ns_coefficients=(a, b, c)): one triple, reused every step.
    g = torch.randn(8, 12)
    torch.testing.assert_close(
        newton_schulz(g, coefficients=(3.4445, -4.7750, 2.0315)),
        newton_schulz(g, coefficients="reference"),
    )
    with pytest.raises(ValueError, match="method"):
        newton_schulz(g, method="svd")
    with pytest.raises(ValueError, match="shape"):
        newton_schulz(torch.randn(5))
    with pytest.raises(ValueError, match="steps"):
        newton_schulz(g, steps=-1)


@pytest.mark.parametrize("mode", ["row", "col", "row_col", "col_row"])
def test_post_polar_normalize_unit_norms(mode: str) -> None:
    torch.manual_seed(6)
    u = torch.randn(10, 30)
    before = u.clone()
    out = post_polar_normalize(u, mode=mode)
    assert torch.equal(u, before)
    last_axis = -2 if mode in ("col", "row_col") else -1
    norms = out.norm(dim=last_axis)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def test_post_polar_normalize_none_and_errors() -> None:
    u = torch.randn(4, 6)
    torch.testing.assert_close(post_polar_normalize(u, mode="none"), u)
    with pytest.raises(ValueError, match="mode"):
        post_polar_normalize(u, mode="diag")
    with pytest.raises(ValueError, match="shape"):
        post_polar_normalize(torch.randn(3))
    assert torch.count_nonzero(post_polar_normalize(torch.zeros(3, 5))) == 0


def test_row_col_is_larger_than_muon_and_match_scale_fixes_it() -> None:
    torch.manual_seed(7)
    polar = newton_schulz(torch.randn(16, 64), dtype=torch.float32)
    normalized = post_polar_normalize(polar)
    assert normalized.norm() > 1.5 * polar.norm()  # sqrt(64) vs about sqrt(16)
    rescaled = match_polar_scale(normalized, polar)
    assert math.isclose(rescaled.norm().item(), polar.norm().item(), rel_tol=1e-4)
    torch.testing.assert_close(rescaled / rescaled.norm(), normalized / normalized.norm())


@pytest.mark.parametrize("function", [newton_schulz, orthogonalize, post_polar_normalize])
def test_public_functions_refuse_what_they_would_silently_corrupt(function) -> None:
    # Complex input lost its imaginary part and integer input came back as zeros, without an error.
    with pytest.raises(TypeError, match="complex64.*view_as_real"):
        function(torch.randn(4, 6, dtype=torch.cfloat))
    with pytest.raises(TypeError, match="int64"):
        function(torch.ones(4, 6, dtype=torch.int64))
    with pytest.raises(TypeError, match="got a list"):
        function([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match="eps"):
        function(torch.randn(4, 6), eps=-1.0)


def test_newton_schulz_arguments_are_checked() -> None:
    g = torch.randn(4, 6)
    with pytest.raises(TypeError, match="steps: expected an integer >= 0, got True"):
        newton_schulz(g, steps=True)
    with pytest.raises(TypeError, match="steps: expected an integer >= 0, got 2.5"):
        newton_schulz(g, steps=2.5)
    with pytest.raises(ValueError, match="dtype: expected None or one of"):
        newton_schulz(g, dtype=torch.int32)
    with pytest.raises(TypeError, match="dtype: expected None or one of"):
        newton_schulz(g, dtype="float32")
    assert torch.equal(newton_schulz(g, steps=0, dtype=torch.float32), g / (g.norm() + 1e-7))
