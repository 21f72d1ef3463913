"""GQA in SDPA: enable_gqa=True against repeat_interleave of the KV heads, side by side, on CPU.

Usage: python packages/speedtronic-model/bench/gqa_attention.py [OUT.json]
Prints a table (ratio < 1 means enable_gqa is faster) and writes the rows as JSON.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(8, 8, 2, 128, 32), (4, 8, 2, 512, 64), (8, 12, 4, 256, 64)]  # B, H, KV, T, D


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, gqa: bool
) -> torch.Tensor:
    if not gqa:
        repeat = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
    )


def time_ms(
    shape: tuple[int, ...], masked: bool, backward: bool, gqa: bool, repeats: int = 10
) -> float:
    B, H, KV, T, D = shape
    q = torch.randn(B, H, T, D, requires_grad=backward)
    k, v = (torch.randn(B, KV, T, D, requires_grad=backward) for _ in range(2))
    mask = torch.ones(T, T, dtype=torch.bool).tril() if masked else None

    def step() -> None:
        y = attend(q, k, v, mask, gqa)
        if backward:
            y.sum().backward()

    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str]) -> None:
    torch.manual_seed(0)
    rows = []
    print(
        f"{'B,H,KV,T,D':<20}{'mask':<6}{'pass':<9}"
        f"{'enable_gqa ms':>14}{'repeat ms':>11}{'ratio':>7}"
    )
    for shape in SHAPES:
        for masked in (False, True):
            for backward in (False, True):
                gqa, rep = (
                    time_ms(shape, masked, backward, True),
                    time_ms(shape, masked, backward, False),
                )
                rows.append(
                    dict(
                        shape=shape,
                        masked=masked,
                        backward=backward,
                        enable_gqa_ms=gqa,
                        repeat_ms=rep,
                    )
                )
                label = "fwd+bwd" if backward else "fwd"
                print(
                    f"{str(shape):<20}{str(masked):<6}{label:<9}"
                    f"{gqa:>14.2f}{rep:>11.2f}{gqa / rep:>7.2f}"
                )
    out = argv[1] if len(argv) > 1 else "gqa_attention.json"
    with open(out, "w") as f:
        json.dump(
            {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main(sys.argv)
