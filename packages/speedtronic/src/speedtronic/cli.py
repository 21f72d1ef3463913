"""Command-line interface: `speedtronic train|validate|prepare|plot|sample|export ...`."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from speedtronic.errors import (
    BROKEN_PIPE_EXIT,
    PEER_FAILED,
    RUNTIME_ERROR,
    USAGE_ERROR,
    RunFailed,
    UsageError,
    peer_failed,
    print_line,
    signal_exit_code,
)
from speedtronic.group_exit import exit_process, hold_process_group
from speedtronic.launch import (
    add_launch_arguments,
    latest_checkpoint,
    launch,
    refuse_launch_flags_alone,
)
from speedtronic.launcher_watch import watch_launcher
from speedtronic.worker_exits import PEER, forget_earlier_exit, record_exit


class _Parser(argparse.ArgumentParser):
    """argparse with errors in one line (its own print the usage block first), exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Parse; an unrecognized argument is reported by its command's parser, so the line names
        the command (argparse leaves it to the top-level parser, which names none), with the
        closest flag of that command when one is near.
        """
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            parser = getattr(self, "commands", {}).get(getattr(parsed, "command", None), self)
            # Compared by name: the dashes every flag shares made `--lr` close to `--help`. A flag
            # typed whole was left over for standing after `--`, not mistyped.
            flags = {
                flag.lstrip("-"): flag
                for action in parser._actions
                for flag in action.option_strings
            }
            typed = [word.split("=", 1)[0] for word in extra if word.startswith("--")]
            close = [
                flags[match]
                for word in typed
                if word not in flags.values()
                for match in difflib.get_close_matches(word.lstrip("-"), flags, 1)
            ]
            hint = f"; did you mean {close[0]}?" if close else ""
            parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check, with the closest choice named (as Python 3.14's suggest_on_error)
        choices = [str(choice) for choice in action.choices or ()]
        close = difflib.get_close_matches(value, choices, 1) if isinstance(value, str) else []
        if close and value not in choices:
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}; did you mean {close[0]}?"
            )
        super()._check_value(action, value)


def _number(
    kind: type,
    low: float,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """Return an argparse type: `kind` within [low, high], either end open when asked."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high or value != value:  # NaN
            bounds = f"{'>' if low_open else '>='} {low}"
            if high is not None:
                bounds += f" and {'<' if high_open else '<='} {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


# sample's ranges: its argument types check them, its --help and docs/cli.md state them.
MAX_NEW_TOKENS = 2**24
MAX_TEMPERATURE = 1e6
MAX_SEED = 2**63 - 1  # torch.manual_seed's limit
# What sample and export take (speedtronic.artifacts.resolve_checkpoint).
CHECKPOINT_HELP = (
    "a step_<n>.pt or step_<n>.dcp, or a run's folder, its checkpoints folder or its latest file"
)


PARTS = (
    "speedtronic-config",
    "speedtronic-optim",
    "speedtronic-systems",
    "speedtronic-data",
    "speedtronic-model",
    "speedtronic-trainer",
    "speedtronic-diloco",
)


def version_text() -> str:
    """Return `speedtronic X (parts: speedtronic-config Y, ...)`: the meta-package continues the
    2.0 line, each part has its own version (README, Versions); all from installed metadata.
    """
    from importlib.metadata import PackageNotFoundError, version

    from speedtronic import __version__

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    return f"speedtronic {__version__} (parts: {', '.join(installed(p) for p in PARTS)})"


