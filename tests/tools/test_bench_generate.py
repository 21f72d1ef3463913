"""tools/bench/bench_generate.py times the KV cache against recomputing and its row reports it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


def test_generate_benchmark_writes_each_case_and_its_row(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "report", raising=False)
    import bench_generate
    import report

    out = tmp_path / "generate.json"
    # A 126-token prompt in the quickstart's 128-token window: 2 new tokens fit, 4 slide it twice.
    args = ["--prompt-tokens", "126", "--new-tokens", "2", "4", "--rounds", "2", "--out", str(out)]
    assert bench_generate.main(args) == 0
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "generate" and payload["machine"]["cpus"] > 0
    fits, slides = payload["results"]["2"], payload["results"]["4"]
    assert (fits["past_window"], slides["past_window"]) == (0, 2)
    for case in (fits, slides):
        assert case["same_tokens"] and len(case["speedup_per_round"]) == 2
        assert case["kv_cache_tokens_per_s"] > 0 and case["recompute_tokens_per_s"] > 0
    what, command, result = report._generate_row(payload)
    assert "126-token prompt" in what and command == "`python tools/bench/bench_generate.py`"
    assert result.startswith(f"2 new tokens: **{fits['speedup']:.2f}x** the tokens/s (rounds ")
    assert f"4 new tokens, 2 past the window: **{slides['speedup']:.2f}x**" in result
