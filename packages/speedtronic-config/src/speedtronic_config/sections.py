"""One dataclass per configuration section; each converts and validates its own fields."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from speedtronic_config.coerce import coerce, coerce_fields
from speedtronic_config.errors import ConfigError, choices_hint

DEFAULT_SCHEDULE_HORIZON = 1000
HOOK_NAMES = ("tensorboard", "wandb")
_NODE_ID = re.compile(r"[A-Za-z0-9_.-]+")
_BACKEND = re.compile(
    r"auto|gloo|nccl|mpi|((cpu|cuda):(gloo|nccl|mpi))(,(cpu|cuda):(gloo|nccl|mpi))*"
)
_REPO_PART = re.compile(r"[A-Za-z0-9_.-]+")
# A Hub repository id, as huggingface_hub.utils.validate_repo_id checks it (this package cannot
# import it; tests compare the two): NAME or NAMESPACE/NAME, each 1 to 96 of [A-Za-z0-9_.-] not
# starting or ending with '-' or '.', no '--' or '..', no '.git' ending.
_HUB_NAME = r"\w(?:[\w.-]{0,94}\w)?"
_HUB_REPO_ID = re.compile(rf"(?!.*(?:--|\.\.))(?!.*\.git$)(?:{_HUB_NAME}/)?{_HUB_NAME}", re.ASCII)

# Upper bounds: far beyond any real run, low enough that a typo (1e20 layers, a batch of 1e30)
# is refused here instead of hanging, exhausting memory or overflowing inside torch. Whether a
# valid size fits the machine is a separate check made before the model is built
# (speedtronic_systems.memory).
MAX_STEPS = 10**12  # step targets, intervals and horizons
MAX_VOCAB = 2**32  # token ids fit the uint32 shard format
MAX_SEQ_LEN = 2**24
MAX_LAYERS = 2**16
MAX_HEADS = 2**16
MAX_WIDTH = 2**24  # d_model, d_ff
MAX_BATCH = 2**24  # sequences in a micro-batch or an optimizer step
MAX_SAMPLES = 2**32  # synthetic samples (data.num_tokens)
MAX_WORKERS = 1024  # DataLoader worker processes and prefetched batches per worker
MAX_SECONDS = 1e8  # about three years: any longer wait or retry is a typo


def _check(ok: bool, path: str, problem: str, value: Any, allowed: str | None = None) -> None:
    if not ok:
        raise ConfigError(path, problem, value=value, allowed=allowed)


def _positive(section: Any, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        _check(value is None or value > 0, f"{section.SECTION}.{name}", "must be positive", value)


def _at_most(section: Any, limit: float, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        _check(
            value is None or value <= limit,
            f"{section.SECTION}.{name}",
            f"must be at most {limit:,}",
            value,
        )


def _not_blank(section: Any, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        _check(
            value is None or not isinstance(value, str) or bool(value.strip()),
            f"{section.SECTION}.{name}",
            "must not be empty or blank",
            value,
            "remove the key, or set it to null, to use the default",
        )


def check_choice(
    section: Any, name: str, choices: tuple[str, ...], path: str | None = None
) -> None:
    """Fold the field to lower case (`role: Master`, `optimizer: AdamW`) and check it is one of
    `choices`; `path` names a field outside a section (the root's `compile_mode`).
    """
    value = getattr(section, name)
    if isinstance(value, str):
        value = value.lower()
        setattr(section, name, value)
    _check(
        value in choices,
        path or f"{section.SECTION}.{name}",
        "unsupported value",
        value,
        choices_hint(value, choices),
    )


# YAML values (besides strings) that cannot name a dataset: data.dataset takes any other object.
_YAML_NON_PATHS = (bool, int, float, list, tuple, dict, set, bytes, datetime.date)


def derive(section: Any, name: str, value: Any) -> None:
    """Set an unset (None) field to `value`, worked out from another field; on a later check
    (validate() after an edit) it follows that field again while it still holds the value given
    here, as an unset schedule horizon follows the step target. A value set otherwise is kept.
    """
    derived = section.__dict__.setdefault("_derived", {})
    current = getattr(section, name)
    if current is None or (name in derived and current == derived[name]):
        setattr(section, name, value)
        derived[name] = value
    else:
        derived.pop(name, None)


def _seed(value: int | None, path: str) -> None:
    # NumPy seeds must fit in 32 unsigned bits; 2.0 accepted any int and failed later at seeding.
    _check(value is None or 0 <= value < 2**32, path, "must be in [0, 2**32)", value)


@dataclass
class RunConfig:
    """Run identity, device, step target and output root."""

    SECTION: ClassVar[str] = "run"
    name: str = "speedtronic-run"
    seed: int = 1234
    device: str = "auto"
    max_steps: int = 1000
    output_dir: str = "runs"
    log_every: int | None = None
    nonfinite_loss: str = "stop"
    # Refuse, before allocating, a run whose estimated memory exceeds the device's; the estimate
    # is rough, so this can be turned off.
    memory_check: bool = True
    # Host memory for CPU tensors: `caching` keeps freed memory in the process for the next step
    # instead of returning it to the OS (glibc malloc); `auto` does so when training on CPU.
    cpu_allocator: str = "auto"

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        _seed(self.seed, "run.seed")
        _positive(self, "max_steps", "log_every")
        _at_most(self, MAX_STEPS, "max_steps", "log_every")
        _not_blank(self, "name", "output_dir")
        _check(
            bool(self.device.strip()),
            "run.device",
            "must not be empty",
            self.device,
            "use auto, cpu, cuda, cuda:N or mps",
        )
        check_choice(self, "nonfinite_loss", ("stop", "skip"))
        check_choice(self, "cpu_allocator", ("auto", "caching", "default"))


@dataclass
class ModelConfig:
    """Reference-transformer shape; the registry key is checked when the model is built."""

    SECTION: ClassVar[str] = "model"
    # What a resumed run may change: none of these changes which weights a checkpoint holds or
    # how they are laid out (a longer context, a new RoPE base, dropout). Every other field must
    # match the checkpoint's; even where the shapes still fit (n_head), the weights would mean
    # something else.
    RESUMABLE: ClassVar[frozenset[str]] = frozenset(
        {
            "max_seq_len",
            "rope_base",
            "dropout",
            "gradient_checkpointing",
            "init_from",
            "loss_chunk_size",
        }
    )
    # The reference transformer's built-in names (speedtronic-model registers both): the checks
    # that know its shapes (config, memory estimate) apply to either.
    REFERENCE_NAMES: ClassVar[tuple[str, ...]] = ("reference_transformer", "gpt")
    name: str = "reference_transformer"
    vocab_size: int = 512
    max_seq_len: int = 128
    n_layer: int = 4
    n_head: int = 8
    n_kv_head: int | None = None
    d_model: int = 256
    d_ff: int | None = None
    dropout: float = 0.0
    tie_weights: bool = True
    rope_base: float = 10000.0
    gradient_checkpointing: bool = False
    init_from: str | None = None
    # Rows of the final hidden states per chunk of a fused head-and-loss: with labels, the
    # reference model never holds the (batch * seq, vocab) logits. None: one plain head (2.0).
    loss_chunk_size: int | None = None

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        _positive(
            self,
            "vocab_size",
            "max_seq_len",
            "n_layer",
            "n_head",
            "n_kv_head",
            "d_model",
            "d_ff",
            "loss_chunk_size",
        )
        _at_most(self, MAX_VOCAB, "vocab_size")
        _at_most(self, MAX_SEQ_LEN, "max_seq_len")
        _at_most(self, MAX_LAYERS, "n_layer")
        _at_most(self, MAX_HEADS, "n_head", "n_kv_head")
        _at_most(self, MAX_WIDTH, "d_model", "d_ff")
        _at_most(self, MAX_BATCH * MAX_SEQ_LEN, "loss_chunk_size")
        _not_blank(self, "name")
        derive(self, "n_kv_head", self.n_head)
        _check(
            self.n_head % self.n_kv_head == 0,
            "model.n_kv_head",
            f"must divide n_head={self.n_head}",
            self.n_kv_head,
        )
        _check(
            self.d_model % self.n_head == 0,
            "model.d_model",
            f"must be divisible by n_head={self.n_head}",
            self.d_model,
        )
        derive(self, "d_ff", 4 * self.d_model)
        _check(
            0.0 <= self.dropout < 1.0,
            "model.dropout",
            "must satisfy 0 <= dropout < 1",
            self.dropout,
        )
        # 2.0 did not check the rotary base; a base <= 1 makes every frequency 1 or undefined.
        _check(self.rope_base > 1.0, "model.rope_base", "must be greater than 1", self.rope_base)
        _check(
            self.init_from is None
            or (self.init_from.startswith("hf:") and bool(self.init_from[3:].strip())),
            "model.init_from",
            "must be hf:PATH, a local transformers Llama folder",
            self.init_from,
            "e.g. hf:exports/my-model, or null to start from random weights",
        )


@dataclass
class DataConfig:
    """Data source and batching; micro-batches accumulate to target_batch_size."""

    SECTION: ClassVar[str] = "data"
    text_path: str | None = None
    dataset: Any = None
    synthetic: bool = True
    num_tokens: int = 100000
    vocab_size: int | None = None
    block_size: int | None = None
    micro_batch_size: int = 1
    target_batch_size: int = 1
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    shuffle: bool = False
    drop_last: bool = True
    seed: int | None = None
    max_steps: int | None = None
    # 2.1 fields follow 2.0's, so a 2.0 call that passes fields by position still binds.
    shard_path: str | None = None
    val_shard_path: str | None = None
    val_text_path: str | None = None
    eval_every: int | None = None
    eval_steps: int | None = 20
    # data.dataset may name a torch.save'd Dataset: unpickling it runs any code the file holds.
    trust_pickle: bool = False

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        _positive(
            self,
            "num_tokens",
            "vocab_size",
            "block_size",
            "micro_batch_size",
            "target_batch_size",
            "prefetch_factor",
            "max_steps",
            "eval_every",
            "eval_steps",
        )
        _at_most(self, MAX_SAMPLES, "num_tokens")
        _at_most(self, MAX_VOCAB, "vocab_size")
        _at_most(self, MAX_SEQ_LEN, "block_size")
        _at_most(self, MAX_BATCH, "micro_batch_size", "target_batch_size")
        _at_most(self, MAX_WORKERS, "num_workers", "prefetch_factor")
        _at_most(self, MAX_STEPS, "max_steps", "eval_every", "eval_steps")
        if isinstance(self.dataset, str):  # Any-typed (it may hold a Dataset object): check here
            self.dataset = coerce(self.dataset, "str", "data.dataset")
        # What YAML makes of an unquoted name (2024, true) or a nested value is no path and no
        # Dataset: it passed here and failed in the loader as a TypeError naming no setting.
        _check(
            not isinstance(self.dataset, _YAML_NON_PATHS),
            "data.dataset",
            "expected a path (a torch.save'd Dataset or a .bin shard glob), or a Dataset object "
            "in Python",
            self.dataset,
            "quote a file name YAML reads as a number, boolean or date",
        )
        _not_blank(self, "shard_path", "val_shard_path", "text_path", "val_text_path", "dataset")
        _check(
            self.target_batch_size >= self.micro_batch_size,
            "data.target_batch_size",
            f"must be at least micro_batch_size={self.micro_batch_size}",
            self.target_batch_size,
            # The default target (1) trips everyone who raises only the micro-batch.
            "set data.target_batch_size to a multiple of it (the sequences per optimizer step)",
        )
        _check(
            self.target_batch_size % self.micro_batch_size == 0,
            "data.target_batch_size",
            f"must be divisible by micro_batch_size={self.micro_batch_size}",
            self.target_batch_size,
        )
        _check(self.num_workers >= 0, "data.num_workers", "must be non-negative", self.num_workers)
        _seed(self.seed, "data.seed")

    @property
    def accumulation_steps(self) -> int:
        """Return how many micro-batches make one optimizer step."""
        return self.target_batch_size // self.micro_batch_size


# The data section's training sources, in the order the loader takes the first one set.
TRAINING_SOURCES = ("shard_path", "text_path", "dataset")


def trains_on_synthetic(data: DataConfig | Mapping[str, Any]) -> bool:
    """Return whether a data section, or the saved form a checkpoint keeps, trains on synthetic.

    That is data.synthetic on and no shard_path, text_path or dataset, which come first.
    """
    get = data.get if isinstance(data, Mapping) else lambda name, default: getattr(data, name)
    return bool(get("synthetic", True)) and all(
        get(name, None) is None for name in TRAINING_SOURCES
    )


@dataclass
class OptimizerConfig:
    """AdamW or Muon (hidden matrices) with optional Muon+ normalization and cautious masking."""

    SECTION: ClassVar[str] = "optimizer"
    name: str = "adamw"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | None = None
    grad_clip: float | None = None
    muon_plus: bool = False
    cautious: bool = False
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5
    muon_norm_eps: float = 1e-8
    # Muon's AdamW branch (embeddings, head, norms, biases) at its own rate; None: `lr`, as in 2.0.
    adamw_lr: float | None = None

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        check_choice(self, "name", ("adamw", "muon"))
        _positive(self, "lr", "eps", "grad_clip", "muon_ns_steps", "muon_norm_eps", "adamw_lr")
        _at_most(self, 100, "muon_ns_steps")  # 5 is usual; each step is a few matmuls per matrix
        for index, beta in enumerate(self.betas):
            _check(0.0 <= beta < 1.0, f"optimizer.betas[{index}]", "must be in [0, 1)", beta)
        _check(
            self.weight_decay >= 0,
            "optimizer.weight_decay",
            "must be non-negative",
            self.weight_decay,
        )
        _check(
            not self.muon_plus or self.name == "muon",
            "optimizer.muon_plus",
            "requires optimizer.name: muon",
            self.muon_plus,
        )
        _check(
            self.adamw_lr is None or self.name == "muon",
            "optimizer.adamw_lr",
            "requires optimizer.name: muon (with adamw, lr sets every parameter's rate)",
            self.adamw_lr,
        )
        _check(
            0.0 <= self.muon_momentum < 1.0,
            "optimizer.muon_momentum",
            "must be in [0, 1)",
            self.muon_momentum,
        )


@dataclass
class SchedulerConfig:
    """Learning-rate schedule; an unset max_steps follows the run's step target."""

    SECTION: ClassVar[str] = "scheduler"
    name: str = "cosine"
    warmup_steps: int = 100
    # None means "follow the step target": the aggregate fills it; alone it is the 2.0 default 1000.
    max_steps: int | None = None
    min_lr_ratio: float = 0.1
    decay_ratio: float = 0.2

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "max_steps":  # set by the user (constructor included): no longer following
            self.__dict__["_auto_horizon"] = None
        super().__setattr__(name, value)

    def __post_init__(self) -> None:
        following = self.__dict__.get("_auto_horizon")
        coerce_fields(self, self.SECTION)
        self.__dict__["_auto_horizon"] = following  # converting a value is no user assignment
        check_choice(self, "name", ("cosine", "constant", "wsd"))
        _check(
            self.warmup_steps >= 0,
            "scheduler.warmup_steps",
            "must be non-negative",
            self.warmup_steps,
        )
        _positive(self, "max_steps")
        _at_most(self, MAX_STEPS, "warmup_steps", "max_steps")
        if self.max_steps is None:
            self._fill(DEFAULT_SCHEDULE_HORIZON)
        _check(
            0.0 <= self.min_lr_ratio <= 1.0,
            "scheduler.min_lr_ratio",
            "must be in [0, 1]",
            self.min_lr_ratio,
        )
        _check(
            0.0 < self.decay_ratio <= 1.0,
            "scheduler.decay_ratio",
            "must be in (0, 1]",
            self.decay_ratio,
        )

    @property
    def follows_target(self) -> bool:
        """Return True when max_steps was not set by the user and so tracks the run's step
        target.
        """
        following = self.__dict__.get("_auto_horizon")
        return following is not None and self.max_steps == following

    def follow_target(self, target: int) -> None:
        """Set an unset horizon to `target`; an explicit max_steps is kept."""
        if self.follows_target:
            self._fill(target)

    def _fill(self, horizon: int) -> None:
        """Set max_steps to a horizon worked out for it, still following the step target."""
        object.__setattr__(self, "max_steps", horizon)
        self.__dict__["_auto_horizon"] = horizon


@dataclass
class PrecisionConfig:
    """Requested numeric precision; an explicit mode wins over dtype."""

    SECTION: ClassVar[str] = "precision"
    mode: str = "auto"
    dtype: str | None = None

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        check_choice(self, "mode", ("auto", "bf16", "fp16", "fp32"))
        if self.dtype is not None:
            check_choice(self, "dtype", ("bf16", "fp16", "fp32"))


@dataclass
class CheckpointConfig:
    """Interval, final and on-signal checkpoint saving, retention and resume."""

    SECTION: ClassVar[str] = "checkpoint"
    enabled: bool = True
    directory: str = "checkpoints"
    every_steps: int = 500
    keep_last: int | None = 3
    resume: bool = False
    save_final: bool = True
    save_on_signal: bool = True

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        _positive(self, "every_steps", "keep_last")
        _at_most(self, MAX_STEPS, "every_steps", "keep_last")
        _check(
            bool(self.directory.strip()),
            "checkpoint.directory",
            "must not be empty",
            self.directory,
            "remove the key to use the default, checkpoints",
        )


@dataclass
class LoggingConfig:
    """Text/JSONL logging cadence, metric hooks and the progress bar."""

    SECTION: ClassVar[str] = "logging"
    level: str = "INFO"
    file: str | None = None
    every_steps: int = 1
    json_file: str | None = None
    hooks: list[str] = field(default_factory=list)
    progress: Any = None

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        self.level = self.level.upper()
        _positive(self, "every_steps")
        _at_most(self, MAX_STEPS, "every_steps")
        _not_blank(self, "file", "json_file")
        for index, hook in enumerate(self.hooks):
            _check(
                hook in HOOK_NAMES,
                f"logging.hooks[{index}]",
                "unknown hook",
                hook,
                choices_hint(hook, HOOK_NAMES, "choose from"),
            )
        _check(
            len(set(self.hooks)) == len(self.hooks),
            "logging.hooks",
            "lists a hook twice",
            self.hooks,
        )
        self.progress = _progress(self.progress)


def _progress(value: Any) -> bool | None:
    """Return None (auto: only on a terminal), True or False."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"auto", "true", "false"}:
        lowered = value.strip().lower()
        return None if lowered == "auto" else lowered == "true"
    raise ConfigError("logging.progress", "expected true, false, auto or null", value=value)


@dataclass
class ShapeValidationConfig:
    """Startup checks that model and batch dimensions suit the device's preferred alignment."""

    SECTION: ClassVar[str] = "shape_validation"
    enabled: bool = True
    alignment: int | str = "auto"
    check_batch: bool = True
    check_sequence: bool = True
    check_model: bool = True
    check_vocab: bool = False
    warn_on_cpu: bool = False

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)  # integral text ("32", "1e1") becomes the int
        if isinstance(self.alignment, str):
            _check(
                self.alignment.lower() == "auto",
                "shape_validation.alignment",
                "unsupported value",
                self.alignment,
                "use auto or a positive integer",
            )
            self.alignment = "auto"
        else:
            _positive(self, "alignment")
            _at_most(self, MAX_WIDTH, "alignment")


