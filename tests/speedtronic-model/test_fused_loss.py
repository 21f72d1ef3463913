"""The chunked linear cross-entropy (model.loss_chunk_size) against the plain head and loss."""

from __future__ import annotations

import pytest
import torch

from speedtronic_config import ConfigError, ModelConfig
from speedtronic_model.fused_loss import chunked_linear_cross_entropy
from speedtronic_model.model import ReferenceTransformer
from speedtronic_model.registry import build_model
from speedtronic_systems.loss import causal_lm_loss

SMALL = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 16 tokens; labels with ignored positions (a prompt, a padded end)."""
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    labels = ids.roll(-1, dims=1)
    labels[0, :5] = -100
    labels[2, -1] = -100
    return ids, labels


def loss_and_grads(
    chunk: int | None, *, bf16: bool = False, compile_: bool = False, **overrides
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = ReferenceTransformer(**{**SMALL, **overrides}, loss_chunk_size=chunk)
    ids, labels = batch()
    call = torch.compile(model) if compile_ else model
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = call(ids, labels)
    out["loss"].backward()
    return out, {name: p.grad for name, p in model.named_parameters()}


def assert_grads_close(got, expected, **tolerance) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **tolerance, msg=name)


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 48, 1000])  # 5 does not divide the 48 rows
def test_loss_and_every_gradient_match_the_plain_head_in_float32(chunk, tie_weights):
    plain, plain_grads = loss_and_grads(None, tie_weights=tie_weights)
    fused, fused_grads = loss_and_grads(chunk, tie_weights=tie_weights)
    assert "logits" in plain and "logits" not in fused  # the (B, T, V) logits are never whole
    torch.testing.assert_close(fused["loss"], plain["loss"], rtol=1e-6, atol=1e-6)
    # The head's weight gets the loss's gradient (tied: plus the embedding lookup's, one tensor).
    assert_grads_close(fused_grads, plain_grads, rtol=1e-5, atol=1e-7)


def test_under_bf16_autocast_it_is_close_to_the_plain_head():
    plain, plain_grads = loss_and_grads(None, bf16=True)
    fused, fused_grads = loss_and_grads(7, bf16=True)
    assert fused["loss"].dtype == plain["loss"].dtype == torch.float32
    torch.testing.assert_close(fused["loss"], plain["loss"], rtol=1e-4, atol=1e-4)
    for name, grad in plain_grads.items():  # bf16 matmuls: a relative bound on the largest entry
        error = (fused_grads[name] - grad).abs().max() / grad.abs().max()
        assert error < 2e-2, (name, float(error))


def test_under_fp16_autocast_a_grad_scaler_loss_keeps_its_small_gradients():
    # Many tokens make each row's gradient 1/count small: made in float16 before backward sees
    # the GradScaler's factor, it underflowed (errors of 6-8% against float32).
    torch.manual_seed(0)
    hidden, weight = torch.randn(4096, 64), torch.randn(8192, 64) * 0.02
    labels = torch.randint(0, 8192, (4096,))

    def grads(fp16: bool) -> tuple[torch.Tensor, ...]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = chunked_linear_cross_entropy(h, w, labels, 1024)
        (loss * 65536.0).backward()  # the scaler's initial scale
        return h.grad / 65536.0, w.grad / 65536.0

    for got, exact in zip(grads(True), grads(False), strict=True):
        assert ((got - exact).norm() / exact.norm()) < 1e-3


def test_the_function_matches_causal_lm_loss_with_ignored_rows_and_int32_labels():
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 5, 8, generator=generator, requires_grad=True)
    weight = torch.randn(11, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 11, (4, 5), generator=generator, dtype=torch.int32)
    labels[1] = -100
    labels[3, 2:] = -100
    plain = causal_lm_loss(hidden @ weight.T, labels)
    expected = torch.autograd.grad(plain, (hidden, weight))
    fused = chunked_linear_cross_entropy(hidden, weight, labels, 3)
    got = torch.autograd.grad(fused, (hidden, weight))
    torch.testing.assert_close(fused, plain)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # evaluation: the same loss, no gradients made
        torch.testing.assert_close(chunked_linear_cross_entropy(hidden, weight, labels, 3), plain)
        hidden[1, 0] = float("nan")  # an ignored row's NaN stays out, as in cross_entropy
        torch.testing.assert_close(chunked_linear_cross_entropy(hidden, weight, labels, 3), plain)


def test_every_label_ignored_gives_a_zero_loss_and_zero_gradients():
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    labels = torch.full((6,), -100)
    loss = chunked_linear_cross_entropy(hidden, weight, labels, 4)
    assert loss.item() == 0.0 == causal_lm_loss(hidden @ weight.T, labels).item()
    loss.backward()
    assert not hidden.grad.any() and not weight.grad.any()


def test_a_scaled_loss_scales_the_gradients():  # gradient accumulation divides the loss
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8)
    labels = torch.randint(0, 11, (6,))
    (grad,) = torch.autograd.grad(chunked_linear_cross_entropy(hidden, weight, labels, 4), hidden)
    (scaled,) = torch.autograd.grad(
        chunked_linear_cross_entropy(hidden, weight, labels, 4) / 4, hidden
    )
    torch.testing.assert_close(scaled, grad / 4)


def test_a_retained_graph_gives_the_same_gradients_at_each_backward():
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    labels = torch.randint(0, 11, (6,))
    loss = chunked_linear_cross_entropy(hidden, weight, labels, 4) * 3
    first = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(loss, (hidden, weight))
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)


def test_without_labels_the_model_returns_logits_as_before():
    torch.manual_seed(0)
    plain = ReferenceTransformer(**SMALL)
    torch.manual_seed(0)
    fused = ReferenceTransformer(**SMALL, loss_chunk_size=4)
    ids, _ = batch()
    assert torch.equal(fused(ids)["logits"], plain(ids)["logits"])
    greedy = dict(max_new_tokens=3, temperature=0.0)
    assert torch.equal(fused.generate(ids[:, :4], **greedy), plain.generate(ids[:, :4], **greedy))


def test_the_compiled_model_matches_eager():
    eager, eager_grads = loss_and_grads(5, n_layer=1)
    compiled, compiled_grads = loss_and_grads(5, n_layer=1, compile_=True)
    torch.testing.assert_close(compiled["loss"], eager["loss"], rtol=1e-5, atol=1e-6)
    assert_grads_close(compiled_grads, eager_grads, rtol=1e-4, atol=1e-6)


def test_the_function_compiles_in_one_graph():
    hidden = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    labels = torch.randint(0, 11, (10,))
    labels[:3] = -100
    compiled = torch.compile(chunked_linear_cross_entropy, fullgraph=True)
    loss = compiled(hidden, weight, labels, 4)
    got = torch.autograd.grad(loss, (hidden, weight))
    expected_loss = causal_lm_loss(hidden @ weight.T, labels)
    expected = torch.autograd.grad(expected_loss, (hidden, weight))
    torch.testing.assert_close(loss, expected_loss)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the GPU profile's setting: the same dtypes
        loss, eager = (
            compiled(hidden, weight, labels, 4),
            chunked_linear_cross_entropy(hidden, weight, labels, 4),
        )
    torch.testing.assert_close(loss, eager)
    got, expected = (torch.autograd.grad(value, (hidden, weight)) for value in (loss, eager))
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "must be positive"),
        (-4, "must be positive"),
        (True, "expected an integer, not a boolean"),
        (2.5, "expected an integer"),
        ("many", "expected an integer"),
        (2**49, "must be at most"),
    ],
)
def test_a_bad_chunk_size_is_a_one_line_config_error(value, problem):
    for build in (ModelConfig, ReferenceTransformer):
        with pytest.raises(ConfigError) as caught:
            build(loss_chunk_size=value)
        assert str(caught.value).startswith(f"model.loss_chunk_size: {problem}")
        assert "\n" not in str(caught.value)


def test_the_setting_reaches_the_model_from_a_config_and_defaults_to_off():
    assert ModelConfig().loss_chunk_size is None
    assert build_model({"vocab_size": 32, "loss_chunk_size": 256}).config.loss_chunk_size == 256
    assert build_model({"vocab_size": 32}).config.loss_chunk_size is None
    # A run may resume with it changed: it changes no weight.
    assert "loss_chunk_size" in ModelConfig.RESUMABLE