class _VersionAction(argparse.Action):
    """--version: print version_text() and exit 0 (computed only when asked for)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_text())
        parser.exit()


def _add_overrides(command: argparse.ArgumentParser) -> None:
    """Add the repeatable --set KEY=VALUE of the commands that load a config."""
    command.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set model.n_layer=6 (repeatable)",
    )


def _parser() -> argparse.ArgumentParser:
    from speedtronic.artifacts import sample_text

    parser = _Parser(prog="speedtronic", description="Fast, efficient LM training.")
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = commands.choices  # each command's parser, by name, for parse_args

    train = commands.add_parser("train", help="train from a YAML/JSON config")
    add_launch_arguments(train)
    train.add_argument("config", metavar="CONFIG", help="config file path (or inline YAML)")
    train.add_argument("--max-steps", type=int, metavar="N", help="absolute optimizer-step target")
    train.add_argument("--device", metavar="D", help="auto, cpu, cuda, cuda:N or mps")
    train.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    _add_overrides(train)
    train.add_argument(
        "--cuda-overlay",
        type=_path,
        metavar="FILE",
        help="YAML of key: value overrides applied (before --set) when the run lands on CUDA",
    )

    validate = commands.add_parser("validate", help="print the normalized, redacted config")
    validate.add_argument("config", metavar="CONFIG", help="config file path (or inline YAML)")
    _add_overrides(validate)

    prepare = commands.add_parser("prepare", help="tokenize text into train/val token shards")
    prepare.add_argument(
        "out_dir", type=_path, metavar="OUT_DIR", help="folder for the train/val shards"
    )
    prepare.add_argument(
        "texts",
        type=_path,
        nargs="*",
        metavar="INPUT",
        default=[],  # else argparse lists INPUT among the missing arguments
        help="UTF-8 text files, .parquet or .jsonl files, or `datasets` save_to_disk folders "
        "(default: the Python stdlib corpus)",
    )
    prepare.add_argument(
        "--tokenizer",
        type=_path,
        metavar="TOKENIZER_JSON",
        help="a Hugging Face tokenizers tokenizer.json, or a folder holding one "
        "(default: the byte tokenizer)",
    )
    prepare.add_argument(
        "--text-column",
        default="text",
        metavar="NAME",
        help="the text column of Parquet/JSONL/datasets inputs (default: %(default)s)",
    )
    prepare.add_argument(
        "--stdlib-bytes",
        type=_number(int, 0, low_open=True),
        default=8_000_000,
        metavar="N",
        help="size of the Python-stdlib corpus when no inputs are given, at least 1 "
        "(default: %(default)s)",
    )
    prepare.add_argument(
        "--val-fraction",
        type=_number(float, 0, 1, high_open=True),
        default=0.05,
        metavar="F",
        help="share of each input held out for validation, 0 <= F < 1 (default: %(default)s)",
    )

    plot = commands.add_parser("plot", help="plot loss, learning rate and tokens/s to a PNG")
    plot.add_argument(
        "metrics",
        type=_path,
        metavar="RUN_DIR_OR_JSONL",
        help="a run directory or its metrics.jsonl",
    )
    plot.add_argument(
        "-o",
        "--output",
        type=_path,
        metavar="OUT",
        help="image path, or a folder for loss_curve.png (default: beside the metrics file)",
    )

    # Any model with a generate() method samples, not only the reference transformer.
    sample = commands.add_parser("sample", help="generate text from a checkpoint")
    sample.add_argument("checkpoint", type=_path, metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    sample.add_argument(
        "--prompt", default="\n", metavar="TEXT", help="text to continue (default: a newline)"
    )
    defaults = sample_text.__kwdefaults__  # the API's defaults are the command's
    sample.add_argument(
        "--max-new-tokens",
        type=_number(int, 0, MAX_NEW_TOKENS),
        default=defaults["max_new_tokens"],
        metavar="N",
        help=f"tokens to generate, 0 to {MAX_NEW_TOKENS:,} (default: %(default)s)",
    )
    sample.add_argument(
        "--temperature",
        type=_number(float, 0.0, MAX_TEMPERATURE),
        default=defaults["temperature"],
        metavar="T",
        help=f"sampling temperature, 0 (greedy) to {MAX_TEMPERATURE:,.0f} (default: %(default)s)",
    )
    sample.add_argument(
        "--top-k",
        type=_number(int, 1),
        default=defaults["top_k"],
        metavar="K",
        help="sample from the K likeliest tokens, K >= 1 (default: all)",
    )
    sample.add_argument(
        "--seed",
        type=_number(int, 0, MAX_SEED),
        default=defaults["seed"],
        metavar="S",
        help="random seed, at least 0 (default: %(default)s)",
    )
    sample.add_argument(
        "--tokenizer",
        type=_path,
        metavar="T",
        help="bytes, a tokenizer.json or a folder holding one (default: the one recorded beside "
        "the run's shards)",
    )

    export = commands.add_parser(
        "export", help="write the model as safetensors, or as a transformers Llama folder"
    )
    export.add_argument("checkpoint", type=_path, metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    export.add_argument(
        "out_dir", type=_path, metavar="OUT_DIR", help="folder to write the export into"
    )
    export.add_argument(
        "--format",
        choices=("speedtronic", "hf"),
        default="speedtronic",
        help="speedtronic: model.safetensors + config.json; hf: a folder transformers loads",
    )
    export.add_argument(
        "--tokenizer",
        type=_path,
        metavar="T",
        help="hf: bytes, a tokenizer.json or a folder holding one (default: the one recorded "
        "beside the run's shards)",
    )
    export.add_argument(
        "--max-shard-size",
        type=_byte_size,
        metavar="SIZE",
        help="hf: split the weights into shards of at most SIZE (e.g. 2GB, 500MB; default 5GB)",
    )
    export.add_argument(
        "--push-to-hub", metavar="REPO", help="hf: upload the folder to REPO (OWNER/NAME)"
    )
    export.add_argument(
        "--private", action="store_true", help="with --push-to-hub: create REPO private"
    )
    return parser


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG]i?)?B?", re.IGNORECASE)
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}


def _path(text: str) -> str:
    """argparse type of a file or folder argument: an empty one is refused, where Path("") would
    read as the current folder (`prepare ''` wrote its shards there).
    """
    if not text:
        raise argparse.ArgumentTypeError("empty path; name a file or folder")
    return text


def _byte_size(text: str) -> int:
    """Return the bytes a size like 5GB, 500MB, 2GiB or 1048576 names (an argparse type)."""
    match = _SIZE.fullmatch(text.strip())
    size = int(float(match[1]) * _UNITS[(match[2] or "").upper()]) if match else 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 5GB, 500MB or 1048576")
    return size


def _load_config(source: Any, overrides: Sequence[str]):
    """Return the validated config of a path, inline text or already-read mapping, with
    overrides.
    """
    from speedtronic_config import SpeedtronicConfig, apply_overrides
    from speedtronic_config.loading import read_source

    return SpeedtronicConfig.from_dict(apply_overrides(read_source(source), list(overrides)))


def _cuda_overrides(path: str) -> list[str]:
    """Return a --cuda-overlay file's `key: value` pairs as `key=value` overrides."""
    from speedtronic_config import ConfigError
    from speedtronic_config.loading import read_file
    from speedtronic_config.overrides import override_value

    try:
        overlay = read_file(path)
    except ConfigError as error:  # "PATH: config file not found" read as the config's own
        raise UsageError(f"--cuda-overlay {_one_line(error)}") from None
    if not isinstance(overlay, dict) or not all(isinstance(key, str) for key in overlay):
        raise UsageError(
            f"--cuda-overlay {path}: expected a mapping of dotted keys to values, "
            "e.g. `model.n_layer: 8`"
        )
    return [f"{key}={override_value(value)}" for key, value in overlay.items()]


