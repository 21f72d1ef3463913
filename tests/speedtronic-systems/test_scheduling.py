from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from speedtronic_systems.scheduling import (
    StageInfo,
    StageStreamScheduler,
    _expand_stage_modules,
    _iter_tensors,
)


class Branchy(nn.Module):
    """Embedding, a ModuleList of blocks with two independent branches each, a parameter-free
    dropout, a head.
    """

    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, width)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"left": nn.Linear(width, width), "right": nn.Linear(width, width)})
            for _ in range(depth)
        )
        self.drop = nn.Dropout(0.0)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 50))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + torch.tanh(block["left"](x)) * torch.sigmoid(block["right"](x))
        logits = self.head(self.drop(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def loss_and_grads(
    model: nn.Module, tokens: torch.Tensor, scheduler: StageStreamScheduler | None = None
):
    model.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.begin()
    loss = model(tokens)
    loss.backward()
    if scheduler is not None:
        scheduler.finish()
    return loss.detach().clone(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_stage_roots_are_disjoint_and_skip_containers_and_parameterless_modules():
    model = Branchy(depth=2)
    names = [name for name, _ in _expand_stage_modules(model)]
    assert names == [
        "embed",
        "blocks.0.left",
        "blocks.0.right",
        "blocks.1.left",
        "blocks.1.right",
        "head.0",
        "head.1",
    ]
    modules = [module for _, module in _expand_stage_modules(model)]
    for outer in modules:  # no stage contains another, so no hook ever nests
        inner = [m for m in outer.modules() if m is not outer]
        assert not any(m is other for m in inner for other in modules)


def test_iter_tensors_finds_nested_tensors():
    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    found = list(_iter_tensors(((a, [b]), {"x": c, "y": 3}, None)))
    assert len(found) == 3 and all(x is y for x, y in zip(found, (a, b, c), strict=True))


@pytest.mark.parametrize("bad", [0, 9, True, 2.0])
def test_stream_count_is_validated(bad):
    with pytest.raises(ValueError, match=r"ooo_streams must be an integer in 1..8"):
        StageStreamScheduler(Branchy(), "cpu", num_streams=bad)


def test_cpu_is_an_explicit_noop_equal_to_the_sequential_path(caplog):
    torch.manual_seed(0)
    model = Branchy()
    tokens = torch.randint(0, 50, (2, 8))
    expected_loss, expected_grads = loss_and_grads(model, tokens)
    caplog.set_level(logging.INFO)
    scheduler = StageStreamScheduler(model, "cpu", num_streams=4)
    assert scheduler.active is False and scheduler.stages == []
    assert "cpu uses sequential backward" in caplog.text
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    loss, grads = loss_and_grads(model, tokens, scheduler)
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys() and all(
        torch.equal(grads[n], expected_grads[n]) for n in grads
    )
    assert scheduler.as_dict() == {
        "active": False,
        "device": "cpu",
        "num_streams": 4,
        "reason": scheduler.reason,
        "stages": [],
    }
    scheduler.dispose()  # safe and still a no-op


def test_mps_is_a_noop_too():
    scheduler = StageStreamScheduler(
        Branchy(), torch.device("mps"), num_streams=2, logger=logging.getLogger("x")
    )
    assert scheduler.active is False and "mps uses sequential backward" in scheduler.reason


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="stage streams need CUDA")
def test_cuda_streams_give_the_sequential_loss_and_gradients():
    torch.manual_seed(0)
    model = Branchy(width=256, depth=4).cuda()
    tokens = torch.randint(0, 50, (8, 64), device="cuda")
    expected_loss, expected_grads = loss_and_grads(model, tokens)
    scheduler = StageStreamScheduler(model, "cuda", num_streams=3)
    assert scheduler.active and len(scheduler.stages) == 1 + 2 * 4 + 2
    assert {s.stream_index for s in scheduler.stages} == {0, 1, 2}
    assert scheduler.stages[:2] == [StageInfo("embed", 0), StageInfo("blocks.0.left", 1)]
    for _ in range(3):  # repeated steps: allocator reuse across streams must not corrupt anything
        loss, grads = loss_and_grads(model, tokens, scheduler)
        torch.cuda.synchronize()
        torch.testing.assert_close(loss, expected_loss)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], msg=name)
    scheduler.dispose()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    loss, _ = loss_and_grads(model, tokens)
    torch.testing.assert_close(loss, expected_loss)


