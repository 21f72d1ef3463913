"""Generation speed of the quickstart-size reference model: KV cache against recomputing the window.

generate(use_cache=False) is the path every token took before the cache: the whole window
recomputed per token. Both run alternately in one process (machines are noisy; the ratio of
interleaved medians is the number to trust), from the same seed, and must give the same tokens.
With the quickstart's max_seq_len 128, 256 new tokens from an 8-token prompt slide the window for
the last 136: those recompute it with the cache too (see ReferenceTransformer.generate).

Usage: python tools/bench/bench_generate.py [--new-tokens N ...] [--prompt-tokens 8] [--rounds R]
       [--threads N] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchlib import RESULTS, interleaved, machine_info, median_ratio, quickstart_values, write_json
from speedtronic_model import build_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[120, 256])
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=RESULTS / "generate.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from speedtronic_config import ModelConfig

    model_values = quickstart_values()["model"]
    torch.manual_seed(0)
    model = build_model(ModelConfig(**model_values)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens))
    payload: dict[str, Any] = {
        "benchmark": "generate",
        "machine": machine_info(),
        "model": {key: model_values[key] for key in ("n_layer", "d_model", "max_seq_len")},
        "parameters": model.num_parameters(),
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "results": {},
    }
    print(
        f"model: {model_values['n_layer']} layers, d_model {model_values['d_model']}, "
        f"max_seq_len {model_values['max_seq_len']}, {model.num_parameters():,} parameters; "
        f"prompt {args.prompt_tokens} tokens, batch 1, temperature 0.8, {args.rounds} rounds, "
        f"{torch.get_num_threads()} threads"
    )
    for new in args.new_tokens:
        outputs: dict[bool, torch.Tensor] = {}

        def timed(use_cache: bool, new: int = new, outputs: dict = outputs) -> float:
            generator = torch.Generator().manual_seed(0)
            start = time.perf_counter()
            outputs[use_cache] = model.generate(
                prompt, new, temperature=0.8, generator=generator, use_cache=use_cache
            )
            return new / (time.perf_counter() - start)

        rates = interleaved(
            {"recompute": lambda: timed(False), "kv_cache": lambda: timed(True)}, args.rounds
        )
        if not torch.equal(outputs[True], outputs[False]):
            raise SystemExit(f"{new} new tokens: the cached and recomputed generations differ")
        result = {
            "past_window": max(0, args.prompt_tokens + new - model_values["max_seq_len"]),
            "recompute_tokens_per_s": statistics.median(rates["recompute"]),
            "kv_cache_tokens_per_s": statistics.median(rates["kv_cache"]),
            "speedup": median_ratio(rates["kv_cache"], rates["recompute"]),
            "speedup_per_round": [
                a / b for a, b in zip(rates["kv_cache"], rates["recompute"], strict=True)
            ],
            "same_tokens": True,
        }
        payload["results"][str(new)] = result
        print(
            f"{new} new tokens: recompute {result['recompute_tokens_per_s']:,.0f} tokens/s, "
            f"kv_cache {result['kv_cache_tokens_per_s']:,.0f} tokens/s, "
            f"speedup x{result['speedup']:.2f} (median of paired rounds); same tokens"
        )
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