def _train_overrides(
    values: Any, args: argparse.Namespace, overlay: Sequence[str] = ()
) -> tuple[list[str], Path | None]:
    """Return the CUDA overlay's overrides, then --set, then --max-steps and --device, as config
    overrides (applied once), and the metrics file chosen for the run when logging.json_file is
    unset (else None). Both choices see the overlay: it may set the horizon, output or metrics.
    """
    from speedtronic_config.overrides import override_value

    overrides = [*overlay, *args.overrides]
    if args.device is not None:  # the flag's text as it is: `--device 0` is no YAML integer
        overrides.append(f"run.device={override_value(args.device)}")
    if args.max_steps is not None:
        overrides.append(f"run.max_steps={args.max_steps}")
    config = _load_config(values, overrides)  # once: neither decision below changes the other
    # 2.0's --max-steps also moved a set horizon; now only an unset one (docs/migrating.md).
    if args.max_steps is not None and config.scheduler.follows_target:
        overrides.append(f"scheduler.max_steps={args.max_steps}")
    metrics = None
    if config.logging.json_file is None:  # metrics live with the run: plot, export, card read them
        metrics = Path(config.run.output_dir) / "metrics.jsonl"
        overrides.append(f"logging.json_file={override_value(str(metrics))}")
    return overrides, metrics


