from __future__ import annotations

import io
import sys

import pytest

from speedtronic_trainer.progress import ProgressBar, progress_enabled


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_off_when_output_is_not_a_terminal():
    assert progress_enabled(None, io.StringIO()) is False
    assert progress_enabled(True, io.StringIO()) is False  # never draw a bar into a log file


def test_progress_in_a_terminal_unless_disabled():
    assert progress_enabled(None, FakeTerminal()) is True
    assert progress_enabled(True, FakeTerminal()) is True
    assert progress_enabled(False, FakeTerminal()) is False


def test_bar_shows_step_loss_and_throughput():
    terminal = FakeTerminal()
    bar = ProgressBar(total=10, initial=2, enabled=True, stream=terminal)
    assert bar.active
    bar.update(5, 1.2345, 1000.0)
    bar.close()
    text = terminal.getvalue()
    assert "5/10" in text and "loss=1.2345" in text and "tok_s=1,000" in text


def test_disabled_bar_is_a_no_op():
    bar = ProgressBar(total=10, initial=0, enabled=False)
    bar.update(3, None, 0.0)
    bar.close()
    assert not bar.active


def test_trainer_logs_plain_lines_when_not_a_terminal(capsys):
    import torch
    from trainer_testkit import TinyLM, make_loader

    from speedtronic_trainer import MetricLogger, Trainer

    model = TinyLM()
    stream = io.StringIO()
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(),
        device="cpu",
        logger=MetricLogger(stream=stream),
    ).fit(2)
    assert stream.getvalue().count("train_step") == 2
    err = capsys.readouterr().err
    assert "step/s" not in err and "s/step" not in err


def test_a_log_line_written_while_the_bar_is_drawn_starts_on_its_own_line():
    from speedtronic_trainer import MetricLogger

    terminal = FakeTerminal()
    bar = ProgressBar(total=10, initial=0, enabled=True, stream=terminal)
    bar.update(3, 1.5, 100.0)
    logger = MetricLogger(stream=terminal)
    logger.info("eval step=3 val_loss=1.4")
    bar.update(4, 1.4, 100.0)
    bar.close()
    text = terminal.getvalue()
    at = text.index(" INFO eval step=3")
    line_start = text.rfind("\n", 0, at) + 1
    before = text[line_start:at].split("\r")[-1]  # what a terminal shows before the line
    # Without lifting the bar, the line was appended to the bar's ("... tok_s=100]2026-...").
    assert before.strip() == "" or before[:4].isdigit(), repr(text[line_start : at + 30])
    assert "4/10" in text[at:]  # the bar is drawn again after the line


@pytest.mark.parametrize("stdout_is_terminal", [False, True])
def test_the_bar_replaces_the_step_lines_only_on_its_own_terminal(monkeypatch, stdout_is_terminal):
    # `speedtronic train ... > run.log` with stderr on a terminal: the bar drew on stderr and
    # run.log got no train_step line at all.
    import torch
    from trainer_testkit import TinyLM, make_loader

    from speedtronic_trainer import MetricLogger, Trainer

    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # where the bar draws
    stdout = terminal if stdout_is_terminal else io.StringIO()
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logger = MetricLogger(stream=stdout)
    Trainer(model, optimizer, make_loader(), device="cpu", logger=logger).fit(2)
    assert "2/2" in terminal.getvalue()  # the bar was drawn
    assert stdout.getvalue().count("train_step") == (0 if stdout_is_terminal else 2)
    assert logger.console_metrics  # given back after fit