@dataclass
class ParallelConfig:
    """Data parallelism on torch.distributed: none (one process), DDP, or FSDP2 under torchrun."""

    SECTION: ClassVar[str] = "parallel"
    data_parallel: str = "none"
    backend: str = "auto"
    timeout_s: float = 1800.0
    fsdp_reshard_after_forward: bool = True
    fsdp_sync_each_microbatch: bool = True
    fsdp_param_dtype: str | None = None
    fsdp_reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        check_choice(self, "data_parallel", ("none", "ddp", "fsdp"))
        self.backend = self.backend.strip().lower()
        _check(
            bool(_BACKEND.fullmatch(self.backend)),
            "parallel.backend",
            "unsupported value",
            self.backend,
            "use auto, gloo, nccl, or per-device pairs such as cpu:gloo,cuda:nccl",
        )
        _positive(self, "timeout_s")
        _at_most(self, MAX_SECONDS, "timeout_s")
        for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
            if getattr(self, name) is not None:
                check_choice(self, name, ("bf16", "fp16", "fp32"))


@dataclass
class DistributedConfig:
    """DumbDiLoCo: roles, Hub or filesystem transport, outer optimizer and async upload lanes."""

    SECTION: ClassVar[str] = "distributed"
    enabled: bool = False
    mode: str = "dumb_diloco"
    role: str = "single"
    node_id: str | None = None
    collaborators: list[str] = field(default_factory=list)
    inner_steps: int = 500
    poll_interval: float = 60.0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    repo_id: str | None = None
    token: str | None = None
    cache_dir: str = ".speedtronic/hub"
    state_dir: str = ".speedtronic/diloco"
    retry_initial: float = 1.0
    retry_max: float = 60.0
    retry_attempts: int = 6
    reset_inner_optimizer: bool = True
    async_delta_upload: bool = True
    delta_upload_queue_size: int = 1
    delta_upload_overflow: str = "skip"
    delta_upload_shutdown_timeout: float = 5.0
    async_global_poll: bool = True
    # 2.1 fields follow 2.0's, so a 2.0 call that passes fields by position still binds.
    transport: str = "hub"
    endpoint: str | None = None
    # 2.0 never dropped, blocked or waited: these policies are opt-in (configs/diloco.yaml).
    staleness_limit: int | None = None
    max_local_rounds: int | None = None
    global_wait_timeout: float = 0.0
    # A shared folder keeps every version otherwise (transport: filesystem only).
    prune_after: float | None = 3600.0

    def __post_init__(self) -> None:
        coerce_fields(self, self.SECTION)
        # 2.0 names two ways to switch DiLoCo off with the section still present.
        check_choice(self, "mode", ("dumb_diloco", "disabled", "single"))
        check_choice(self, "role", ("single", "master", "worker"))
        check_choice(self, "transport", ("hub", "filesystem"))
        check_choice(self, "delta_upload_overflow", ("skip", "block"))
        if self.node_id is not None:
            _check(
                bool(_NODE_ID.fullmatch(self.node_id)) and self.node_id not in {".", ".."},
                "distributed.node_id",
                "must be path-safe",
                self.node_id,
                "use letters, digits, '_', '.', '-'",
            )
        _positive(
            self,
            "inner_steps",
            "poll_interval",
            "outer_lr",
            "retry_initial",
            "retry_attempts",
            "delta_upload_queue_size",
            "prune_after",
        )
        _at_most(self, MAX_STEPS, "inner_steps", "staleness_limit", "max_local_rounds")
        _at_most(self, 1000, "retry_attempts")
        _at_most(self, MAX_WORKERS, "delta_upload_queue_size")
        _at_most(
            self,
            MAX_SECONDS,
            "poll_interval",
            "retry_initial",
            "retry_max",
            "delta_upload_shutdown_timeout",
            "global_wait_timeout",
            "prune_after",
        )
        _not_blank(self, "endpoint", "cache_dir", "state_dir")
        if self.repo_id is not None:
            parts = self.repo_id.split("/")
            _check(
                all(_REPO_PART.fullmatch(p) and p not in {".", ".."} for p in parts),
                "distributed.repo_id",
                "must be a repository name such as my-org/run-1",
                self.repo_id,
                "use letters, digits, '_', '.', '-' and '/' between names (no '..', no leading "
                "'/'): with transport: filesystem it is a folder inside distributed.endpoint",
            )
            # huggingface_hub refuses any other id only when the node starts.
            _check(
                self.transport != "hub" or bool(_HUB_REPO_ID.fullmatch(self.repo_id)),
                "distributed.repo_id",
                "must be a Hub repository id, NAME or NAMESPACE/NAME, with transport: hub",
                self.repo_id,
                "each name 1-96 letters, digits, '_', '.', '-', not starting or ending with "
                "'-' or '.', no '--' or '..', no '.git' ending",
            )
        _check(
            self.transport != "hub"
            or self.endpoint is None
            or self.endpoint.startswith(("http://", "https://")),
            "distributed.endpoint",
            "must be an http:// or https:// URL with transport: hub",
            self.endpoint,
            "e.g. https://huggingface.co, or null for the Hub huggingface_hub is set up for",
        )
        _check(
            0.0 <= self.outer_momentum < 1.0,
            "distributed.outer_momentum",
            "must be in [0, 1)",
            self.outer_momentum,
        )
        _check(
            self.retry_max >= self.retry_initial,
            "distributed.retry_max",
            f"must be at least retry_initial={self.retry_initial}",
            self.retry_max,
        )
        for name in ("delta_upload_shutdown_timeout", "global_wait_timeout", "staleness_limit"):
            value = getattr(self, name)
            _check(
                value is None or value >= 0, f"distributed.{name}", "must be non-negative", value
            )
        _check(
            self.max_local_rounds is None or self.max_local_rounds >= 1,
            "distributed.max_local_rounds",
            "must be at least 1",
            self.max_local_rounds,
            "or null to never wait for a newer global model",
        )
        if self.active:
            _check(
                bool(self.repo_id),
                "distributed.repo_id",
                "is required when distributed.enabled is true",
                self.repo_id,
                "e.g. my-org/run-1",
            )
            _check(
                self.transport != "filesystem" or bool(self.endpoint),
                "distributed.endpoint",
                "must name a shared folder when transport is filesystem",
                self.endpoint,
            )

    @property
    def active(self) -> bool:
        """Return True when a DumbDiLoCo coordinator runs: enabled, and mode is dumb_diloco."""
        return self.enabled and self.mode == "dumb_diloco"

    def __repr__(self) -> str:
        # The token must never reach a log line, even through repr(config).
        shown = {spec.name: getattr(self, spec.name) for spec in fields(self)}  # not ClassVars
        if shown["token"] is not None:
            shown["token"] = "<redacted>"
        return "DistributedConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"
