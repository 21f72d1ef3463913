"""Optional logging integrations (TensorBoard, Weights & Biases), imported only when constructed."""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

from speedtronic_config.serialize import dump_yaml


def _scalars(payload: dict[str, Any]) -> dict[str, float]:
    """Return the numeric entries of a payload; counters and strings are not plotted."""
    return {
        k: float(v)
        for k, v in payload.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and k != "step"
    }


def _step(payload: dict[str, Any]) -> int | None:
    """Return the payload's integer step, or None when it has none."""
    step = payload.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


# The scalars the HParams dashboard shows beside each run's settings.
HPARAM_METRICS = ("train_step/loss", "eval/val_loss")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Return a nested config as {"section.field": value}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _hparams(values: dict[str, Any]) -> dict[str, Any]:
    """Return a config as hparams: numbers and strings as they are, a bool as YAML's `true` or
    `false` (torch's hparams() would write it as the number 1 or 0), a list as its text
    (TensorBoard refuses lists); unset (null) fields are left out, blank in the dashboard.
    """
    return {name: _hparam(value) for name, value in _flatten(values).items() if value is not None}


def _hparam(value: Any) -> int | float | str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, (int, float, str)) else str(value)


class HookUnavailable(ImportError):
    """A hook cannot start for a reason the user fixes (its package is not installed, wandb is not
    logged in or cannot reach its server), so the CLI reports it as a usage error (exit 2). An
    ImportError: 2.0 raised one for a missing package.
    """


def _missing(package: str, extra: str) -> HookUnavailable:
    return HookUnavailable(
        f"{package} is not installed; install it with `pip install speedtronic-trainer[{extra}]` "
        f"or remove it from logging.hooks"
    )


class WandbHook:
    """Log every event's numeric fields to a Weights & Biases run (mode, dir, ... pass through to
    wandb.init).
    """

    def __init__(self, project: str | None = None, **settings: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise _missing("wandb", "wandb") from exc
        self._wandb = wandb
        root = settings.get("dir") or os.environ.get("WANDB_DIR") or "."  # where wandb writes
        earlier = _latest_wandb_run(root)
        try:
            self.run = wandb.init(project=project, **settings)
        except (wandb.errors.UsageError, wandb.errors.AuthenticationError) as exc:
            # No API key (or a malformed one) where wandb cannot prompt for one: the user's to fix.
            reason = " ".join(str(exc).split())  # wandb's message, on one line
            raise HookUnavailable(
                f"logging.hooks: wandb could not start a run ({reason}); run `wandb login` or set "
                "WANDB_API_KEY, set WANDB_MODE=offline to log without an account, or remove "
                "wandb from logging.hooks"
            ) from exc
        except wandb.errors.CommError as exc:
            # The server is out of reach (a wrong WANDB_BASE_URL, no network; wandb retried it for
            # init_timeout seconds) or refused the run. The first line names the server and why.
            reason = next(iter(str(exc).splitlines()), type(exc).__name__)
            attempt = _latest_wandb_run(root)
            if attempt is not None and attempt != earlier:
                # Kept, as wandb's own last line ("Find logs at") points at them at exit.
                reason += f"; wandb kept its logs in {attempt / 'logs'}"
            raise HookUnavailable(
                f"logging.hooks: wandb could not start a run on its server ({reason}); check "
                "WANDB_BASE_URL and the network, set WANDB_MODE=offline to log locally (upload "
                "later with `wandb sync`), or remove wandb from logging.hooks"
            ) from exc

    def log_config(self, values: dict[str, Any]) -> None:
        """Set the run's config (nested sections: W&B filters and compares runs by
        `optimizer.lr`); a resumed run's are replaced, as the resume may have changed some.
        """
        self.run.config.update(values, allow_val_change=True)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        """Log the payload's scalars under `<event>/<name>` at the payload's step, or into the
        latest step's row when it has none (DiLoCo's events).
        """
        scalars = {f"{event}/{k}": v for k, v in _scalars(payload).items()}
        step = _step(payload)
        if not scalars:
            return
        if step is None:
            # step=None would commit and advance wandb's own step past the trainer's, and wandb
            # drops every later record "less than the current step".
            self.run.log(scalars, commit=False)
        else:
            self.run.log(scalars, step=step)

    def close(self) -> None:
        """Finish the run, flushing offline files."""
        self.run.finish()


def _latest_wandb_run(log_dir: str) -> Path | None:
    """Return the folder of the latest W&B run under log_dir (where wandb's `latest-run` link
    points), or None when there is none.
    """
    link = Path(log_dir) / "wandb" / "latest-run"
    return link.resolve() if link.is_dir() else None


def _earlier_wandb_run(log_dir: str) -> dict[str, str]:
    """Return wandb.init settings that continue the latest W&B run under log_dir, or none when
    there is none. The id is read from the run's data file (`run-<id>.wandb`) in that run's
    folder: the folder's own name may carry a suffix (`-1`).
    """
    folder = _latest_wandb_run(log_dir)
    runs = sorted(folder.glob("run-*.wandb")) if folder is not None else []
    return {"id": runs[0].stem.removeprefix("run-"), "resume": "allow"} if runs else {}


class TensorboardHook:
    """Write every event's numeric fields as TensorBoard scalars under `<event>/<name>`."""

    def __init__(self, log_dir: str = "runs") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _missing("tensorboard", "tensorboard") from exc
        self.log_dir = str(log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir)
        self._step = 0  # the latest step seen: where events without one go (None would be 0)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        """Add the payload's scalars at the payload's step, or the latest step without one."""
        step = _step(payload)
        self._step = step = self._step if step is None else step
        for name, value in _scalars(payload).items():
            self.writer.add_scalar(f"{event}/{name}", value, global_step=step)

    def log_config(self, values: dict[str, Any]) -> None:
        """Write the config as hparams (the HParams dashboard compares runs by `optimizer.lr`,
        against their final loss) and as YAML text (the Text dashboard's `config`).
        """
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(_hparams(values), dict.fromkeys(HPARAM_METRICS, 0.0)):
            self.writer.file_writer.add_summary(summary)
        # Indented: a Markdown code block, so the YAML keeps its layout.
        text = "".join(f"    {line}\n" for line in dump_yaml(values).splitlines())
        self.writer.add_text("config", text, global_step=self._step)

    def resumed_at(self, step: int) -> None:
        """Mark a resume from the checkpoint of `step`: TensorBoard then drops the records of the
        later steps that an earlier attempt wrote to this folder, which this run logs again.
        """
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        start = Event(step=step + 1, session_log=SessionLog(status=SessionLog.START))
        self.writer.file_writer.add_event(start)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


_FACTORIES = {
    "tensorboard": lambda log_dir, _: TensorboardHook(str(Path(log_dir) / "tensorboard")),
    "wandb": lambda log_dir, resume: WandbHook(
        dir=str(log_dir), **(_earlier_wandb_run(log_dir) if resume else {})
    ),
}


def hooks_from_names(names: list[str], *, log_dir: str = "runs", resume: bool = False) -> list[Any]:
    """Build the hooks named in `logging.hooks` (tensorboard, wandb), with files under log_dir;
    `resume`: the run continues from a checkpoint there, and W&B continues its latest run.
    """
    hooks = []
    for name in names:
        factory = _FACTORIES.get(str(name).lower())
        if factory is None:
            raise ValueError(
                f"logging.hooks: unknown hook {name!r}; choose from {sorted(_FACTORIES)}"
            )
        hooks.append(factory(log_dir, resume))
    return hooks


__all__ = ["HookUnavailable", "TensorboardHook", "WandbHook", "hooks_from_names"]
