"""shutdown_parallel destroys a DDP group there and then, once the caller dropped the model.

A group that outlives it is destroyed later: by DDP's reducer, which holds the GIL while it joins
gloo's threads (a deadlock when one of them still needs the GIL to free a tensor), or during
interpreter shutdown, where such a thread aborts a finished run (exit -6, "terminate called
without an active exception"). torch._dynamo, imported by DDP after the group exists, would also
hold it; the check runs in a fresh interpreter, where nothing has imported it yet. (FSDP2 groups
stay held by DTensor's caches, which keep the device mesh; that is torch's, not checked.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, sys
import torch
from speedtronic_config import ParallelConfig
from speedtronic_systems.parallel import init_parallel, shutdown_parallel, wrap_model

def threads():
    return len(os.listdir("/proc/self/task"))

imported_first = "torch._dynamo" in sys.modules
before = threads()
section = ParallelConfig(data_parallel="ddp")
context = init_parallel(section, torch.device("cpu"))
model = wrap_model(torch.nn.Linear(2, 2), context, section)  # DDP imports torch._dynamo
model(torch.ones(1, 2)).sum().backward()
during = threads()  # gloo's workers and its transport loop, the store's
del model
shutdown_parallel(context)
extra = [during - before, threads() - before]
print(json.dumps({"imported_first": imported_first, "extra": extra}))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_shutdown_destroys_a_ddp_group_and_stops_its_threads_once_the_model_is_dropped():
    launch = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launch} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["imported_first"]  # else this check would pass without init_parallel's fix
    during, after = result["extra"]
    assert during >= 2 and after == 0, f"threads over the start: {during} in the run, {after} after"
