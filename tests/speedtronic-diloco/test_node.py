"""The testing node entrypoint: a master and a worker as separate OS processes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from speedtronic_diloco.tensors import parse_delta_ref


def _spawn(server, tmp_path, role, node_id, seed, *extra):
    return subprocess.Popen([sys.executable, "-m", "speedtronic_diloco.testing.node", "--role", role,
                             "--node-id", node_id, "--endpoint", server.url, "--seed", str(seed), "--steps", "40",
                             "--inner-steps", "4", "--poll-interval", "0.1", "--step-delay", "0.05",
                             "--state-dir", str(tmp_path / "state"), "--summary", str(tmp_path / f"{node_id}.json"),
                             *extra])


def test_master_and_worker_processes(server, tmp_path):
    # Lost commit responses (the worst fault for exactly-once); the other faults are covered in-process.
    server.faults.configure(rate=0.1, kinds=["lost"], seed=7)
    master = _spawn(server, tmp_path, "master", "master", 0, "--until-outer-step", "2", "--linger", "5")
    workers = [_spawn(server, tmp_path, "worker", "w0", 1)]
    for proc in [*workers, master]:
        assert proc.wait(120) == 0
    summaries = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    boss = summaries["master"]
    assert boss["outer_step"] >= 2
    assert boss["global_loss"] < boss["initial_loss"]
    assert summaries["w0"]["counters"]["globals_installed"] >= 2 and summaries["w0"]["counters"]["uploads"] >= 2
    log = json.loads(urllib.request.urlopen(server.url + "/_test/log").read())
    uploaded = {p for c in log for p in c["added"] if parse_delta_ref(p)}
    remaining = {p for p in server.files("org/diloco-trial") if parse_delta_ref(p)}
    assert uploaded == set(boss["processed"]) | remaining  # no delta lost
    assert boss["master_counters"]["applied"] + boss["master_counters"]["skipped_stale"] \
        + boss["master_counters"]["skipped_invalid"] == len(boss["processed"])  # none applied twice
