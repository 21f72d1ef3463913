from __future__ import annotations

import io
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from trainer_testkit import VOCAB, RecordingHook, TinyLM, TokenDataset, make_config, make_loader

import speedtronic_trainer.trainer as trainer_module
from speedtronic_systems import compile_choice, cpu_allocator
from speedtronic_systems import precision as precision_module
from speedtronic_systems.parallel import ParallelContext
from speedtronic_trainer import (
    CheckpointManager,
    MetricLogger,
    NonFiniteLossError,
    Trainer,
)


def make_trainer(
    model=None,
    loader=None,
    *,
    accumulation=1,
    lr=0.1,
    optimizer=None,
    logger=None,
    sections=None,
    **kwargs,
):
    """A trainer on TinyLM; `sections` are config sections (accumulation sets the data batch)."""
    model = model or TinyLM()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr)
    sections = dict(sections or {})
    batch = {"micro_batch_size": 1, "target_batch_size": accumulation}
    sections["data"] = {**batch, **sections.get("data", {})}
    logger = logger or MetricLogger(stream=io.StringIO(), hooks=[RecordingHook()])
    return Trainer(
        model,
        optimizer,
        loader if loader is not None else make_loader(),
        device="cpu",
        config=make_config(**sections),
        logger=logger,
        **kwargs,
    )


def full_batch_loss(model, samples):
    inputs = torch.stack([s["input_ids"] for s in samples])
    labels = torch.stack([s["labels"] for s in samples])
    logits = model(inputs)["logits"]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def hook_of(trainer) -> RecordingHook:
    return trainer.logger.hooks[0]


# ---------------------------------------------------------------------------- accumulation


@pytest.mark.parametrize("ignore_every", [0, 4])
def test_accumulated_update_equals_full_batch_update(ignore_every):
    torch.manual_seed(0)
    dataset = TokenDataset(n=8, ignore_every=ignore_every)
    reference = TinyLM()
    model = TinyLM()
    model.load_state_dict(reference.state_dict())
    trainer = make_trainer(model, make_loader(dataset, batch_size=2), accumulation=4)
    result = trainer.fit(1)

    expected_loss = full_batch_loss(reference, [dataset[i] for i in range(8)])
    expected_loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    for trained, manual in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(trained, manual, rtol=1e-5, atol=1e-6)
    # the reported loss is the mean over the whole step's valid tokens
    assert result.final_loss == pytest.approx(expected_loss.item(), rel=1e-5)


def test_token_weighting_differs_from_mean_of_microbatch_means():
    """With uneven ignored labels, averaging per-microbatch means is the Hugging Face 2024 bug; we
    do not.
    """
    dataset = TokenDataset(n=4, ignore_every=6)
    torch.manual_seed(0)
    model = TinyLM()
    naive = sum(full_batch_loss(model, [dataset[i], dataset[i + 1]]) for i in (0, 2)) / 2
    correct = full_batch_loss(model, [dataset[i] for i in range(4)])
    assert not math.isclose(naive.item(), correct.item(), rel_tol=1e-4)  # the data really is uneven
    result = make_trainer(model, make_loader(dataset, batch_size=2), accumulation=2, lr=0.0).fit(1)
    assert result.final_loss == pytest.approx(correct.item(), rel=1e-6)


def test_microbatch_with_every_label_ignored_contributes_nothing():
    class AllIgnoredFirst(TokenDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            if i < 2:
                item["labels"][:] = -100
            return item

    dataset = AllIgnoredFirst(n=4)
    model = TinyLM()
    expected = full_batch_loss(model, [dataset[2], dataset[3]]).item()
    result = make_trainer(model, make_loader(dataset, batch_size=2), accumulation=2, lr=0.0).fit(1)
    assert result.final_loss == pytest.approx(expected, rel=1e-6)
    assert result.samples == 4  # the ignored microbatch was still consumed and counted


# ------------------------------------------------------------------------------ step targets


def test_step_targets_are_absolute():
    trainer = make_trainer()
    first = trainer.fit(3)
    assert (first.steps, first.steps_run) == (3, 3)
    assert first.final_loss is not None
    again = trainer.fit(2)  # already past the target
    assert again.final_loss is None and again.steps == 3 and again.steps_run == 0
    more = trainer.fit(5)
    assert (more.steps, more.steps_run) == (5, 2)
    assert more.samples == 10 and more.tokens == 10 * 6


def test_a_reached_target_returns_the_fields_of_a_run():
    # The README's script, run again after it finished: result.metrics["tokens_per_s"] was a
    # KeyError, and skipped_steps 0 where a run reports the trainer's absolute count.
    trainer = make_trainer(NaNAtCall({2}), sections={"run": {"nonfinite_loss": "skip"}})
    trainer.fit(3)
    again = trainer.fit(3)
    assert again.metrics["tokens_per_s"] == 0.0 and again.metrics["samples_per_s"] == 0.0
    assert again.skipped_steps == 1 and again.steps_run == 0


def test_start_step_counts_toward_the_target():
    result = make_trainer(start_step=900).fit(903)
    assert result.steps_run == 3 and result.steps == 903


def test_missing_or_bad_target_is_a_clear_error():
    model = TinyLM()
    bare = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), make_loader(), device="cpu")
    with pytest.raises(ValueError, match="no step target"):
        bare.fit()  # without a config there is no implicit target
    with pytest.raises(ValueError, match="positive"):
        make_trainer().fit(0)


def test_target_from_config_run_max_steps():
    config = make_config(run={"max_steps": 2})
    model = TinyLM()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        config=config,
        logger=MetricLogger(stream=io.StringIO()),
    )
    assert trainer.fit().steps == 2


def test_loader_cycles_past_one_epoch():
    result = make_trainer(loader=make_loader(TokenDataset(n=4), batch_size=2)).fit(7)
    assert result.steps == 7 and result.samples == 14


def test_exhausted_one_shot_iterator_is_reported():
    batches = iter([next(iter(make_loader()))])
    with pytest.raises(ValueError, match="exhausted"):
        make_trainer(loader=batches).fit(2)


# ----------------------------------------------------------------------------- batch forms


class PairModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y):
        return F.mse_loss(self.linear(x).squeeze(-1), y)


def test_tuple_batches_call_model_with_inputs_and_labels():
    data = TensorDataset(torch.randn(8, 3), torch.randn(8))
    model = PairModel()
    before = model.linear.weight.detach().clone()
    result = make_trainer(model, DataLoader(data, batch_size=4)).fit(2)
    assert result.samples == 8 and math.isfinite(result.final_loss)
    assert not torch.equal(before, model.linear.weight)


