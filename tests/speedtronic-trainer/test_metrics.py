from __future__ import annotations

import torch
from torch import nn
from trainer_testkit import TinyLM

from speedtronic_trainer.metrics import StepMetrics, memory_usage_bytes, model_flops_per_token


def plan():
    from speedtronic_systems.precision import resolve_precision

    return resolve_precision(None, torch.device("cpu"))


def test_flops_per_token_from_the_model_hook():
    model = TinyLM()
    assert model_flops_per_token(model) == 6.0 * sum(p.numel() for p in model.parameters())
    assert model_flops_per_token(nn.Linear(2, 2)) is None

    class Broken(nn.Module):
        def flops_per_token(self):
            raise NotImplementedError

    assert model_flops_per_token(Broken()) is None


def test_record_fields_and_mfu():
    metrics = StepMetrics(TinyLM(), torch.device("cpu"), plan())
    record = metrics.record(
        step=3, loss=1.5, lr=0.01, grad_norm=0.7, samples=4, tokens=24, step_time=0.5
    )
    assert (
        record["tokens_per_s"] == 48.0
        and record["samples_per_s"] == 8.0
        and record["grad_norm"] == 0.7
    )
    if metrics.peak_flops:
        assert record["mfu"] == metrics.flops_per_token * 48.0 / metrics.peak_flops
    plain = StepMetrics(nn.Linear(2, 2), torch.device("cpu"), plan()).record(
        step=1, loss=1.0, lr=0.1, grad_norm=None, samples=1, tokens=1, step_time=0.0
    )
    assert "mfu" not in plain and "grad_norm" not in plain and plain["tokens_per_s"] == 0.0


def test_peak_flops_probe_does_not_move_the_global_rng():
    from speedtronic_systems.precision import measured_matmul_flops

    measured_matmul_flops.cache_clear()  # make the probe really run here
    model = TinyLM()
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    StepMetrics(model, torch.device("cpu"), plan())
    assert torch.equal(torch.rand(2), expected)


def test_memory_usage_is_none_without_an_accelerator():
    if torch.cuda.is_available():
        assert memory_usage_bytes() >= 0
    else:
        assert memory_usage_bytes() is None
