from __future__ import annotations

import importlib.util
import io

import pytest
import torch
from trainer_testkit import RecordingHook, TinyLM, make_loader

from speedtronic_trainer import (
    CheckpointManager,
    MetricLogger,
    TensorboardHook,
    Trainer,
    WandbHook,
    hooks_from_names,
)

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
NO_TENSORBOARD = "tensorboard not installed (pip install speedtronic-trainer[tensorboard])"


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B in offline mode for the test. wandb reads WANDB_MODE once per process, into the
    setup it keeps until teardown: torn down before (an earlier test's online setup) and after.
    """
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield wandb
    wandb.teardown()


def train_with(hook, steps=3):
    model = TinyLM()
    logger = MetricLogger(stream=io.StringIO(), hooks=[hook])
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        logger=logger,
    )
    trainer.fit(steps)
    logger.close()
    return trainer


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_tensorboard_hook_writes_event_files_that_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hook = TensorboardHook(str(tmp_path / "tb"))
    train_with(hook)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("train_step/loss")
    assert [e.step for e in losses] == [1, 2, 3]
    assert all(e.value > 0 for e in losses)
    assert "train_step/tokens_per_s" in events.Tags()["scalars"]
    assert "fit_end/tokens_per_s" in events.Tags()["scalars"]


@pytest.mark.skipif(
    not HAS_WANDB, reason="wandb not installed (pip install speedtronic-trainer[wandb])"
)
def test_wandb_hook_runs_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: list[float] = []

    class ReadBack(WandbHook):
        def on_event(self, event, payload):
            if event == "train_step":
                logged.append(payload["loss"])
            super().on_event(event, payload)

        def close(self):
            self.summary = dict(
                self.run.summary
            )  # what wandb itself recorded, before the run closes
            super().close()

    hook = ReadBack(project="speedtronic-test", mode="offline", dir=str(tmp_path))
    train_with(hook)
    assert len(logged) == 3
    # wandb commits a step's row when a later step arrives, so the summary holds step 2 or 3
    assert (
        hook.summary["_step"] in (2, 3)
        and hook.summary["train_step/loss"] == logged[hook.summary["_step"] - 1]
    )
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1 and list(run_dirs[0].glob("*.wandb"))


def test_missing_library_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_optional(name, *args, **kwargs):
        if name in {"wandb", "torch.utils.tensorboard"}:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optional)
    with pytest.raises(ImportError, match=r"speedtronic-trainer\[wandb\]"):
        WandbHook()
    with pytest.raises(ImportError, match=r"speedtronic-trainer\[tensorboard\]"):
        TensorboardHook()


def test_hooks_from_names_rejects_unknown_names():
    assert hooks_from_names([]) == []
    with pytest.raises(ValueError, match="unknown hook 'mlflow'"):
        hooks_from_names(["mlflow"])


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_hooks_from_names_builds_tensorboard_under_log_dir(tmp_path):
    (hook,) = hooks_from_names(["TensorBoard"], log_dir=str(tmp_path))
    assert isinstance(hook, TensorboardHook) and hook.log_dir == str(tmp_path / "tensorboard")
    hook.close()


def _with_stepless_events(hook, steps):
    """Deliver train_step records 1..steps, with three events that carry no step (DiLoCo's
    diloco/upload names its local_step) after step 2.
    """
    for step in range(1, steps + 1):
        hook.on_event("train_step", {"step": step, "loss": 1.0 / step})
        if step == 2:
            for _ in range(3):
                hook.on_event("diloco/upload", {"local_step": 2, "base_outer_step": 0})


@pytest.mark.skipif(
    not HAS_WANDB, reason="wandb not installed (pip install speedtronic-trainer[wandb])"
)
def test_wandb_events_without_a_step_do_not_drop_later_steps(tmp_path, monkeypatch):
    # Logged with step=None, each advanced wandb's own step: the next train_step records were
    # "less than the current step" and wandb dropped them (steps 3 and 4 here).
    monkeypatch.setenv("WANDB_SILENT", "true")
    hook = WandbHook(project="speedtronic-test", mode="offline", dir=str(tmp_path))
    _with_stepless_events(hook, 4)
    # wandb commits a step's row when a later step arrives: step 3's is the last committed.
    summary = dict(hook.run.summary)
    hook.close()
    assert summary["_step"] == 3 and summary["train_step/loss"] == pytest.approx(1 / 3)
    assert summary["diloco/upload/local_step"] == 2


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_tensorboard_events_without_a_step_go_at_the_latest_step(tmp_path):
    # add_scalar(global_step=None) wrote them at step 0, left of the whole run.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hook = TensorboardHook(str(tmp_path / "tb"))
    _with_stepless_events(hook, 3)
    hook.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("diloco/upload/local_step")] == [2, 2, 2]
    assert [e.step for e in events.Scalars("train_step/loss")] == [1, 2, 3]


def _trainer(checkpoints, *hooks):
    """A trainer that saves every 2 steps to `checkpoints` and logs every step to `hooks`."""
    model = TinyLM()
    return Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        logger=MetricLogger(stream=io.StringIO(), hooks=list(hooks)),
        checkpoint_manager=CheckpointManager(checkpoints, every_steps=2),
    )


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_a_resumed_run_replaces_the_later_steps_in_tensorboard(tmp_path):
    # A run resumed from its checkpoint of step 2 logged steps 3 and 4 again beside the crashed
    # attempt's: TensorBoard drew two points per step, the curve doubling back at step 2.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    crashed = _trainer(tmp_path / "ckpt", TensorboardHook(str(tmp_path / "tb")))
    crashed.fit(3)  # checkpoints step 2, logs 1-3, then stops as a crash would (step 3 is saved)
    crashed.logger.close()
    (tmp_path / "ckpt" / "step_3.pt").unlink()  # the crash came before step 3's checkpoint
    (tmp_path / "ckpt" / "latest").unlink()
    recorded = RecordingHook()
    resumed = _trainer(tmp_path / "ckpt", TensorboardHook(str(tmp_path / "tb")), recorded)
    assert resumed.resume_latest() and resumed.step == 2
    resumed.fit(4)
    resumed.logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("train_step/loss")
    assert [e.step for e in losses] == [1, 2, 3, 4]
    # Steps 3 and 4 are the resumed run's.
    assert [e.value for e in losses[2:]] == pytest.approx(recorded.values("train_step", "loss"))


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, wandb_offline):
    # A resumed run started a second W&B run (a new id): its curve began at the checkpoint's
    # step, apart from the one it continues.

    def run_id(resume):
        (hook,) = hooks_from_names(["wandb"], log_dir=str(tmp_path), resume=resume)
        hook.on_event("train_step", {"step": 1, "loss": 1.0})
        hook.close()
        return hook.run.id

    first = run_id(resume=False)
    assert run_id(resume=True) == first
    assert run_id(resume=False) != first  # a fresh run in the same folder is a new W&B run
    # Offline, each attempt has its folder; `wandb sync` uploads them to the one run.
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*/run-{first}.wandb"))) == 2