def _train_config(args: argparse.Namespace, *, announce: bool = True) -> tuple[Any, Path | None]:
    """Return the run's config: the file with overrides, and the CUDA overlay on a CUDA device
    (said on stderr when `announce`); and the metrics file chosen for it (see _train_overrides).
    """
    from speedtronic_config import ConfigError
    from speedtronic_config.loading import read_source

    # Read once: the CUDA overlay applies to the same values. An empty file is every default, as
    # for validate (its None is no source _load_config can read again).
    values = read_source(args.config) or {}
    overrides, metrics = _train_overrides(values, args)
    config = _load_config(values, overrides)
    if not args.cuda_overlay:
        return config, metrics
    from speedtronic_systems import resolve_device

    # Validated on every machine, so a broken overlay fails on the laptop, not first on the cluster.
    overlay = _cuda_overrides(args.cuda_overlay)
    try:
        overlaid, overlaid_metrics = _train_overrides(values, args, overlay)
        overlaid_config = _load_config(values, overlaid)
    except ConfigError as error:  # the config loaded without the overlay: it is to blame
        raise UsageError(
            f"--cuda-overlay {_overlay_blame(args, values, overlay)}: {_one_line(error)}"
        ) from None
    if resolve_device(config.run.device).type != "cuda":
        return config, metrics
    if announce:
        print(f"speedtronic train: on CUDA, applying {args.cuda_overlay}", file=sys.stderr)
    return overlaid_config, overlaid_metrics


def _overlay_blame(args: argparse.Namespace, values: Any, overlay: Sequence[str]) -> str:
    """Name the --cuda-overlay file that broke a config, and the command line's overrides too
    when the overlay is fine without them (a clash: either side may be the one to change), or
    when the file needs them to load at all (then the overlay cannot be judged without them).
    """
    from speedtronic_config import ConfigError

    if not args.overrides and args.device is None and args.max_steps is None:
        return args.cuda_overlay

    def loads(overrides: Sequence[str]) -> bool:
        try:
            _load_config(values, overrides)
        except ConfigError:
            return False
        return True

    if not loads(overlay) and loads([]):  # the file loads alone, and the overlay breaks it
        return args.cuda_overlay
    return f"{args.cuda_overlay} with this command's --set/--max-steps/--device"


_TORCH = "torch"  # a test puts a module in its place that swallows a Ctrl-C, as torch's does


def _import_torch() -> None:
    """Import torch with Ctrl-C held until it is loaded, then raise KeyboardInterrupt for it. One
    raised inside the import was lost when torch's C init imports numpy (it clears any error that
    raises: the command ran to its end), and, raised in the code torch's modules run with exec,
    it has `python -m` end by SIGINT after its line, not exit 130. train, prepare, sample and
    export call this once their quick checks are done (a usage error stays quick).
    """
    from speedtronic_config.atomic import interrupts_held

    if _TORCH in sys.modules:
        return
    with interrupts_held():
        __import__(_TORCH)


def _cmd_train(args: argparse.Namespace) -> int:
    refuse_launch_flags_alone(args)
    if args.nproc_per_node is not None:
        from speedtronic_systems.parallel import torchrun_worker

        if not torchrun_worker():
            # This process becomes torchrun's launcher; a bad config fails here, once.
            return launch(args, args.argv, _train_config(args, announce=False)[0])
    announce = os.environ.get("RANK", "0") == "0"  # once per run
    from speedtronic_config import ConfigError
    from speedtronic_config.errors import on_every_rank

    try:
        config, metrics = _train_config(args, announce=announce)
    except (ConfigError, UsageError) as error:  # every worker reads the same arguments and files
        on_every_rank(error)
        raise
    if announce:
        _warn_synthetic_data(config)
        _warn_nothing_to_evaluate(config)
        _warn_unused_sources(config)
    _import_torch()
    from speedtronic.runtime import build_runtime, end_run

    # An explicit --max-steps is the target even when data.max_steps is set.
    trainer, _ = build_runtime(config, resume=args.resume, max_steps=args.max_steps)
    try:
        return _fit_and_report(trainer, config, metrics, args, announce)
    finally:
        end_run(trainer)  # the run's folders are free when train returns, in-process too


