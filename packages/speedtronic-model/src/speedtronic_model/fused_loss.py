"""Chunked linear cross-entropy: the causal LM loss of a linear head without its full logits.

The plain head keeps (N, V) logits and their gradient alive between forward and backward: at a
50k vocabulary they are most of a small model's activation memory. Here each chunk of rows gets
its logits, its loss and its gradients in forward, and only the gradients w.r.t. the hidden states
(N, d) and the head weight (V, d) are kept for backward (Liger-Kernel's approach).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from speedtronic_systems.loss import IGNORE_INDEX


def chunked_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Return causal_lm_loss(hidden @ weight.T, labels), computed chunk_size rows at a time.

    hidden is (..., d), weight (V, d), labels hidden's leading shape (-100 ignored, a mean over
    the rest; 0 when every label is). The matmuls run in autocast's dtype when it is on, the
    log-sum-exp and the loss in at least float32, as the plain head and causal_lm_loss do.
    """
    flat, targets = hidden.flatten(0, -2), labels.flatten().long()
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(flat, weight, targets, chunk_size)
    return _loss_and_grads(flat, weight, targets, chunk_size, (False, False))[0]


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """Return the dtype nn.Linear would compute hidden @ weight.T in."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _loss_and_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int,
    needs: tuple[bool, bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Return (mean loss, d loss/d hidden, d loss/d weight); a gradient not in `needs` is None.

    hidden is (N, d), targets (N,). d hidden is in the matmul dtype (float32 for float16); d weight
    sums the chunks' contributions in at least float32.
    """
    dtype = _matmul_dtype(hidden, weight)
    exact = torch.promote_types(dtype, torch.float32)  # causal_lm_loss's dtype
    h, w = hidden.to(dtype), weight.to(dtype)
    # float16 lacks float32's range: gradients already divided by the token count, made before
    # backward applies the GradScaler's factor, underflow there; their matmuls run in float32.
    grad_dtype = exact if dtype == torch.float16 else dtype
    gh, gw = (h, w) if grad_dtype == dtype else (hidden.to(grad_dtype), weight.to(grad_dtype))
    # Autocast would cast those matmuls back to float16.
    as_cast = nullcontext() if grad_dtype == dtype else torch.autocast(h.device.type, enabled=False)
    valid = targets != IGNORE_INDEX
    count = valid.sum().clamp_min(1)
    scale = valid / count  # d loss / d row loss: 1/count on kept rows, 0 on ignored ones
    total = torch.zeros((), dtype=exact, device=h.device)
    grad_h = torch.empty(h.shape, dtype=grad_dtype, device=h.device) if needs[0] else None
    grad_w = torch.zeros(w.shape, dtype=exact, device=w.device) if needs[1] else None
    for start in range(0, h.size(0), chunk_size):
        rows = slice(start, start + chunk_size)
        # (C, V) log-probabilities; the logits' gradient is then made in them, in place
        log_probs = (h[rows] @ w.T).to(exact).log_softmax(dim=-1)
        picked = targets[rows].masked_fill(~valid[rows], 0)[:, None]  # ignored: read column 0
        # where, not a product: an ignored row's inf or NaN stays out, as in cross_entropy
        total = total - torch.where(valid[rows], log_probs.gather(1, picked)[:, 0], 0.0).sum()
        if grad_h is None and grad_w is None:
            continue
        # d loss / d logits = (softmax - one_hot(target)) * scale, each row by its own
        grad = log_probs.exp_()
        grad.scatter_add_(1, picked, torch.full_like(picked, -1, dtype=grad.dtype))
        grad = grad.mul_(scale[rows, None]).to(grad_dtype)
        with as_cast:
            if grad_h is not None:
                grad_h[rows] = grad @ gw
            if grad_w is not None and grad_w.dtype == grad_dtype:
                grad_w.addmm_(grad.T, gh[rows])
            elif grad_w is not None:  # summed in float32: a bf16 sum would round every chunk's
                grad_w += grad.T @ gh[rows]
    return total / count, grad_h, grad_w


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Loss forward; backward scales the gradients forward already computed."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk_size: int,
    ) -> torch.Tensor:
        needs = (bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1]))
        loss, grad_h, grad_w = _loss_and_grads(hidden, weight, targets, chunk_size, needs)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        # Not in place: a graph kept by retain_graph=True runs this backward again.
        scaled = [
            None if grad is None else grad.mul(grad_loss).to(dtype)
            for grad, dtype in zip((grad_h, grad_w), ctx.dtypes, strict=True)
        ]
        return scaled[0], scaled[1], None, None


__all__ = ["chunked_linear_cross_entropy"]