def test_int32_token_windows_train_and_evaluate_as_int64_ones():
    # Token ids often arrive as int32 (numpy memmaps, tokenizers' arrays); cross_entropy, which
    # scores the logits, takes int64 targets only.
    tokens = TokenDataset(n=8, ignore_every=3)
    windows = [tokens[i] for i in range(len(tokens))]
    inputs = torch.stack([w["input_ids"] for w in windows])
    labels = torch.stack([w["labels"] for w in windows])
    results = []
    for dtype in (torch.int64, torch.int32):
        pairs = TensorDataset(inputs.to(dtype), labels.to(dtype))
        torch.manual_seed(0)
        trainer = make_trainer(loader=DataLoader(pairs, batch_size=4), eval_dataloader=[pairs[:]])
        results.append((trainer.fit(2).final_loss, trainer.evaluate()))
    assert results[1] == results[0] and math.isfinite(results[0][1])


def test_unsupported_batch_form_is_a_clear_error():
    with pytest.raises(TypeError, match="unsupported batch"):
        make_trainer(loader=[torch.zeros(2, 3)]).fit(1)


# ----------------------------------------------------------------------------- coordinator


class FakeCoordinator:
    def __init__(self, reset_at: set[int] = frozenset()) -> None:
        self.calls: list[tuple] = []
        self.reset_at = reset_at
        self.optimizer = None

    def start(self):
        self.calls.append(("start",))
        self.reset_after_start = self.reset_at_start

    reset_at_start = False

    def after_optimizer_step(self, model, step):
        self.calls.append(("step", step))
        return step in self.reset_at

    def stop(self):
        self.calls.append(("stop",))

    def state_dict(self):
        return {"steps_seen": torch.tensor(len(self.calls))}

    def load_state_dict(self, state):
        self.calls.append(("load", int(state["steps_seen"])))


def test_coordinator_lifecycle_is_restarted_by_every_fit():
    coordinator = FakeCoordinator()
    trainer = make_trainer(coordinator=coordinator, accumulation=2)
    trainer.fit(2)
    trainer.fit(3)
    assert coordinator.calls == [
        ("start",),
        ("step", 1),
        ("step", 2),
        ("stop",),
        ("start",),
        ("step", 3),
        ("stop",),
    ]


def test_coordinator_stopped_even_when_training_fails():
    coordinator = FakeCoordinator()
    with pytest.raises(TypeError):
        make_trainer(coordinator=coordinator, loader=[torch.zeros(1)]).fit(1)
    assert coordinator.calls[-1] == ("stop",)


@pytest.mark.parametrize("reset", [True, False])
def test_truthy_coordinator_result_resets_inner_optimizer(reset):
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = make_trainer(
        model,
        optimizer=optimizer,
        coordinator=FakeCoordinator(reset_at={2}),
        sections={"distributed": {"reset_inner_optimizer": reset}},
    )
    trainer.fit(1)
    assert len(optimizer.state) > 0
    trainer.fit(2)
    assert (len(optimizer.state) == 0) is reset


@pytest.mark.parametrize("reset", [True, False])
def test_a_global_installed_at_coordinator_start_resets_the_inner_optimizer(reset):
    # A resumed DiLoCo node installs a newer global over its checkpointed weights at start: its
    # restored AdamW moments belong to the trajectory it discarded.
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    coordinator = FakeCoordinator()
    trainer = make_trainer(
        model,
        optimizer=optimizer,
        coordinator=coordinator,
        sections={"distributed": {"reset_inner_optimizer": reset}},
    )
    trainer.fit(1)
    coordinator.reset_at_start = True
    trainer.fit(2)
    steps = {int(state["step"]) for state in optimizer.state.values()}
    assert steps == ({1} if reset else {2})


# --------------------------------------------------------------------------- compile, features


def test_fit_warns_that_a_model_in_eval_mode_trains_without_dropout():
    # transformers' from_pretrained returns an eval-mode model: its dropout would be off unseen.
    stream = io.StringIO()
    trainer = make_trainer(TinyLM(dropout=0.5).eval(), logger=MetricLogger(stream=stream))
    trainer.fit(1)
    assert "TinyLM is in eval mode" in stream.getvalue() and "model.train()" in stream.getvalue()
    trainer.model.train()
    trainer.fit(2)
    assert stream.getvalue().count("eval mode") == 1


def test_validation_gives_each_module_back_its_own_mode():
    # A part kept in eval mode on purpose (no warning: the model trains) came out of the first
    # validation in training mode, as model.train() leaves every submodule.
    model = TinyLM(dropout=0.5)
    model.drop.eval()
    trainer = make_trainer(
        model, eval_dataloader=make_loader(), sections={"data": {"eval_every": 1, "eval_steps": 1}}
    )
    trainer.fit(1)
    assert hook_of(trainer).values("eval", "step") == [1]
    assert model.training and not model.drop.training and model.head.training
    model.eval()
    trainer.evaluate()
    assert not any(module.training for module in model.modules())


def test_compile_construction_failure_falls_back_to_eager(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    stream = io.StringIO()
    trainer = make_trainer(logger=MetricLogger(stream=stream), sections={"compile": True})
    assert trainer.fit(2).steps == 2
    assert stream.getvalue().count("torch.compile failed") == 1


def test_compile_first_run_failure_retries_eagerly_and_logs_once(monkeypatch):
    calls = []

    def fails_when_called(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(torch, "compile", lambda model: fails_when_called)
    stream = io.StringIO()
    trainer = make_trainer(logger=MetricLogger(stream=stream), sections={"compile": True})
    result = trainer.fit(3)
    assert result.steps == 3 and math.isfinite(result.final_loss)
    assert len(calls) == 1
    assert stream.getvalue().count("compiled model failed on first run") == 1


def test_compiled_model_is_used_when_it_works(monkeypatch):
    used = []

    def fake_compile(model):
        def run(*args, **kwargs):
            used.append(1)
            return model(*args, **kwargs)

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    make_trainer(sections={"compile": True}).fit(2)
    assert len(used) == 2


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compile_mode_reaches_torch_compile(monkeypatch, mode):
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: modes.append(kw) or model)
    make_trainer(sections={"compile": True, "compile_mode": mode.upper()}).fit(1)
    make_trainer(sections={"compile": True}).fit(1)
    assert modes == [{"mode": mode}, {}]  # the default mode: torch.compile(model), as in 2.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_graph_compile_mode_accumulates_the_eager_update():
    # CUDA graphs reuse their output memory between replays; with gradient accumulation torch has
    # had bugs where a microbatch's gradient was overwritten (pytorch/pytorch#96693, #169545).
    # The trainer accepts compile_mode: reduce-overhead with accumulation: it must match eager.
    weights = []
    for sections in ({"compile": False}, {"compile": True, "compile_mode": "reduce-overhead"}):
        torch.manual_seed(0)
        model = TinyLM()
        trainer = Trainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            make_loader(),
            device="cuda",
            config=make_config(data={"micro_batch_size": 2, "target_batch_size": 8}, **sections),
            logger=MetricLogger(stream=io.StringIO()),
        )
        trainer.fit(3)
        weights.append([p.detach().cpu() for p in model.parameters()])
    for eager, graphed in zip(*weights, strict=True):
        assert (eager - graphed).abs().max() <= 1e-5


