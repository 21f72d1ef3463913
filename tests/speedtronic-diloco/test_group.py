"""A DiLoCo node that is a data-parallel group (DDP or FSDP2, 2 ranks under torchrun, gloo on CPU)
next to a 1-process master, through the loopback Hub server; the ranks run group_worker.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from speedtronic_diloco.diloco import DumbDiLoCoCoordinator
from speedtronic_diloco.group import NodeGroup
from speedtronic_diloco.tensors import from_safetensors_bytes, parse_delta_ref

WORKER = Path(__file__).with_name("group_worker.py")
sys.path.insert(0, str(WORKER.parent))
from group_worker import INNER_STEPS, client, net, settings  # noqa: E402


def group_deltas(server) -> dict[str, bytes]:
    files = server.files("org/run")
    return {p: b for p, b in files.items() if (r := parse_delta_ref(p)) and r.node_id == "group"}


def wait_for(probe, what: str, process: subprocess.Popen, log: Path, timeout: float = 240.0):
    """Poll probe until truthy; fail (with the end of the node's log) when the node exits first
    or the time is up.
    """
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the node exited ({process.returncode}) before {what}:\n{tail}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        threading.Event().wait(0.05)
    return value


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize(
    "mode",
    [
        "ddp",
        pytest.param(
            "fsdp",
            marks=pytest.mark.skipif(
                torch.__version__ < (2, 7), reason="fsdp needs torch>=2.7 (refused below it)"
            ),
        ),
    ],
)
def test_a_two_rank_node_follows_rank_0_and_sends_one_delta_in_the_hub_format(
    server, tmp_path, mode
):
    master = DumbDiLoCoCoordinator(
        settings(role="master", node_id="master", max_local_rounds=None),
        net(seed=0),
        hub=client(server.url, "org/run", tmp_path / "cache-master"),
        state_dir=tmp_path / "master",
    )
    master.start()  # publishes outer step 0: the seed-0 weights, not the node's seed-1 ones
    global_0 = master.master.snapshot()[1]
    other = client(server.url, "org/other", tmp_path / "cache-other")
    other.create_repo()
    other.publish_global(net(seed=0, width=8).state_dict(), outer_step=0, consumed=[])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += [str(WORKER), mode, server.url, str(tmp_path)]
    log = (tmp_path / "node.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    node = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # The node waits at its boundary for a newer global: this round is the one it waits for.
        ((path, data),) = wait_for(
            lambda: group_deltas(server), "the node's delta", node, tmp_path / "node.log"
        ).items()
        assert master.master.sync_once() == 1
        assert node.wait(timeout=240) == 0, (tmp_path / "node.log").read_text()[-3000:]
    finally:
        if node.poll() is None:
            node.kill()
        master.stop()
        log.close()
    global_1 = master.master.snapshot()[1]
    zero, one = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    # start(): rank 0 fetched outer step 0; both ranks hold it.
    assert close(zero["after_start"], global_0) and close(one["after_start"], global_0)
    # One delta for the node, named and shaped as a 1-process node's: global - rank 0's state.
    assert parse_delta_ref(path).local_step == INNER_STEPS
    delta = from_safetensors_bytes(data)
    expected = {k: global_0[k] - zero["at_boundary"][k] for k in global_0}
    assert close(delta, expected)
    assert close(zero["at_boundary"], one["at_boundary"])  # DDP/FSDP kept the replicas equal
    # The boundary installed outer step 1 on both ranks, and both reset their optimizer there.
    assert close(zero["after_boundary"], global_1) and close(one["after_boundary"], global_1)
    assert zero["resets"] == one["resets"] == [INNER_STEPS]
    assert zero["last_global_step"] == one["last_global_step"] == 1
    # Only rank 0 talks to the Hub and checkpoints the baseline and pending uploads.
    assert zero["built_hub"] and not one["built_hub"]
    assert zero["state"]["baseline"] is not None and "baseline" not in one["state"]
    # A global model of another shape: rank 0 refuses it, rank 1 learns that instead of hanging.
    assert zero["error"] == "HubError" and one["error"] == "NodeRankError"


def test_a_plain_node_group_runs_collectives_nowhere():
    group = NodeGroup()
    model = torch.nn.Linear(2, 2)
    state = {k: torch.full_like(v, 3.0) for k, v in model.state_dict().items()}
    assert group.is_lead and group.decide(lambda: 7) == 7
    group.load(model, state)
    assert close(group.state_reader(model)(), state)
    assert group.state_shapes(model) == {"weight": (2, 2), "bias": (2,)}
