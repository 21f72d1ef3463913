from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from trainer_testkit import RecordingHook, TinyLM, TokenDataset, make_config, make_loader

from speedtronic_trainer import CheckpointManager, MetricLogger, Trainer
from speedtronic_trainer.preemption import StopSignal

CHILD = textwrap.dedent("""
    import io, json, sys, time
    from pathlib import Path
    sys.path.insert(0, {kit!r})
    import torch
    from trainer_testkit import TinyLM, make_loader
    from speedtronic_trainer import CheckpointManager, MetricLogger, Trainer

    ready = Path({ready!r})

    def pace(event, payload):
        if event == "train_step":
            if payload["step"] == 2:
                ready.write_text("go")
            time.sleep(0.02)  # keep the run alive until the parent's signal lands

    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, make_loader(), device="cpu",
                      logger=MetricLogger(stream=io.StringIO(), hooks=[pace]),
                      checkpoint_manager=CheckpointManager({ckpt!r}, every_steps=1000))
    result = trainer.fit(1_000_000)
    print(json.dumps({{"steps": result.steps, "stopped_by": result.stopped_by,
                      "checkpoint": str(result.checkpoint)}}))
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_stops_cleanly(tmp_path, signum):
    ready = tmp_path / "ready"
    script = tmp_path / "child.py"
    script.write_text(
        CHILD.format(kit=str(Path(__file__).parent), ready=str(ready), ckpt=str(tmp_path / "ckpt"))
    )
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "child never reached step 2"
            time.sleep(0.05)
        child.send_signal(signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["stopped_by"] == signal.Signals(signum).name
    assert result["steps"] >= 2
    assert result["checkpoint"] == str(tmp_path / "ckpt" / f"step_{result['steps']}.pt")
    state = torch.load(result["checkpoint"], weights_only=True)
    assert state["step"] == result["steps"]


def test_stop_signal_restores_previous_handlers():
    before = signal.getsignal(signal.SIGTERM)
    calls = []  # on_signal: how a waiting DiLoCo coordinator learns of the stop
    with StopSignal(on_signal=lambda: calls.append(stop.received)) as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.received == "SIGTERM" and calls == ["SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_disabled_stop_signal_installs_nothing():
    before = signal.getsignal(signal.SIGINT)
    with StopSignal(enabled=False):
        assert signal.getsignal(signal.SIGINT) == before


def signalled_trainer(tmp_path, hook, config=None, eval_dataloader=None) -> Trainer:
    """Return a trainer whose metrics `hook` sends the signals, checkpointing under tmp_path."""
    model = TinyLM()
    return Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        config=config,
        logger=MetricLogger(stream=io.StringIO(), hooks=[hook]),
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=1000),
        eval_dataloader=eval_dataloader,
    )


@pytest.mark.parametrize("save_on_signal", [True, False])
def test_save_on_signal_false_leaves_sigint_to_python_as_20_did(tmp_path, save_on_signal):
    seen = []  # the SIGINT handler in force during the run

    def interrupt_at_step_2(event, payload):
        if event == "train_step" and payload["step"] == 2 and not seen:
            seen.append(signal.getsignal(signal.SIGINT))
            signal.raise_signal(signal.SIGINT)  # to this thread: handled before the hook returns

    config = make_config(checkpoint={"save_on_signal": save_on_signal})
    trainer = signalled_trainer(tmp_path, interrupt_at_step_2, config)
    # Python's own handler, as a plain script has it (a library earlier in this process may not).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if save_on_signal:
            result = trainer.fit(1_000)
            assert result.stopped_by == "SIGINT" and result.checkpoint == tmp_path / "step_2.pt"
            assert seen[0] is not signal.default_int_handler
        else:
            with pytest.raises(KeyboardInterrupt):
                trainer.fit(1_000)
            assert seen == [signal.default_int_handler]  # fit installed nothing
            assert trainer.step == 2 and not list(tmp_path.iterdir())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(params=[False, True])
def under_torchrun(request, monkeypatch) -> bool:
    """Run the test as a plain process, then as a worker torchrun's agent started."""
    if request.param:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    return request.param


def test_a_repeated_signal_exits_at_once_except_in_a_torchrun_worker(tmp_path, under_torchrun):
    # A scheduler signals every process; torchrun passes its own signal on: a worker hears it twice.

    def interrupt_twice_at_step_2(event, payload):
        if event == "train_step" and payload["step"] == 2:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

    trainer = signalled_trainer(tmp_path, interrupt_twice_at_step_2)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.getsignal(signal.SIGTERM)
    try:
        if under_torchrun:  # the same stop: checkpoint and return
            result = trainer.fit(1_000)
            assert result.stopped_by == "SIGINT" and result.checkpoint == tmp_path / "step_2.pt"
            # The repeat may also land after fit(), while the worker reports and exits.
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        else:  # the user really wants out: Python's own handler, at once
            with pytest.raises(KeyboardInterrupt):
                trainer.fit(1_000)
            assert trainer.step == 2 and not list(tmp_path.iterdir())
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


class FailingData(TokenDataset):
    """Samples that fail from the fifth on: the third step of batch 2 raises."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i >= 4:
            raise RuntimeError("the data went away")
        return super().__getitem__(i)


def test_a_failed_torchrun_worker_ignores_the_signals_while_it_reports(tmp_path, under_torchrun):
    # torchrun signals every worker once one fails: the failed one still has its line to print.
    model = TinyLM()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(FailingData()),
        device="cpu",
        logger=MetricLogger(stream=io.StringIO()),
        checkpoint_manager=CheckpointManager(tmp_path, every_steps=1000),
    )
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(RuntimeError, match="the data went away"):
            trainer.fit(1_000)
        assert trainer.step == 2
        if under_torchrun:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        else:  # a plain process gets its own handlers back: a signal now ends it
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


class SignallingEval:
    """Six validation batches a pass; this process receives `signum` as the `at`-th batch of the
    run is dealt.
    """

    def __init__(self, signum: int, at: int) -> None:
        self.signum, self.at, self.dealt = signum, at, 0

    def __iter__(self):
        for batch in make_loader(TokenDataset(n=12)):
            self.dealt += 1
            if self.dealt == self.at:
                signal.raise_signal(self.signum)
            yield batch


def test_a_signal_during_evaluation_cuts_it_short_and_stops_at_that_step(tmp_path):
    # A scheduler's grace period (30 s by default in Slurm and Kubernetes) may not outlast a
    # whole validation pass.
    evaluation, events = SignallingEval(signal.SIGTERM, at=2), RecordingHook()
    config = make_config(data={"eval_every": 2, "eval_steps": None})
    trainer = signalled_trainer(tmp_path, events.on_event, config, eval_dataloader=evaluation)
    result = trainer.fit(1_000)
    assert result.stopped_by == "SIGTERM" and result.steps == 2
    assert result.checkpoint == tmp_path / "step_2.pt"
    assert evaluation.dealt == 2  # of 6
    assert events.values("eval", "val_loss") == []  # a partial window's loss compares with none


def test_a_signal_during_the_last_evaluation_still_saves_the_last_step(tmp_path):
    # Ctrl-C to skip a long final pass kept nothing since the last periodic checkpoint.
    evaluation, events = SignallingEval(signal.SIGINT, at=8), RecordingHook()  # 2nd of pass 2
    config = make_config(data={"eval_every": 3, "eval_steps": None})
    trainer = signalled_trainer(tmp_path, events.on_event, config, eval_dataloader=evaluation)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = trainer.fit(4)  # evaluates at step 3, and at 4 as the run ends
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.stopped_by == "SIGINT" and result.steps == 4
    assert result.checkpoint == tmp_path / "step_4.pt"
    assert evaluation.dealt == 8
    assert events.values("eval", "step") == [3]
    assert "val_loss" not in result.metrics  # step 3's: not of the weights saved at step 4


@pytest.mark.parametrize("during", ["evaluation", "step"])
def test_a_stopped_run_reports_no_val_loss_of_weights_it_no_longer_has(tmp_path, during):
    # fit_end (and TrainResult.metrics) gave step 2's val_loss beside `step` 4 or 3, as if the
    # weights the run ended with had scored it; the model card read it so ("at step 4").
    events = RecordingHook()

    def stop_in_step_3(event, payload):
        events.on_event(event, payload)
        if during == "step" and event == "train_step" and payload["step"] == 3:
            signal.raise_signal(signal.SIGTERM)

    # Six batches a pass: the 8th is the second of step 4's pass.
    evaluation = SignallingEval(signal.SIGTERM, at=8 if during == "evaluation" else 0)
    config = make_config(data={"eval_every": 2, "eval_steps": None})
    trainer = signalled_trainer(tmp_path, stop_in_step_3, config, eval_dataloader=evaluation)
    result = trainer.fit(1_000)
    assert result.stopped_by == "SIGTERM" and result.steps == (4 if during == "evaluation" else 3)
    assert events.values("eval", "step") == [2]  # its val_loss stays in its own record
    assert "val_loss" not in result.metrics
    assert events.values("fit_end", "step") == [result.steps]
    assert events.values("fit_end", "val_loss") == []


def test_a_resume_runs_the_evaluation_a_signal_cut_short_and_trains_on_as_if_never_stopped(
    tmp_path,
):
    # The stopped run's checkpoint is of an evaluation step whose val_loss was never logged: the
    # uninterrupted run's curve has it, so the resumed one must too, with its random draws
    # (dropout here) left where the checkpoint had them.
    def trainer(folder, hook, evaluation):
        torch.manual_seed(0)
        model = TinyLM(dropout=0.5)
        return Trainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            make_loader(),
            device="cpu",
            config=make_config(data={"eval_every": 2, "eval_steps": None}),
            logger=MetricLogger(stream=io.StringIO(), hooks=[hook]),
            checkpoint_manager=CheckpointManager(folder, every_steps=1000),
            eval_dataloader=evaluation,
        )

    whole, first, resumed = RecordingHook(), RecordingHook(), RecordingHook()
    trainer(tmp_path / "a", whole.on_event, make_loader(TokenDataset(n=12))).fit(5)
    stopped = trainer(tmp_path / "b", first.on_event, SignallingEval(signal.SIGTERM, at=2)).fit(5)
    assert stopped.stopped_by == "SIGTERM" and stopped.checkpoint == tmp_path / "b" / "step_2.pt"
    torch.manual_seed(99)  # a new process would not share the first run's random state
    again = trainer(tmp_path / "b", resumed.on_event, make_loader(TokenDataset(n=12)))
    assert again.resume_latest()
    again.fit(5)
    assert first.values("eval", "step") == [] and resumed.values("eval", "step") == [2, 4, 5]
    assert resumed.values("eval", "val_loss") == whole.values("eval", "val_loss")
    losses = first.values("train_step", "loss") + resumed.values("train_step", "loss")
    assert losses == whole.values("train_step", "loss")