@pytest.mark.parametrize("done, compiled", [(1, False), (0, True)])
def test_compile_auto_weighs_the_steps_left_after_a_resume(monkeypatch, done, compiled):
    monkeypatch.setenv("CXX", sys.executable)  # any executable: torch.compile is faked below
    break_even = 4
    monkeypatch.setattr(compile_choice, "CPU_COMPILE_BREAK_EVEN_STEPS", break_even)
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model: calls.append(1) or model)
    stream = io.StringIO()
    trainer = make_trainer(
        logger=MetricLogger(stream=stream),
        sections={"compile": "auto", "run": {"max_steps": break_even}},
    )
    trainer.step = done  # what resume_latest() does after the runtime built the trainer
    assert not calls
    trainer.fit()
    trainer.fit(break_even + 10)  # decided once, on the first fit
    assert len(calls) == int(compiled)
    expected = f"{break_even - done} steps" if compiled else f"{break_even - done} steps on CPU"
    assert f"compile: auto -> {'on' if compiled else 'off'}" in stream.getvalue()
    assert stream.getvalue().count("compile: auto") == 1 and expected in stream.getvalue()


def test_compile_auto_without_a_cpp_compiler_trains_eagerly_and_says_why(monkeypatch, tmp_path):
    # Found: "compile: auto -> on", then inductor's InvalidCxxCompiler warning at the first step.
    monkeypatch.setattr(compile_choice, "CPU_COMPILE_BREAK_EVEN_STEPS", 2)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no g++
    stream = io.StringIO()
    trainer = make_trainer(
        logger=MetricLogger(stream=stream), sections={"compile": "auto", "run": {"max_steps": 2}}
    )
    trainer.fit()
    log = stream.getvalue()
    assert "compile: auto -> off (auto: no C++ compiler for torch.compile on CPU" in log
    assert trainer._compiled is None and "compiled model failed" not in log


@pytest.mark.parametrize(
    "requested, applied", [("auto", "caching"), ("caching", "caching"), ("default", "default")]
)
def test_the_cpu_allocator_setting_reaches_malloc(monkeypatch, requested, applied):
    calls = []
    monkeypatch.setattr(cpu_allocator, "_enabled", False)
    monkeypatch.setattr(cpu_allocator, "caching_available", lambda: True)
    monkeypatch.setattr(cpu_allocator, "enable_caching", lambda: calls.append(1))
    stream = io.StringIO()
    make_trainer(logger=MetricLogger(stream=stream), sections={"run": {"cpu_allocator": requested}})
    assert len(calls) == int(applied == "caching")
    assert ("cpu_allocator: auto -> caching" in stream.getvalue()) is (requested == "auto")


@pytest.mark.parametrize("min_width, mode", [(1, "bf16"), (10**6, "fp32")])
def test_precision_auto_on_cpu_follows_the_model_width(monkeypatch, min_width, mode):
    monkeypatch.setattr(precision_module, "cpu_bf16_supported", lambda: True)
    monkeypatch.setattr(precision_module, "CPU_BF16_MIN_WIDTH", min_width)
    stream = io.StringIO()
    trainer = make_trainer(logger=MetricLogger(stream=stream))
    assert trainer.precision.mode == mode
    assert f"precision: auto -> {mode} (" in stream.getvalue()
    assert math.isfinite(trainer.fit(2).final_loss)


def test_gradient_checkpointing_uses_the_model_hook_or_warns():
    class WithHook(TinyLM):
        enabled = None

        def set_gradient_checkpointing(self, enabled):
            self.enabled = enabled

    model = WithHook()
    make_trainer(model, sections={"gradient_checkpointing": True})
    assert model.enabled is True
    stream = io.StringIO()
    make_trainer(logger=MetricLogger(stream=stream), sections={"gradient_checkpointing": True})
    assert "no set_gradient_checkpointing" in stream.getvalue()


def test_gradient_clipping_reports_the_norm():
    trainer = make_trainer(sections={"optimizer": {"grad_clip": 1e-3}}, lr=0.0)
    trainer.fit(1)
    norms = hook_of(trainer).values("train_step", "grad_norm")
    assert len(norms) == 1 and norms[0] > 1e-3  # the pre-clip norm is reported
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    assert grads.norm().item() == pytest.approx(1e-3, rel=1e-3)


def test_grad_scaler_path_steps_and_checkpoints_scaler(monkeypatch, tmp_path):
    monkeypatch.setattr(
        trainer_module, "make_grad_scaler", lambda plan: torch.amp.GradScaler("cpu", init_scale=4.0)
    )
    model = TinyLM()
    before = model.head.weight.detach().clone()
    trainer = make_trainer(
        model,
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=2),
        sections={"optimizer": {"grad_clip": 10.0}},
    )
    result = trainer.fit(2)
    assert not torch.equal(before, model.head.weight)
    assert math.isfinite(hook_of(trainer).values("train_step", "grad_norm")[0])
    state = CheckpointManager(tmp_path).load_latest()
    assert state["scaler"]["scale"] == trainer.scaler.get_scale()
    assert result.checkpoint == tmp_path / "step_2.pt"


# -------------------------------------------------------------------------------- non-finite


class NaNAtCall(TinyLM):
    """A NaN loss at the given calls."""

    def __init__(self, bad_calls):
        super().__init__()
        self.bad_calls, self.calls = set(bad_calls), 0

    def forward(self, input_ids, labels=None, **_):
        self.calls += 1
        out = super().forward(input_ids)
        if self.calls in self.bad_calls:
            out["logits"] = self.spoil(out["logits"])
        return out

    def spoil(self, logits):
        return logits * float("nan")


def test_nonfinite_stop_policy_raises_without_checkpoint(tmp_path):
    model = NaNAtCall({3})
    manager = CheckpointManager(tmp_path, every_steps=1)
    trainer = make_trainer(
        model, checkpoint_manager=manager, sections={"run": {"nonfinite_loss": "stop"}}
    )
    with pytest.raises(NonFiniteLossError, match="step 3"):
        trainer.fit(5)
    assert trainer.step == 2
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_1.pt", "step_2.pt"]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nonfinite_skip_policy_skips_and_counts():
    model = NaNAtCall({2})
    trainer = make_trainer(model, sections={"run": {"nonfinite_loss": "skip"}})
    result = trainer.fit(3)
    assert result.steps == 3 and result.skipped_steps == 1
    assert model.calls == 4  # one extra batch replaced the skipped update
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert hook_of(trainer).values("nonfinite_skip", "step") == [2]


def test_skip_policy_gives_up_on_a_diverged_run():
    model = NaNAtCall(set(range(1, 1000)))
    with pytest.raises(NonFiniteLossError, match="consecutive") as raised:
        make_trainer(model, sections={"run": {"nonfinite_loss": "skip"}}).fit(2)
    # The policy is already skip: the fixes offered are the others.
    assert "lower the learning rate" in str(raised.value)
    assert "nonfinite_loss" not in str(raised.value)


class TwoZeroLogger(MetricLogger):
    """A subclass written against 2.0's MetricLogger: emit and _emit_locked take
    (event, payload), nothing more.
    """

    def emit(self, event, payload):
        self.seen = [*getattr(self, "seen", []), event]
        super().emit(event, payload)

    def _emit_locked(self, event, payload):
        super()._emit_locked(event, payload)