def _fit_and_report(
    trainer: Any, config: Any, metrics: Path | None, args: argparse.Namespace, announce: bool
) -> int:
    """Train the built run to its target and report it (see _cmd_train); return the exit code."""
    from speedtronic.report import print_run_summary
    from speedtronic.train_end import report_signal_stop, run_failed

    if announce and metrics is not None and trainer.step == 0:  # built, and not resumed
        # --resume continues that run only from a checkpoint of it, and had none if given.
        resumable = not args.resume and latest_checkpoint(config) is not None
        _set_aside_earlier_metrics(metrics, offer_resume=resumable)
    elif announce and metrics is not None:
        _set_aside_superseded_metrics(trainer, metrics)
    if trainer.parallel.mode != "none":
        hold_process_group(trainer)  # never destroyed here: see speedtronic.group_exit
    try:
        result = trainer.fit()
        # Every rank returns at the same step; leaving together keeps a rank that exits first
        # from cutting a peer's last gloo exchange (a finished run reported as failed).
        trainer.parallel.barrier()
    except Exception as error:
        raise run_failed(error, trainer, args) from error
    finally:
        trainer.close()
    if result.stopped_by is not None:  # preempted: no slow report, a distinct exit code
        return report_signal_stop(
            result,
            args,
            announce=trainer.parallel.is_main,
            target=trainer.max_steps,
            resumed=trainer.last_checkpoint,  # with nothing written: the one it resumed
        )
    if trainer.parallel.is_main:  # one summary for the whole group
        # This run's own checkpoint (written, or resumed from): the folder's `latest` may name a
        # corrupt file the resume fell back from, or an earlier run's.
        print_run_summary(config, result, trainer.last_checkpoint)
    return 0


def _set_aside_earlier_metrics(metrics: Path, *, offer_resume: bool) -> None:
    """Move an earlier run's records out of a fresh run's metrics file, to metrics-<time it was
    last written>.jsonl beside it, so the run's file, plot and model card hold this run alone;
    the line says so, offering --resume where it would continue that run (`offer_resume`).
    """
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return
    kept = _name_beside(metrics, "")
    # Copied, then emptied in place: the run's logger already holds the file open for appending
    # (a rename would carry its records along), and a failed copy leaves the records in place.
    shutil.copy2(metrics, kept)
    os.truncate(metrics, 0)
    resume = " (pass --resume to continue that run instead)" if offer_resume else ""
    print(
        f"speedtronic train: {metrics} held an earlier run's metrics; kept as {kept.name}{resume}",
        file=sys.stderr,
    )


def _set_aside_superseded_metrics(trainer: Any, metrics: Path) -> None:
    """Move the records of the steps after a resumed run's checkpoint (an earlier attempt's,
    which this run trains again) from its metrics file to metrics-superseded-<time it was last
    written>.jsonl beside it, so the file holds one record per step.
    """
    if not metrics.is_file():
        return
    kept = _name_beside(metrics, "superseded-")
    try:
        moved = trainer.logger.set_aside_records_after(trainer.step, kept)
    except OSError as error:  # the run can still train: the plot keeps the last record per step
        print(
            f"speedtronic train: warning: the records of the steps after {trainer.step} stay in "
            f"{metrics} ({error}); the records this run writes for them follow",
            file=sys.stderr,
        )
        return
    if moved:
        print(
            f"speedtronic train: resumed at step {trainer.step}; {metrics} held {moved} records of "
            f"the steps after it, moved to {kept.name}",
            file=sys.stderr,
        )


def _name_beside(metrics: Path, label: str) -> Path:
    """Return metrics-<label><time metrics was last written>.jsonl beside it, with -1, -2, ...
    after the time where that file exists: a file set aside is never overwritten.
    """
    stamp = label + time.strftime("%Y%m%d-%H%M%S", time.localtime(metrics.stat().st_mtime))
    kept, number = metrics.with_name(f"metrics-{stamp}.jsonl"), 0
    while kept.exists():
        number += 1
        kept = metrics.with_name(f"metrics-{stamp}-{number}.jsonl")
    return kept


