"""tools/bench/bench_diloco.py's multi-rank part: a node that fails stops the bench at once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "bench_diloco", raising=False)
    import bench_diloco as module

    return module


def python(code: str) -> subprocess.Popen:
    # stdin stays open: a process that reads it runs until it is stopped
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_a_failing_node_stops_the_waiting_one_and_is_named(bench) -> None:
    waiting = python("import sys; sys.stdin.read()")
    failing = python("raise SystemExit(3)")
    try:
        with pytest.raises(RuntimeError, match="the master node failed with exit code 3"):
            bench.wait_all({"worker node": waiting, "master node": failing})
        assert waiting.returncode == -signal.SIGTERM
    finally:
        waiting.kill()
        waiting.wait()


def test_nodes_that_succeed_are_all_waited_for(bench) -> None:
    first, second = python("pass"), python("import sys; sys.stdin.read()")
    second.stdin.close()  # it ends only after this
    bench.wait_all({"first": first, "second": second})
    assert first.returncode == second.returncode == 0


def test_an_interrupted_bench_leaves_no_node_running(bench, monkeypatch) -> None:
    class Interrupted(bench.queue.Queue):
        def get(self, *args, **kwargs):
            raise KeyboardInterrupt  # Ctrl-C while the bench waits for its nodes

    monkeypatch.setattr(bench.queue, "Queue", Interrupted)
    waiting = python("import sys; sys.stdin.read()")
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.wait_all({"worker node": waiting})
        assert waiting.returncode == -signal.SIGTERM
    finally:
        waiting.kill()
        waiting.wait()