@pytest.mark.parametrize("logger_class", [MetricLogger, TwoZeroLogger])
def test_a_streak_of_skips_is_one_console_line_and_a_summary_but_a_record_each(
    tmp_path, logger_class
):
    # Up to 49 near-identical nonfinite_skip lines scrolled past before a diverged run stopped.
    # Collapsing them passed emit(..., text=False): a TypeError in a 2.0 subclass's emit.
    path, console = tmp_path / "metrics.jsonl", io.StringIO()
    hook = RecordingHook()
    logger = logger_class(stream=console, json_file=str(path), hooks=[hook])
    model = NaNAtCall({2, 3, 4, 5, 7})  # a streak of 4 skips at step 2, then 1 at step 3
    result = make_trainer(model, logger=logger, sections={"run": {"nonfinite_loss": "skip"}}).fit(4)
    logger.close()
    assert result.skipped_steps == 5
    skips = [r["step"] for r in _strict_records(path) if r["event"] == "nonfinite_skip"]
    assert skips == hook.values("nonfinite_skip", "step") == [2, 2, 2, 2, 3]
    lines = [line for line in console.getvalue().splitlines() if "nonfinite_skip" in line]
    assert len(lines) == 3, lines
    assert "step=2" in lines[0] and "skipped_steps=1" in lines[0]
    summary = "3 more updates skipped at step 2 (4 skipped in all); each has a nonfinite_skip"
    assert lines[1].endswith(
        f"WARNING nonfinite_skip: {summary} record in the metrics file and hooks"
    )
    assert "step=3" in lines[2] and "skipped_steps=5" in lines[2]
    if logger_class is TwoZeroLogger:  # the override saw every event, the streak's included
        assert logger.seen.count("nonfinite_skip") == 5 and logger.seen[-1] == "fit_end"