def _warn_synthetic_data(config: Any) -> None:
    """Warn on stderr when the run falls back to synthetic random tokens although validation data
    is set: most likely a training path left out, and the run would learn nothing from it.
    """
    from speedtronic_config.sections import trains_on_synthetic

    data = config.data
    if not trains_on_synthetic(data):
        return
    held_out = [
        f"data.{name}" for name in ("val_shard_path", "val_text_path") if getattr(data, name)
    ]
    if held_out:
        print(
            f"speedtronic train: warning: training on synthetic random tokens although "
            f"{held_out[0]} is set; set data.shard_path (or data.text_path)",
            file=sys.stderr,
        )


def _warn_nothing_to_evaluate(config: Any) -> None:
    """Warn on stderr when data.eval_every is set without validation data: no evaluation would
    run, and the run would end without the validation loss it was set up to report.
    """
    data = config.data
    if data.eval_every is not None and not (data.val_shard_path or data.val_text_path):
        print(
            f"speedtronic train: warning: data.eval_every is {data.eval_every} but no validation "
            "data is set, so nothing is evaluated; set data.val_shard_path (or "
            "data.val_text_path), or data.eval_every=null",
            file=sys.stderr,
        )


def _warn_unused_sources(config: Any) -> None:
    """Warn on stderr when several training sources are set: the loader takes the first (as in
    2.0) and ignored the others silently.
    """
    from speedtronic_config.sections import TRAINING_SOURCES

    given = [f"data.{name}" for name in TRAINING_SOURCES if getattr(config.data, name) is not None]
    if len(given) > 1:
        print(
            f"speedtronic train: warning: training on {given[0]} alone; "
            f"{' and '.join(given[1:])} {'is' if len(given) == 2 else 'are'} set too, and "
            "ignored: remove what you do not mean to train on",
            file=sys.stderr,
        )


