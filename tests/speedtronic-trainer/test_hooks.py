from __future__ import annotations

import io

import pytest
from trainer_testkit import RecordingHook

from speedtronic_trainer import CallbackList, MetricLogger, on_event


def test_on_event_wraps_a_function_as_a_hook_object():
    seen = []

    def record(event, payload):
        seen.append((event, payload["step"]))

    hook = on_event(record)
    MetricLogger(stream=io.StringIO(), hooks=[hook]).emit("train_step", {"step": 4})
    assert seen == [("train_step", 4)]


def test_failing_wrapped_function_is_named_in_the_warning():
    def flaky_sink(event, payload):
        raise OSError("disk full")

    stream = io.StringIO()
    MetricLogger(stream=stream, hooks=[on_event(flaky_sink)]).emit("eval", {"step": 1})
    assert "flaky_sink" in stream.getvalue() and "disk full" in stream.getvalue()


def test_on_event_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        on_event("not a function")


def test_callback_list_fans_out():
    a, b = RecordingHook(), RecordingHook()
    plain = []
    callbacks = CallbackList([a, b, lambda e, p: plain.append(e)])
    callbacks.on_event("eval", {"val_loss": 1.0})
    assert a.events == b.events == [("eval", {"val_loss": 1.0})] and plain == ["eval"]


def test_one_failing_callback_does_not_starve_the_others():
    class Offline:
        def on_event(self, event, payload):
            raise ConnectionError("wandb offline")

        def close(self):
            raise ConnectionError("wandb offline")

    class Closable(RecordingHook):
        closed = False

        def close(self):
            self.closed = True

    after = Closable()
    stream = io.StringIO()
    logger = MetricLogger(stream=stream, hooks=[CallbackList([Offline(), after])])
    logger.emit("train_step", {"step": 1})
    logger.close()
    assert after.events == [("train_step", {"step": 1})] and after.closed
    assert "wandb offline" in stream.getvalue()  # the failure is still reported and counted
    assert logger.hook_failures == {"CallbackList": 1}
