"""Muon's step under torch.compile(fullgraph=True): one graph, the eager step's results."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from speedtronic_optim import CautiousOptimizer, Muon


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Two 24x16 matrices share a Newton-Schulz batch; the others are alone in their shape.
    return nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 24), nn.Linear(24, 16), nn.Linear(16, 24))


def _backward(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    model.zero_grad()
    model(torch.randn(8, 16, generator=generator)).square().mean().backward()


def _optimizer(model: nn.Module, options: dict) -> torch.optim.Optimizer:
    options = dict(options)
    cautious = options.pop("cautious", False)
    matrices = [param for param in model.parameters() if param.ndim == 2]
    muon = Muon(matrices, **{"lr": 0.02, "weight_decay": 0.1, "ns_dtype": torch.float32, **options})
    return CautiousOptimizer(muon) if cautious else muon


@pytest.fixture
def threads(request):
    """Run torch on request.param CPU threads (what Muon reads to size its batches)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


# One thread: batches sized by the L2 cache. Two cases: each compiles twice (about 2 s).
@pytest.mark.parametrize(
    "threads, options",
    # ns_dtype None: the work dtype follows the CPU's bf16 support (a probe torch cannot trace).
    [(1, {}), (2, {"nesterov": False, "muon_plus": True, "cautious": True, "ns_dtype": None})],
    indirect=["threads"],
)
def test_the_compiled_step_is_one_graph_and_takes_the_eager_steps(threads, options):
    torch.compiler.reset()  # every case compiles Muon.step afresh, not as a recompilation
    eager_model, compiled_model = _model(), _model()
    eager, compiled = _optimizer(eager_model, options), _optimizer(compiled_model, options)
    for step in range(4):
        if step == 2:  # then on from a saved state, as after a resume
            saved = copy.deepcopy(compiled.state_dict())
            compiled = _optimizer(compiled_model, options)
            compiled.load_state_dict(saved)
        if step in (0, 2):
            compiled_step = torch.compile(compiled.step, fullgraph=True, backend="aot_eager")
        _backward(eager_model, step)
        _backward(compiled_model, step)
        eager.step()
        compiled_step()
        for mine, theirs in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)
    start = _model()
    for moved, still in zip(eager_model.parameters(), start.parameters(), strict=True):
        assert moved.ndim != 2 or (moved - still).abs().max() > 1e-3  # the matrices took steps


def test_importing_the_optimizers_leaves_torch_dynamo_unimported():
    # torch.compiler.assume_constant_result imports torch._dynamo: about 2 s more at import, for
    # every user of the package, compiling or not.
    check = "import sys, speedtronic_optim; sys.exit('torch._dynamo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], timeout=120).returncode == 0