def _cmd_validate(args: argparse.Namespace) -> int:
    config = _load_config(args.config, args.overrides)
    print(config.to_yaml(redact_secrets=True), end="")
    if config.scheduler.follows_target:  # null in the file form; say what it comes to
        print(f"# scheduler.max_steps: null follows the step target, {config.step_target}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from speedtronic.corpus import prepare_corpus

    _import_torch()  # speedtronic_data's first import needs it
    prepare_corpus(
        Path(args.out_dir),  # created by prepare_shards once every argument is checked
        [Path(t) for t in args.texts],
        args.stdlib_bytes,
        args.val_fraction,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        text_column=args.text_column,
    )
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from speedtronic.plotting import plot_metrics

    print(plot_metrics(Path(args.metrics), args.output))  # a str: a trailing "/" means a folder
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from speedtronic.artifacts import sample_text
    from speedtronic.report import for_terminal

    _import_torch()
    # Escaped only for a terminal: redirected to a file or pipe, the text stays as generated.
    escape = for_terminal if sys.stdout.isatty() else str
    shown = False

    def show(piece: str) -> None:  # each piece as it is generated: Ctrl-C keeps what was shown
        nonlocal shown
        sys.stdout.write(escape(piece))
        sys.stdout.flush()
        shown = True

    try:
        sample_text(
            Path(args.checkpoint),
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            tokenizer=args.tokenizer,
            on_text=show,
        )
    finally:
        if shown:  # ends the line, also when interrupted, before the error line on stderr
            print()
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from speedtronic.artifacts import export_checkpoint, export_hf
    from speedtronic.hub_upload import check_repo_id, push_to_hub

    # An empty REPO is a mistyped one, refused as such, not read as no --push-to-hub.
    if args.private and args.push_to_hub is None:
        raise UsageError("--private applies to --push-to-hub REPO; add it or drop --private")
    if args.format != "hf":
        extra = [
            flag
            for flag, value in (
                ("--tokenizer", args.tokenizer),
                ("--max-shard-size", args.max_shard_size),
                ("--push-to-hub", args.push_to_hub),
            )
            if value is not None
        ]
        if extra:
            raise UsageError(f"{', '.join(extra)} need{'s' if len(extra) == 1 else ''} --format hf")
        _import_torch()
        with _output_folder(Path(args.out_dir), "OUT_DIR") as folder:
            print(export_checkpoint(Path(args.checkpoint), folder))
        return 0
    if args.push_to_hub is not None:
        check_repo_id(args.push_to_hub)  # before the export: nothing is written for a typo
    _import_torch()
    with _output_folder(Path(args.out_dir), "OUT_DIR") as folder:
        out = export_hf(
            Path(args.checkpoint),
            folder,
            tokenizer=args.tokenizer,
            max_shard_bytes=args.max_shard_size,
            repo_id=args.push_to_hub,
        )
    print(out)
    if args.push_to_hub is not None:
        print(push_to_hub(out, args.push_to_hub, private=args.private))
    return 0


COMMANDS = {
    "train": _cmd_train,
    "validate": _cmd_validate,
    "prepare": _cmd_prepare,
    "plot": _cmd_plot,
    "sample": _cmd_sample,
    "export": _cmd_export,
}


# Errors of the parts that are usage errors: a data file or setting found unusable before training
# started (during training it arrives as RunFailed), a device that is malformed or absent.
_USAGE_ERRORS = (
    ("speedtronic_data.errors", "DataError"),
    ("speedtronic_systems.precision", "DeviceError"),
    # A checkpoint written with other model or optimizer settings (not a damaged file).
    ("speedtronic_trainer.checkpoint_checks", "CheckpointMismatch"),
    ("speedtronic.run_lock", "RunFolderBusy"),  # another live run writes the same folder
    ("speedtronic_trainer.integrations", "HookUnavailable"),  # logging.hooks names a missing one
)


def _is_usage_error(error: BaseException) -> bool:
    """Return True for a part's error that is the user's to fix, like a missing file."""
    # Looked up, not imported: those modules import torch, which `validate` must never pay for.
    return any(
        isinstance(error, getattr(sys.modules[module], name))
        for module, name in _USAGE_ERRORS
        if module in sys.modules
    )


@contextlib.contextmanager
def _output_folder(path: Path, flag: str) -> Iterator[Path]:
    """Create and write-probe the folder a command writes into, UsageError naming it if it cannot
    be written (a file in the way, read-only, no permission); a command that then fails (a missing
    checkpoint, say) leaves no folder it created behind.
    """
    from speedtronic_config.atomic import (
        new_folders_removed_on_error,
        probe_folder,
        unwritable_reason,
    )

    with new_folders_removed_on_error(path):
        try:
            folder = probe_folder(path)
        except OSError as error:
            raise UsageError(
                f"{flag} {path}: cannot write there ({unwritable_reason(path, error)}); "
                "choose a writable folder"
            ) from None
        yield folder


def _one_line(error: BaseException) -> str:
    """Return an error's message as one line: its first non-empty line, marked when cut."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return lines[0] + (" [...]" if len(lines) > 1 else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 ok, 1 runtime failure, 2 usage or config error,
    128 + N when signal N stopped a training run after checkpointing it, 130 after Ctrl-C
    anywhere else, 141 when stdout's reader left early, as in `validate CONFIG | head`).
    """
    try:
        try:
            with _escaped_stdout():
                return _run(argv)
        finally:
            sys.stdout.flush()  # a reader gone since the last write shows here, not at exit
    except BrokenPipeError:
        return _stdout_reader_gone()


@contextlib.contextmanager
def _escaped_stdout() -> Iterator[None]:
    """Within the block, characters stdout's encoding lacks are written as \\xNN / \\uNNNN
    escapes, as Python writes stderr: a sample holds any character, and an ASCII or Windows
    code-page stdout (PYTHONIOENCODING, a redirect) raised UnicodeEncodeError after the work
    was done. A caller's strict stream gets its setting back.
    """
    stream = sys.stdout
    if getattr(stream, "errors", None) != "strict" or not hasattr(stream, "reconfigure"):
        yield
        return
    stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        stream.reconfigure(errors="strict")


def _stdout_reader_gone() -> int:
    """Return BROKEN_PIPE_EXIT, quietly, as Unix tools end when `| head` stops reading; stdout
    then goes to devnull so the interpreter's final flush of what is buffered cannot fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return BROKEN_PIPE_EXIT


def _run(argv: Sequence[str] | None) -> int:
    """Parse the arguments and run the command; return its exit code (see main)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv  # `train --nproc-per-node` hands the same arguments to torchrun's workers
    from speedtronic_config import ConfigError

    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:
        raise  # stdout's reader left: main ends quietly
    except (ConfigError, UsageError) as error:
        _report(args.command, _one_line(error), error)
        return USAGE_ERROR
    except KeyboardInterrupt as error:  # Ctrl-C outside the training loop (which checkpoints)
        _report(args.command, "interrupted", error)
        return signal_exit_code("SIGINT")  # as a shell reports it, and as 2.0 exited
    except Exception as error:  # a runtime failure: one line unless debugging was asked for
        if _is_usage_error(error):
            _report(args.command, _one_line(error), error)
            return USAGE_ERROR
        if os.environ.get("SPEEDTRONIC_DEBUG", "").strip().lower() not in {"", "0", "false", "no"}:
            raise
        if peer_failed(error):  # this rank's traceback says nothing of what failed
            run_failed = isinstance(error, RunFailed)  # else before or after the loop
            _report(args.command, _one_line(error) if run_failed else PEER_FAILED, error)
            record_exit(PEER)  # the launcher judges the group by the rank that failed
            return RUNTIME_ERROR
        what = _one_line(error)
        if not isinstance(error, RunFailed):
            what = f"{type(error).__name__}: {what}"
        _report(args.command, f"{what} (set SPEEDTRONIC_DEBUG=1 for the traceback)", error)
        return RUNTIME_ERROR


def _report(command: str, line: str, error: BaseException) -> None:
    """Print the error line of `command`. In a torchrun worker of a larger group, an error every
    rank raised alike is printed by rank 0 alone; any other line names its rank.
    """
    from speedtronic_config.errors import raised_on_every_rank

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        print_line(f"speedtronic {command}: {line}")
        return
    rank = int(os.environ.get("RANK", "0"))
    # Ctrl-C reaches every worker (torchrun passes its SIGINT on), but a SIGINT sent to one worker
    # reaches that one alone: it waits for rank 0's line only briefly.
    interrupted = isinstance(error, KeyboardInterrupt)
    every = raised_on_every_rank(error) or interrupted
    if rank == 0 and every:
        print_line(f"speedtronic {command}: {line}")
        _tell_the_group(line)
    elif not (
        every and _rank_zero_printed(line, INTERRUPT_WAIT if interrupted else RANK_ZERO_WAIT)
    ):
        print_line(f"speedtronic {command}: rank {rank}: {line}")


# How long a worker waits for rank 0 to print an error every rank raised before printing its own.
RANK_ZERO_WAIT = 60.0
INTERRUPT_WAIT = 5.0
_PRINTED = "error_printed"  # the agent store's key for the line rank 0 printed


def _group_store(wait: float = RANK_ZERO_WAIT) -> Any:
    """Return torchrun's agent store for this restart round (None without one), waiting at most
    `wait` seconds on any of its calls.
    """
    import datetime

    from speedtronic_systems.parallel import agent_store

    return agent_store(datetime.timedelta(seconds=wait))


def _tell_the_group(line: str) -> None:
    """Put the line rank 0 printed in torchrun's agent store, for the ranks waiting on it."""
    with contextlib.suppress(Exception):  # no store: the others print their own after the wait
        store = _group_store()
        if store is not None:
            store.set(_PRINTED, line)


def _rank_zero_printed(line: str, wait: float) -> bool:
    """Wait up to `wait` seconds until rank 0 has printed its line (a worker exiting first would
    have torchrun stop the group, rank 0 perhaps before its print); return True when that line is
    `line`.
    """
    try:
        store = _group_store(wait)
        if store is None:
            return False
        store.wait([_PRINTED])
        return store.get(_PRINTED).decode() == line
    except Exception:  # rank 0 never said (it failed otherwise): this rank speaks for itself
        return False


def main_entry() -> None:
    """Console-script entry point: exit with main()'s code (noted for a launcher that asked); a
    launcher's worker stops itself if the launcher is gone. The notes of this rank's processes in
    earlier restart rounds are removed first (see forget_earlier_exit).
    """
    forget_earlier_exit()
    watch_launcher()
    code = main()
    record_exit(code)
    exit_process(code)


__all__ = ["main", "main_entry"]