class FakeStream:
    """Stands in for torch.cuda.Stream: records which streams it was told to wait for."""

    def __init__(self, name: str) -> None:
        self.name, self.waited_for = name, []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited_for.append(other.name)


def fake_cuda(monkeypatch) -> list[FakeStream]:
    """Make torch.cuda's stream calls work on CPU with FakeStreams named A, B, C, ...; return the
    one-item list holding the current stream (the caller's, "default", at first).
    """
    current = [FakeStream("default")]
    made = iter("ABCDEFGH")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream(next(made)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: current.__setitem__(0, stream))
    return current


def test_hooks_enter_and_leave_stage_streams_in_order(monkeypatch):
    """The CUDA bookkeeping, run on CPU with fake streams: which stream is current, who waits for
    whom.
    """
    current = fake_cuda(monkeypatch)
    default = current[0]
    model = Branchy(depth=1)
    scheduler = StageStreamScheduler(model, "cuda", num_streams=3)
    assert [(s.name, s.stream_index) for s in scheduler.stages] == [
        ("embed", 0),
        ("blocks.0.left", 1),
        ("blocks.0.right", 2),
        ("head.0", 0),
        ("head.1", 1),
    ]
    seen = []
    for name, module in _expand_stage_modules(
        model
    ):  # registered after the scheduler's, so they run inside
        module.register_forward_pre_hook(
            lambda m, a, name=name: seen.append((name, current[0].name))
        )
    scheduler.begin()
    model(torch.randint(0, 50, (2, 4)))
    scheduler.finish()
    assert seen == [
        ("embed", "A"),
        ("blocks.0.left", "B"),
        ("blocks.0.right", "C"),
        ("head.0", "A"),
        ("head.1", "B"),
    ]
    assert current[0] is default  # every stage handed the caller's stream back
    a, b, c = (scheduler._streams[i] for i in range(3))
    # begin: all wait for the caller; each stage entry waits for it again (its inputs' producer)
    assert (
        a.waited_for == ["default"] * 3
        and b.waited_for == ["default"] * 3
        and c.waited_for == ["default"] * 2
    )
    # each stage exit makes the caller wait for the stage; finish waits for all three
    assert default.waited_for == ["A", "B", "C", "A", "B"] + ["A", "B", "C"]
    scheduler.dispose()
    assert scheduler.active is False
    assert (
        sum(len(m._forward_pre_hooks) for m in model.modules()) == 5
    )  # only the test's own hooks remain


def test_a_stage_that_raises_hands_the_callers_stream_back_at_finish(monkeypatch):
    """A forward that raises inside a stage skips its exit hook: finish() (the trainer's
    `finally`) still makes the caller's stream current again, so later work is not left on it.
    """
    current = fake_cuda(monkeypatch)
    default = current[0]
    model = Branchy(depth=1)
    scheduler = StageStreamScheduler(model, "cuda", num_streams=2)

    def fail(module, args):
        raise RuntimeError("out of memory")

    model.blocks[0]["left"].register_forward_pre_hook(fail)
    scheduler.begin()
    with pytest.raises(RuntimeError, match="out of memory"):
        model(torch.randint(0, 50, (2, 4)))
    assert current[0].name == "B"  # left inside the failing stage's stream
    scheduler.finish()
    assert current[0] is default and scheduler._outer == []
    assert default.waited_for == ["A", "A", "B"]  # the embed stage's exit, then finish's two