def _strict_records(path):
    """Parse a JSONL file as strict JSON (RFC 8259: no NaN/Infinity), as jq and JSON.parse do."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


class NaNGradAtCall(NaNAtCall):
    """A finite loss with a NaN gradient at the given calls (d sqrt(x)/dx at x = 0)."""

    def spoil(self, logits):
        return logits + torch.sqrt(self.head.weight.sum() * 0.0)


@pytest.mark.parametrize(
    ("model", "reason"), [(NaNAtCall({2}), "loss"), (NaNGradAtCall({2}), "grad_norm")]
)
def test_a_skip_record_is_strict_json_and_says_why(tmp_path, model, reason):
    # A skipped step's record held `"loss": NaN` (jq/JSON.parse refuse the whole file), and a
    # skip for a non-finite gradient norm (with a finite loss) did not say why.
    path = tmp_path / "metrics.jsonl"
    hook = RecordingHook()
    logger = MetricLogger(stream=io.StringIO(), json_file=str(path), hooks=[hook])
    make_trainer(model, logger=logger, sections={"run": {"nonfinite_loss": "skip"}}).fit(3)
    logger.close()
    skips = [r for r in _strict_records(path) if r["event"] == "nonfinite_skip"]
    assert len(skips) == 1 and skips[0]["step"] == 2 and skips[0]["reason"] == reason
    if reason == "loss":
        assert skips[0]["loss"] is None  # NaN in memory, null on disk
        assert math.isnan(hook.values("nonfinite_skip", "loss")[0])
    else:
        assert math.isfinite(skips[0]["loss"]) and skips[0]["grad_norm"] is None


def test_bad_nonfinite_policy_is_rejected():
    with pytest.raises(ValueError, match="run.nonfinite_loss"):
        make_config(run={"nonfinite_loss": "ignore"})


# ------------------------------------------------------------------------------- checkpoints


def test_checkpoint_contents(tmp_path):
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    trainer = make_trainer(
        model,
        optimizer=optimizer,
        scheduler=scheduler,
        coordinator=FakeCoordinator(),
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=2),
        accumulation=2,
        sections={"distributed": {"token": "hf_secret"}},
    )
    trainer.fit(2)
    state = CheckpointManager(tmp_path).load_latest()
    assert {
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "step",
        "samples",
        "tokens",
        "rng",
        "data",
        "config",
        "coordinator",
    } <= state.keys()
    assert state["step"] == 2 and state["samples"] == 8 and state["tokens"] == 48
    assert state["config"]["distributed"]["token"] is None  # redacted
    assert state["config"]["data"]["target_batch_size"] == 2
    assert state["scheduler"]["last_epoch"] == 2
    assert state["data"]["consumed"] == 4
    assert "hf_secret" not in (tmp_path / "step_2.pt").read_bytes().decode("latin-1")


@pytest.mark.parametrize("dataset", [TokenDataset(), Path("data/train_*.bin")])
def test_a_config_holding_a_dataset_object_or_path_resumes(tmp_path, dataset):
    # data.dataset may hold a Dataset object (or a path object) in Python. The checkpoint's config
    # pickled it, and weights-only loading refused every checkpoint: "no loadable checkpoint ...
    # Unsupported global: GLOBAL trainer_testkit.TokenDataset" (pathlib.PosixPath).
    def trainer(stream):
        return make_trainer(
            checkpoint_manager=CheckpointManager(tmp_path, every_steps=2),
            sections={"data": {"dataset": dataset}},
            logger=MetricLogger(stream=stream),
        )

    trainer(io.StringIO()).fit(2)
    saved = CheckpointManager(tmp_path).load_latest()["config"]["data"]["dataset"]
    assert saved == (str(dataset) if isinstance(dataset, Path) else None)  # plain data only
    stream = io.StringIO()
    resumed = trainer(stream)
    assert resumed.resume_latest() and resumed.step == 2
    assert "data.dataset" not in stream.getvalue()  # the same setting: no "changed" warning


class RecordingDataset(TokenDataset):
    """TokenDataset that records the indices it is asked for."""

    def __init__(self, n: int = 16) -> None:
        super().__init__(n)
        self.seen: list[int] = []

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.seen.append(i)
        return super().__getitem__(i)


def test_another_batch_size_on_resume_is_named_only_where_the_data_does_not_continue(tmp_path):
    # A DataLoader of its own is fast-forwarded by the batches consumed: at another
    # micro_batch_size they hold other samples, which the warning says. Another target_batch_size
    # groups the same micro batches into steps otherwise: the data continues, so nothing is said.
    def run(micro, target):
        dataset, stream = RecordingDataset(), io.StringIO()
        sections = {"micro_batch_size": micro, "target_batch_size": target}
        trainer = make_trainer(
            loader=make_loader(dataset, batch_size=micro),
            sections={"data": sections, "checkpoint": {"save_final": False}},
            checkpoint_manager=CheckpointManager(tmp_path, every_steps=2),
            logger=MetricLogger(stream=stream),
        )
        return trainer, dataset.seen, stream

    run(2, 2)[0].fit(2)  # samples 0-3
    for micro, target, taken, warned in ((2, 4, [4, 5, 6, 7], False), (1, 2, [2, 3], True)):
        trainer, seen, stream = run(micro, target)
        assert trainer.resume_latest()
        trainer.fit(3)
        assert seen[-len(taken) :] == taken  # [2, 3]: samples 2 and 3 again, not 4 and 5
        assert ("data.micro_batch_size is 1 here but 2" in stream.getvalue()) is warned
        assert "target_batch_size" not in stream.getvalue()


def test_final_checkpoint_saved_off_interval(tmp_path):
    trainer = make_trainer(
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=4, keep_last=None)
    )
    result = trainer.fit(5)
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_4.pt", "step_5.pt"]
    assert result.checkpoint == tmp_path / "step_5.pt"
    assert trainer.fit(5).checkpoint is None  # a fit that runs no step writes nothing


def test_final_checkpoint_can_be_turned_off(tmp_path):
    trainer = make_trainer(
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=4),
        sections={"checkpoint": {"save_final": False}},
    )
    trainer.fit(5)
    assert [p.name for p in tmp_path.glob("step_*.pt")] == ["step_4.pt"]


def test_disabled_manager_writes_nothing(tmp_path):
    make_trainer(checkpoint_manager=CheckpointManager(tmp_path, every_steps=1, enabled=False)).fit(
        3
    )
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------ exact resume


def build_run(tmp_path, *, every_steps=3, dataset=None, batch_size=2):
    torch.manual_seed(123)
    model = TinyLM(dropout=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    loader = make_loader(dataset or TokenDataset(n=10), batch_size=batch_size, shuffle=True)
    return make_trainer(
        model,
        loader,
        optimizer=optimizer,
        scheduler=scheduler,
        accumulation=2,
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=every_steps),
    )


def test_exact_resume_reproduces_losses_bit_for_bit(tmp_path):
    uninterrupted = build_run(tmp_path / "a")
    uninterrupted.fit(7)
    expected = hook_of(uninterrupted).values("train_step", "loss")

    first = build_run(tmp_path / "b")
    first.fit(3)  # stops mid-epoch: 10 samples, 4 per step
    torch.manual_seed(999)  # a fresh process would not share the first run's RNG state
    resumed = build_run(tmp_path / "b")
    assert resumed.resume_latest()
    resumed.fit(7)
    got = hook_of(first).values("train_step", "loss") + hook_of(resumed).values(
        "train_step", "loss"
    )
    assert got == expected
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_first_record_after_a_resume_averages_its_whole_logging_interval(tmp_path):
    def run(path):
        trainer = build_run(path)
        trainer.logger.every_steps = 4
        return trainer

    uninterrupted = run(tmp_path / "a")
    uninterrupted.fit(8)
    first = run(tmp_path / "b")
    first.fit(6)  # its last checkpoint is mid-interval: steps 5 and 6 are not logged yet
    resumed = run(tmp_path / "b")
    resumed.resume_latest()
    resumed.fit(8)
    records = [
        {k: p[k] for k in ("step", "loss", "loss_last")}
        for trainer in (first, resumed)
        for e, p in hook_of(trainer).events
        if e == "train_step"
    ]
    expected = [
        {k: p[k] for k in ("step", "loss", "loss_last")}
        for e, p in hook_of(uninterrupted).events
        if e == "train_step"
    ]
    assert records == expected  # step 8's loss is the mean of steps 5-8, not of 7-8


class CountingStream(IterableDataset):
    """An iterable dataset with its own resumable position, as the built-in datasets provide."""

    def __init__(self, n: int = 40) -> None:
        self.n, self.position = n, 0
        self.data = TokenDataset(n=n)

    def __iter__(self):
        while self.position < self.n:
            item = self.data[self.position]
            self.position += 1
            yield item
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_exact_resume_uses_a_stateful_dataset_position(tmp_path):
    def run(path):
        torch.manual_seed(5)
        model = TinyLM()
        return make_trainer(
            model,
            DataLoader(CountingStream(), batch_size=2),
            accumulation=2,
            optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
            checkpoint_manager=CheckpointManager(path, every_steps=2),
        )

    whole = run(tmp_path / "a")
    whole.fit(5)
    first = run(tmp_path / "b")
    first.fit(2)
    assert CheckpointManager(tmp_path / "b").load_latest()["data"]["source"]["state"] == {
        "position": 8
    }
    resumed = run(tmp_path / "b")
    resumed.resume_latest()
    resumed.fit(5)
    assert hook_of(first).values("train_step", "loss") + hook_of(resumed).values(
        "train_step", "loss"
    ) == hook_of(whole).values("train_step", "loss")


def test_resume_without_checkpoint_warns_and_starts_fresh(tmp_path):
    stream = io.StringIO()
    trainer = make_trainer(
        logger=MetricLogger(stream=stream), checkpoint_manager=CheckpointManager(tmp_path)
    )
    assert trainer.resume_latest() is False
    assert "no checkpoint was found" in stream.getvalue() and trainer.step == 0


def test_resume_rejects_foreign_state():
    with pytest.raises(ValueError, match="lacks"):
        make_trainer().resume({"weights": {}})


# -------------------------------------------------------------------------------- validation


def test_validation_loss_every_eval_every_steps():
    eval_loader = make_loader(TokenDataset(n=8), batch_size=2)
    trainer = make_trainer(
        eval_dataloader=eval_loader, sections={"data": {"eval_every": 2, "eval_steps": 1}}
    )
    result = trainer.fit(5)
    steps = hook_of(trainer).values("eval", "step")
    assert steps == [2, 4, 5]  # and the weights the run ends with
    assert result.metrics["val_loss"] == hook_of(trainer).values("eval", "val_loss")[-1]
    one_batch = full_batch_loss(
        trainer.model.eval(), [eval_loader.dataset[i] for i in range(2)]
    ).item()
    assert trainer.evaluate() == pytest.approx(
        one_batch, rel=1e-6
    )  # eval_steps=1 limits it to one batch
    assert trainer.evaluate(max_batches=4) != pytest.approx(one_batch, rel=1e-6)


@pytest.mark.parametrize("eval_every", [None, 2])
def test_validation_data_without_eval_every_is_said_once_to_go_unevaluated(eval_every):
    # A validation set with no data.eval_every was never evaluated, not even as fit() ends: the
    # run reported no val_loss and said nothing.
    stream = io.StringIO()
    trainer = make_trainer(
        eval_dataloader=make_loader(TokenDataset(n=4)),
        sections={"data": {"eval_every": eval_every}},
        logger=MetricLogger(stream=stream, hooks=[RecordingHook()]),
    )
    trainer.fit(3)
    trainer.fit(5)
    warned = stream.getvalue().count("data.eval_every is not set")
    evaluated = hook_of(trainer).values("eval", "step")
    if eval_every is None:
        assert warned == 1 and evaluated == [] and "val_loss" not in trainer.fit(6).metrics
    else:
        assert warned == 0 and evaluated == [2, 3, 4, 5]
    quiet = io.StringIO()  # no validation set: nothing to say
    make_trainer(logger=MetricLogger(stream=quiet)).fit(1)
    assert "eval_every" not in quiet.getvalue()


def test_validation_loss_without_token_labels_weighs_an_uneven_last_batch_by_its_size():
    # Float targets (regression) have no label count: each batch counted once, so a last batch
    # of 1 sample weighed as much as one of 2 and the validation loss was not the split's mean.
    class Regression(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x, y):
            return F.mse_loss(self.w * x, y)

    x, y = torch.arange(5.0), torch.zeros(5)  # per-sample losses 0, 1, 4, 9, 16
    eval_loader = DataLoader(TensorDataset(x, y), batch_size=2)  # batches of 2, 2, 1
    loader = DataLoader(TensorDataset(x, y))
    trainer = make_trainer(Regression(), loader, eval_dataloader=eval_loader)
    assert trainer.evaluate() == pytest.approx((0 + 1 + 4 + 9 + 16) / 5)


def _llama(transformers):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(config)


def _gpt2(transformers):  # what AutoModelForCausalLM builds for GPT-2: no *ForCausalLM name
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=16, **no_dropout
    )
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_a_transformers_causal_lm_trains_on_the_already_shifted_labels(build):
    """A transformers causal LM shifts `labels` itself: given the trainer's shifted labels it
    would score (and learn) the token after next. It is called without them instead.
    """
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = build(transformers)  # without dropout: the reference logits are the step's
    loader = make_loader(TokenDataset(n=4), batch_size=2)
    trainer = make_trainer(model, loader, eval_dataloader=loader, sections={"data": {}})
    batch = next(iter(loader))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    expected = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).item()
    assert trainer.evaluate(max_batches=1) == pytest.approx(expected, rel=1e-5)
    trainer.fit(1)
    assert hook_of(trainer).values("train_step", "loss") == [pytest.approx(expected, rel=1e-5)]
    assert f"{type(model).__name__} shifts labels itself" in trainer.logger.stream.getvalue()


def test_one_process_raises_an_eval_loader_or_checkpoint_folder_error_as_it_is(tmp_path):
    """What a data-parallel group now agrees on first (parallel_worker's `apart` scenario) is,
    in one process, the error itself, unchanged: no message names a rank."""

    class Unstartable:
        def __iter__(self):
            raise OSError("workers failed to start")

    trainer = make_trainer(eval_dataloader=Unstartable())
    with pytest.raises(OSError, match="^workers failed to start$"):
        trainer.evaluate()
    assert trainer.model.training  # was left in eval mode: a caller training on lost dropout
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    trainer = make_trainer(checkpoint_manager=CheckpointManager(tmp_path / "loop"))
    with pytest.raises(OSError, match="Too many levels of symbolic links") as raised:
        trainer.resume_latest()
    assert type(raised.value) is OSError


def test_an_evaluation_of_no_batch_starts_no_loader():
    """evaluate(max_batches=0) started the loader (a DataLoader's workers) for nothing: in one
    process its failure raised, while under data parallelism the failing rank dropped it."""

    class Unstartable:
        tried = 0

        def __iter__(self):
            self.tried += 1
            raise OSError("workers failed to start")

    loader = Unstartable()
    trainer = make_trainer(eval_dataloader=loader)
    assert trainer.evaluate(max_batches=0) is None and loader.tried == 0
    for wrong in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"^evaluate\(max_batches=.*\) takes None"):
            trainer.evaluate(max_batches=wrong)
    assert loader.tried == 0


def test_a_one_shot_eval_iterator_is_refused_once_exhausted():
    """A generator gave its batches to the first evaluation only: later ones reported nothing and
    fit() returned the first evaluation's val_loss as the final one."""
    batches = list(make_loader(TokenDataset(n=4), batch_size=2))
    stream = io.StringIO()
    trainer = make_trainer(
        eval_dataloader=iter(batches),
        sections={"data": {"eval_every": 1}},
        logger=MetricLogger(stream=stream, hooks=[RecordingHook()]),
    )
    # Said at once: with data.eval_steps below its length, each evaluation reads other batches.
    assert "one-shot iterator: each evaluation reads its next batches" in stream.getvalue()
    with pytest.raises(ValueError, match="eval_dataloader is a one-shot iterator that is"):
        trainer.fit(3)
    stream = io.StringIO()
    again = make_trainer(
        eval_dataloader=batches,
        sections={"data": {"eval_every": 1}},
        logger=MetricLogger(stream=stream, hooks=[RecordingHook()]),
    )
    again.fit(3)  # a list is read again by every evaluation
    assert len(hook_of(again).values("eval", "val_loss")) == 3
    assert "one-shot" not in stream.getvalue()


def test_validation_runs_in_the_training_precision(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_bf16_supported", lambda: True)
    seen = []

    class Recording(TinyLM):
        def forward(self, input_ids, labels=None, **kwargs):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().forward(input_ids, labels, **kwargs)

    trainer = make_trainer(
        Recording(),
        eval_dataloader=make_loader(TokenDataset(n=4)),
        sections={"precision": {"mode": "bf16"}},
    )
    trainer.fit(1)
    assert trainer.precision.mode == "bf16" and seen == [True]
    assert math.isfinite(trainer.evaluate()) and seen == [True] * 3


def test_train_step_metrics_cadence_and_fields():
    trainer = make_trainer(
        logger=MetricLogger(stream=io.StringIO(), every_steps=2, hooks=[RecordingHook()])
    )
    trainer.fit(4)
    records = [p for e, p in hook_of(trainer).events if e == "train_step"]
    assert [r["step"] for r in records] == [2, 4]
    fields = {"loss", "loss_last", "lr", "tokens_per_s", "samples_per_s", "step_time_s"}
    assert fields | {"mfu_vs_matmul_probe"} <= records[0].keys()
    assert records[0]["lr"] == 0.1


def test_train_step_records_the_learning_rate_the_step_used():
    # The record was read after scheduler.step(): step N logged step N+1's rate (warmup step 1
    # trained at 0.01 and logged 0.02; a cosine run's last step logged the floor it never used).
    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            self.used.append(self.param_groups[0]["lr"])
            return super().step(closure)

    model = TinyLM()
    optimizer = RecordingSGD(model.parameters(), lr=0.1)
    optimizer.used = []
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    trainer = make_trainer(model, optimizer=optimizer, scheduler=warmup)
    trainer.fit(3)
    assert hook_of(trainer).values("train_step", "lr") == pytest.approx(optimizer.used)
    assert optimizer.used == pytest.approx([0.01, 0.02, 0.03])


def test_interval_loss_weighs_each_step_by_its_valid_labels():
    # A record's loss is the mean over the interval's label tokens; weighting each step by its
    # input tokens instead over-counted steps whose labels were mostly ignored (padding, prompts).
    dataset = TokenDataset(n=4, ignore_every=6)  # sample i ignores i % 6 of its 6 labels

    def losses(every_steps):
        torch.manual_seed(0)
        hook = RecordingHook()
        logger = MetricLogger(stream=io.StringIO(), every_steps=every_steps, hooks=[hook])
        make_trainer(TinyLM(), make_loader(dataset, batch_size=1), logger=logger).fit(4)
        return hook.values("train_step", "loss")

    per_step, per_interval = losses(1), losses(4)
    labels = [int((dataset[i]["labels"] != -100).sum()) for i in range(4)]  # 6, 5, 4, 3
    expected = sum(x * n for x, n in zip(per_step, labels, strict=True)) / sum(labels)
    assert per_interval == [pytest.approx(expected, rel=1e-6)]


@pytest.mark.parametrize("grad_clip", [1.0, None])
def test_infinite_gradient_with_finite_loss_is_caught_by_the_policy(grad_clip):
    class InfGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x, y):
            return torch.sqrt(self.w - self.w.detach()).sum()  # loss 0, d/dw = inf

    model = InfGrad()
    data = TensorDataset(torch.zeros(4, 1), torch.zeros(4))
    trainer = make_trainer(
        model, DataLoader(data, batch_size=2), sections={"optimizer": {"grad_clip": grad_clip}}
    )
    # Without clipping (the default) the norm is still checked: the weights never see inf.
    with pytest.raises(NonFiniteLossError, match="grad_norm=inf"):
        trainer.fit(1)
    assert torch.equal(model.w.detach(), torch.ones(1))


def test_unclipped_steps_report_no_grad_norm():
    trainer = make_trainer()
    trainer.fit(2)
    assert hook_of(trainer).values("train_step", "grad_norm") == []


# ------------------------------------------------------------------------ emergency checkpoints


class FailingDataset(TokenDataset):
    """TokenDataset whose `fail_at`-th read (1-based, counted across epochs) raises."""

    def __init__(self, fail_at: int | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_at, self.reads = fail_at, 0

    def __getitem__(self, i):
        self.reads += 1
        if self.reads == self.fail_at:
            raise ValueError(f"bad sample {i}")
        return super().__getitem__(i)


@pytest.mark.parametrize("failing_in", ["read", "forward"])
def test_a_failure_mid_step_saves_the_previous_step_exactly(tmp_path, failing_in):
    # #19: an error during training saved nothing, losing every step since the last checkpoint.
    torch.manual_seed(0)
    whole = build_run(tmp_path / "a", every_steps=100)
    whole.fit(7)
    # Step 5's second micro-batch fails (4 reads, 2 forwards per step), in its read or in its
    # forward (an out-of-memory error) after the first one's dropout drew from the RNG: step 4 is
    # the last sound state, and the data position and RNG the failed step had consumed are
    # rewound (the RNG captured as each step begins: the one at the failure is a draw ahead).
    torch.manual_seed(0)
    dataset = FailingDataset(19 if failing_in == "read" else None, n=10)
    failing = build_run(tmp_path / "b", dataset=dataset, every_steps=100)
    forwards, forward = itertools.count(1), failing.model.forward

    def out_of_memory_in_the_tenth(*args, **kwargs):
        output = forward(*args, **kwargs)
        if next(forwards) == 10 and failing_in == "forward":
            raise RuntimeError("CUDA out of memory")
        return output

    failing.model.forward = out_of_memory_in_the_tenth
    with pytest.raises((ValueError, RuntimeError), match="bad sample|out of memory"):
        failing.fit(7)
    assert failing.emergency_checkpoint == tmp_path / "b" / "step_4.pt"
    assert CheckpointManager(tmp_path / "b").load_latest()["step"] == 4
    torch.manual_seed(999)
    resumed = build_run(tmp_path / "b", every_steps=100)
    assert resumed.resume_latest()
    resumed.fit(7)
    losses = hook_of(failing).values("train_step", "loss") + hook_of(resumed).values(
        "train_step", "loss"
    )
    assert losses == hook_of(whole).values("train_step", "loss")
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_failure_before_any_step_completes_writes_no_checkpoint(tmp_path):
    # The state is the one the run started from: a fresh initialization has nothing to keep.
    fresh = build_run(tmp_path, dataset=FailingDataset(1, n=10), every_steps=100)
    with pytest.raises(ValueError):
        fresh.fit(3)
    assert fresh.emergency_checkpoint is None and not list(tmp_path.glob("step_*.pt"))
    build_run(tmp_path, every_steps=2).fit(2)
    resumed = build_run(tmp_path, dataset=FailingDataset(1, n=10), every_steps=100)
    assert resumed.resume_latest()
    with pytest.raises(ValueError):  # and a resumed one's start is already on disk
        resumed.fit(4)
    assert resumed.emergency_checkpoint is None
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_2.pt"]


class DiskFullOnSkip(MetricLogger):
    """A logger whose metrics file fills up as it records a skipped update."""

    def emit(self, event, payload):
        if event == "nonfinite_skip":
            raise OSError(28, "No space left on device")
        return super().emit(event, payload)


def test_an_emergency_checkpoint_after_a_skipped_update_rewinds_its_count_too(tmp_path):
    # Step 3's update is skipped (a NaN loss) and counted; recording it fails. The checkpoint of
    # step 2 rewinds the data to before step 3's batch, so it must not count step 3's skip: a
    # resume skips that batch again, and would count it twice.
    trainer = make_trainer(
        NaNAtCall({3}),
        logger=DiskFullOnSkip(stream=io.StringIO()),
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=100),
        sections={"run": {"nonfinite_loss": "skip"}},
    )
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(5)
    saved = CheckpointManager(tmp_path).load_latest()
    assert trainer.emergency_checkpoint == tmp_path / "step_2.pt"
    assert (saved["step"], saved["data"]["consumed"], saved["skipped_steps"]) == (2, 2, 0)


def test_the_emergency_checkpoint_never_replaces_or_prunes_good_ones(tmp_path):
    trainer = build_run(tmp_path, dataset=FailingDataset(4 * 5 + 1, n=10), every_steps=2)
    trainer.checkpoint_manager.keep_last = 1
    with pytest.raises(ValueError):
        trainer.fit(7)  # fails in step 6: step 4 was saved, step 5 is the emergency one
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_4.pt", "step_5.pt"]
    assert trainer.emergency_checkpoint == tmp_path / "step_5.pt"
    # right after a regular save, that checkpoint already is the state: nothing new is written
    again = build_run(tmp_path / "c", dataset=FailingDataset(4 * 4 + 1, n=10), every_steps=2)
    with pytest.raises(ValueError):
        again.fit(7)
    assert again.emergency_checkpoint == tmp_path / "c" / "step_4.pt"
    assert sorted(p.name for p in (tmp_path / "c").glob("step_*.pt")) == ["step_2.pt", "step_4.pt"]


def test_the_emergency_checkpoint_replaces_an_earlier_runs_file_of_its_step(tmp_path):
    # A notebook re-runs training in the same folder: the first run's final save left step_5.pt.
    earlier = build_run(tmp_path, every_steps=2)
    with torch.no_grad():
        earlier.model.head.bias.add_(1.0)
    earlier.fit(5)
    failing = build_run(tmp_path, dataset=FailingDataset(4 * 5 + 1, n=10), every_steps=2)
    with pytest.raises(ValueError):
        failing.fit(7)  # fails in step 6: its step 5 is the emergency checkpoint, not the old one
    assert failing.emergency_checkpoint == tmp_path / "step_5.pt"
    saved = torch.load(tmp_path / "step_5.pt", weights_only=True)["model"]["head.bias"]
    assert torch.equal(saved, failing.model.head.bias.detach())
    assert failing.checkpoint_manager.latest_path() == tmp_path / "step_5.pt"


class BrokenOptimizer(torch.optim.SGD):
    def step(self, closure=None):
        with torch.no_grad():
            for group in self.param_groups:
                group["params"][0].add_(1.0)  # half-applied
        raise RuntimeError("update failed")


def test_no_emergency_checkpoint_from_a_half_applied_update_or_nonfinite_weights(tmp_path):
    model = TinyLM()
    trainer = make_trainer(
        model,
        optimizer=BrokenOptimizer(model.parameters(), lr=0.1),
        checkpoint_manager=CheckpointManager(tmp_path),
    )
    with pytest.raises(RuntimeError, match="update failed"):
        trainer.fit(3)
    assert trainer.emergency_checkpoint is None and not list(tmp_path.glob("step_*.pt"))
    poisoned = make_trainer(
        loader=[{"bad": 1}], checkpoint_manager=CheckpointManager(tmp_path / "nan")
    )
    with torch.no_grad():
        next(poisoned.model.parameters()).fill_(math.nan)
    with pytest.raises(TypeError):  # the batch has no input_ids
        poisoned.fit(1)
    assert poisoned.emergency_checkpoint is None and not (tmp_path / "nan").exists()


def test_a_failure_after_the_update_saves_the_completed_step(tmp_path):
    class BadEval(DataLoader):
        def __iter__(self):
            raise OSError(28, "No space left on device")

    trainer = make_trainer(
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=100),
        eval_dataloader=BadEval(TokenDataset()),
        sections={"data": {"eval_every": 2}},
    )
    with pytest.raises(OSError):
        trainer.fit(5)
    assert trainer.emergency_checkpoint == tmp_path / "step_2.pt"
    assert torch.load(tmp_path / "step_2.pt", weights_only=True)["step"] == 2


def _failing_fsdp_trainer(checkpoints, stream):
    """A one-rank FSDP trainer whose 7th sample raises, logging into stream."""
    return make_trainer(
        loader=make_loader(FailingDataset(7, n=10)),
        logger=MetricLogger(stream=stream),
        checkpoint_manager=CheckpointManager(checkpoints, every_steps=100),
        parallel=ParallelContext(mode="fsdp", world_size=1),
    )


def test_a_one_rank_fsdp_group_writes_no_weightless_emergency_checkpoint(tmp_path):
    # Its dense state holds no weights (FSDP2 saves through DCP): a file from it would move
    # `latest` to a checkpoint that cannot resume.
    stream = io.StringIO()
    trainer = _failing_fsdp_trainer(tmp_path, stream)
    with pytest.raises(ValueError, match="bad sample"):
        trainer.fit(5)
    assert trainer.step == 3 and trainer.emergency_checkpoint is None
    assert not list(tmp_path.iterdir())
    assert "no emergency checkpoint under data parallelism" in stream.getvalue()


def test_a_failure_under_data_parallelism_names_this_runs_checkpoint_not_an_earlier_runs(tmp_path):
    make_trainer(checkpoint_manager=CheckpointManager(tmp_path, every_steps=1)).fit(2)
    stream = io.StringIO()
    trainer = _failing_fsdp_trainer(tmp_path, stream)  # a fresh run beside the earlier step_2.pt
    with pytest.raises(ValueError, match="bad sample"):
        trainer.fit(5)
    assert "resume from the start (this run wrote no checkpoint)" in stream.getvalue()
    assert "step_2.pt" not in stream.getvalue()


def test_resume_reports_another_optimizer_and_logs_fallbacks_in_one_line(tmp_path):
    from speedtronic_trainer import CheckpointMismatch

    manager = CheckpointManager(tmp_path, every_steps=1, keep_last=None)
    make_trainer(checkpoint_manager=manager, sections={"optimizer": {"name": "muon"}}).fit(2)
    (tmp_path / "step_2.pt").write_bytes(b"torn")
    stream = io.StringIO()
    adamw = make_trainer(checkpoint_manager=manager, logger=MetricLogger(stream=stream))
    # a subclass of CheckpointError: the settings are the user's to fix, not a damaged file
    with pytest.raises(CheckpointMismatch, match="optimizer.name: muon, but this run uses .*adamw"):
        adamw.resume_latest()
    fallback = [line for line in stream.getvalue().splitlines() if "trying an older" in line]
    assert (
        len(fallback) == 1 and "WARNING checkpoint " in fallback[0] and "step_2.pt" in fallback[0]
    )


def test_a_resume_refused_for_its_optimizer_leaves_the_trainer_as_it_was():
    from speedtronic_trainer import CheckpointMismatch

    saved = TinyLM()
    adam = make_trainer(saved, optimizer=torch.optim.Adam(saved.parameters(), lr=0.1))
    adam.fit(2)
    state = adam.state_dict()
    model = TinyLM()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = make_trainer(
        model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    with pytest.raises(CheckpointMismatch, match="another optimizer than this run's SGD"):
        trainer.resume(state)
    # Neither the weights (loaded first, before) nor SGD's groups (torch swapped in Adam's) changed
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert trainer.step == 0 and trainer.optimizer.param_groups[0]["momentum"] == 0.9
    assert trainer.fit(2).skipped_steps == 0  # still trains (a KeyError 'momentum' before)


def test_sparse_gradients_are_clipped_like_dense_ones():
    # clip_grad_norm_ has no sparse kernel: optimizer.grad_clip failed with a bare
    # NotImplementedError ('aten::linalg_vector_norm' ... 'SparseCPU' backend).
    torch.manual_seed(0)
    dense = TinyLM()
    sparse = TinyLM()
    sparse.load_state_dict(dense.state_dict())
    sparse.embed.sparse = True
    clipped = {"optimizer": {"grad_clip": 0.05}}
    runs = [
        make_trainer(m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), sections=clipped)
        for m in (dense, sparse)
    ]
    for trainer in runs:
        trainer.fit(3)
    norms = [hook_of(t).values("train_step", "grad_norm") for t in runs]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) and min(norms[0]) > 0.05
    assert torch.allclose(sparse.embed.weight, dense.embed.weight, atol=1e-6)


def test_sparse_gradients_train_without_clipping():
    # The unclipped step's finiteness check measures a sparse gradient by its stored values
    # (linalg.vector_norm has no sparse kernel).
    model = TinyLM()
    model.embed.sparse = True
    before = model.embed.weight.detach().clone()
    trainer = make_trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert trainer.fit(3).skipped_steps == 0
    assert not torch.equal(model.embed.weight.detach(), before)
