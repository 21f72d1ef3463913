from __future__ import annotations

import datetime
from dataclasses import asdict

import pytest

from speedtronic_config import (
    CheckpointConfig,
    ConfigError,
    DataConfig,
    DistributedConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    ShapeValidationConfig,
)

# The 2.0 defaults plus the 2.1 additions (CHANGELOG).
DEFAULTS = {
    RunConfig: dict(
        name="speedtronic-run",
        seed=1234,
        device="auto",
        max_steps=1000,
        output_dir="runs",
        log_every=None,
        nonfinite_loss="stop",
        memory_check=True,
        cpu_allocator="auto",
    ),
    ModelConfig: dict(
        name="reference_transformer",
        vocab_size=512,
        max_seq_len=128,
        n_layer=4,
        n_head=8,
        n_kv_head=8,
        d_model=256,
        d_ff=1024,
        dropout=0.0,
        tie_weights=True,
        rope_base=10000.0,
        gradient_checkpointing=False,
        init_from=None,
        loss_chunk_size=None,
    ),
    DataConfig: dict(
        shard_path=None,
        val_shard_path=None,
        text_path=None,
        val_text_path=None,
        dataset=None,
        synthetic=True,
        num_tokens=100000,
        vocab_size=None,
        block_size=None,
        micro_batch_size=1,
        target_batch_size=1,
        num_workers=0,
        prefetch_factor=None,
        pin_memory=None,
        shuffle=False,
        drop_last=True,
        seed=None,
        max_steps=None,
        eval_every=None,
        eval_steps=20,
        trust_pickle=False,
    ),
    OptimizerConfig: dict(
        name="adamw",
        lr=0.0003,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        fused=None,
        grad_clip=None,
        muon_plus=False,
        cautious=False,
        muon_momentum=0.95,
        muon_ns_steps=5,
        muon_norm_eps=1e-8,
        adamw_lr=None,
    ),
    SchedulerConfig: dict(
        name="cosine", warmup_steps=100, max_steps=1000, min_lr_ratio=0.1, decay_ratio=0.2
    ),
    PrecisionConfig: dict(mode="auto", dtype=None),
    CheckpointConfig: dict(
        enabled=True,
        directory="checkpoints",
        every_steps=500,
        keep_last=3,
        resume=False,
        save_final=True,
        save_on_signal=True,
    ),
    LoggingConfig: dict(
        level="INFO", file=None, every_steps=1, json_file=None, hooks=[], progress=None
    ),
    ShapeValidationConfig: dict(
        enabled=True,
        alignment="auto",
        check_batch=True,
        check_sequence=True,
        check_model=True,
        check_vocab=False,
        warn_on_cpu=False,
    ),
    DistributedConfig: dict(
        enabled=False,
        mode="dumb_diloco",
        role="single",
        node_id=None,
        collaborators=[],
        inner_steps=500,
        poll_interval=60.0,
        outer_lr=0.7,
        outer_momentum=0.9,
        repo_id=None,
        transport="hub",
        endpoint=None,
        token=None,
        cache_dir=".speedtronic/hub",
        state_dir=".speedtronic/diloco",
        retry_initial=1.0,
        retry_max=60.0,
        retry_attempts=6,
        reset_inner_optimizer=True,
        async_delta_upload=True,
        delta_upload_queue_size=1,
        delta_upload_overflow="skip",
        delta_upload_shutdown_timeout=5.0,
        async_global_poll=True,
        staleness_limit=None,  # opt-in: 2.0 applied every delta
        max_local_rounds=None,  # opt-in: 2.0 never blocked a boundary
        global_wait_timeout=0.0,  # opt-in: 2.0 never waited
        prune_after=3600.0,  # the filesystem transport (new in 2.1) keeps an hour of versions
    ),
}


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda cls: cls.__name__)
def test_every_default(cls):
    assert asdict(cls()) == DEFAULTS[cls]


def test_default_lists_are_not_shared():
    first, second = LoggingConfig(), LoggingConfig()
    first.hooks.append("wandb")
    assert second.hooks == []


# (class, field values, dotted path in the error)
REJECTED = [
    (RunConfig, {"max_steps": 0}, "run.max_steps"),
    (RunConfig, {"log_every": 0}, "run.log_every"),
    (RunConfig, {"seed": -1}, "run.seed"),
    (RunConfig, {"seed": 2**32}, "run.seed"),
    (RunConfig, {"device": " "}, "run.device"),
    (RunConfig, {"nonfinite_loss": "ignore"}, "run.nonfinite_loss"),
    (RunConfig, {"cpu_allocator": "jemalloc"}, "run.cpu_allocator"),
    (RunConfig, {"name": 5}, "run.name"),
    (ModelConfig, {"vocab_size": 0}, "model.vocab_size"),
    (ModelConfig, {"max_seq_len": -1}, "model.max_seq_len"),
    (ModelConfig, {"n_layer": 0}, "model.n_layer"),
    (ModelConfig, {"n_head": 0}, "model.n_head"),
    (ModelConfig, {"n_kv_head": 0}, "model.n_kv_head"),
    (ModelConfig, {"n_kv_head": 3}, "model.n_kv_head"),
    (ModelConfig, {"d_model": 100}, "model.d_model"),
    (ModelConfig, {"d_ff": 0}, "model.d_ff"),
    (ModelConfig, {"dropout": 1.0}, "model.dropout"),
    (ModelConfig, {"dropout": -0.1}, "model.dropout"),
    (ModelConfig, {"rope_base": 1.0}, "model.rope_base"),
    (ModelConfig, {"tie_weights": "maybe"}, "model.tie_weights"),
    (ModelConfig, {"init_from": "exports/my-model"}, "model.init_from"),
    (ModelConfig, {"init_from": "hf: "}, "model.init_from"),
    (ModelConfig, {"init_from": 3}, "model.init_from"),
    (ModelConfig, {"loss_chunk_size": 0}, "model.loss_chunk_size"),
    (ModelConfig, {"loss_chunk_size": 2.5}, "model.loss_chunk_size"),
    (DataConfig, {"num_tokens": 0}, "data.num_tokens"),
    (DataConfig, {"vocab_size": 0}, "data.vocab_size"),
    (DataConfig, {"block_size": 0}, "data.block_size"),
    (DataConfig, {"micro_batch_size": 0}, "data.micro_batch_size"),
    (DataConfig, {"micro_batch_size": 4, "target_batch_size": 2}, "data.target_batch_size"),
    (DataConfig, {"micro_batch_size": 4, "target_batch_size": 6}, "data.target_batch_size"),
    (DataConfig, {"num_workers": -1}, "data.num_workers"),
    (DataConfig, {"prefetch_factor": 0}, "data.prefetch_factor"),
    (DataConfig, {"max_steps": 0}, "data.max_steps"),
    (DataConfig, {"eval_every": 0}, "data.eval_every"),
    (DataConfig, {"eval_steps": 0}, "data.eval_steps"),
    (DataConfig, {"seed": -5}, "data.seed"),
    (DataConfig, {"shard_path": 3}, "data.shard_path"),
    (DataConfig, {"pin_memory": "sometimes"}, "data.pin_memory"),
    (OptimizerConfig, {"name": "sgd"}, "optimizer.name"),
    (OptimizerConfig, {"lr": 0}, "optimizer.lr"),
    (OptimizerConfig, {"betas": (0.9, 1.0)}, "optimizer.betas[1]"),
    (OptimizerConfig, {"betas": (-0.1, 0.9)}, "optimizer.betas[0]"),
    (OptimizerConfig, {"betas": (0.9,)}, "optimizer.betas"),
    (OptimizerConfig, {"eps": 0}, "optimizer.eps"),
    (OptimizerConfig, {"weight_decay": -0.01}, "optimizer.weight_decay"),
    (OptimizerConfig, {"grad_clip": 0}, "optimizer.grad_clip"),
    (OptimizerConfig, {"muon_plus": True}, "optimizer.muon_plus"),
    (OptimizerConfig, {"name": "muon", "muon_momentum": 1.0}, "optimizer.muon_momentum"),
    (OptimizerConfig, {"name": "muon", "muon_ns_steps": 0}, "optimizer.muon_ns_steps"),
    (OptimizerConfig, {"name": "muon", "muon_norm_eps": 0}, "optimizer.muon_norm_eps"),
    (OptimizerConfig, {"name": "muon", "adamw_lr": 0}, "optimizer.adamw_lr"),
    (OptimizerConfig, {"name": "muon", "adamw_lr": "fast"}, "optimizer.adamw_lr"),
    (OptimizerConfig, {"adamw_lr": 0.01}, "optimizer.adamw_lr"),
    (SchedulerConfig, {"name": "linear"}, "scheduler.name"),
    (SchedulerConfig, {"warmup_steps": -1}, "scheduler.warmup_steps"),
    (SchedulerConfig, {"max_steps": 0}, "scheduler.max_steps"),
    (SchedulerConfig, {"min_lr_ratio": 1.5}, "scheduler.min_lr_ratio"),
    (SchedulerConfig, {"decay_ratio": 0.0}, "scheduler.decay_ratio"),
    (SchedulerConfig, {"decay_ratio": 1.1}, "scheduler.decay_ratio"),
    (PrecisionConfig, {"mode": "fp8"}, "precision.mode"),
    (PrecisionConfig, {"dtype": "int8"}, "precision.dtype"),
    (CheckpointConfig, {"every_steps": 0}, "checkpoint.every_steps"),
    (CheckpointConfig, {"keep_last": 0}, "checkpoint.keep_last"),
    (CheckpointConfig, {"directory": ""}, "checkpoint.directory"),
    (CheckpointConfig, {"save_final": "no"}, "checkpoint.save_final"),
    (LoggingConfig, {"every_steps": 0}, "logging.every_steps"),
    (LoggingConfig, {"hooks": ["mlflow"]}, "logging.hooks[0]"),
    (LoggingConfig, {"hooks": ["wandb", "wandb"]}, "logging.hooks"),
    (LoggingConfig, {"hooks": "wandb"}, "logging.hooks"),
    (LoggingConfig, {"progress": "sometimes"}, "logging.progress"),
    (LoggingConfig, {"progress": 1}, "logging.progress"),
    (ShapeValidationConfig, {"alignment": "big"}, "shape_validation.alignment"),
    (ShapeValidationConfig, {"alignment": 0}, "shape_validation.alignment"),
    (ShapeValidationConfig, {"check_vocab": "on"}, "shape_validation.check_vocab"),
    (DistributedConfig, {"mode": "ddp"}, "distributed.mode"),
    (DistributedConfig, {"role": "leader"}, "distributed.role"),
    (DistributedConfig, {"transport": "s3"}, "distributed.transport"),
    (DistributedConfig, {"node_id": "a/b"}, "distributed.node_id"),
    (DistributedConfig, {"node_id": ".."}, "distributed.node_id"),
    (DistributedConfig, {"collaborators": ["ok", 3]}, "distributed.collaborators[1]"),
    (DistributedConfig, {"inner_steps": 0}, "distributed.inner_steps"),
    (DistributedConfig, {"poll_interval": 0}, "distributed.poll_interval"),
    (DistributedConfig, {"outer_lr": 0}, "distributed.outer_lr"),
    (DistributedConfig, {"outer_momentum": 1.0}, "distributed.outer_momentum"),
    (DistributedConfig, {"retry_initial": 0}, "distributed.retry_initial"),
    (DistributedConfig, {"retry_initial": 5.0, "retry_max": 2.0}, "distributed.retry_max"),
    (DistributedConfig, {"retry_attempts": 0}, "distributed.retry_attempts"),
    (DistributedConfig, {"delta_upload_queue_size": 0}, "distributed.delta_upload_queue_size"),
    (DistributedConfig, {"delta_upload_overflow": "drop"}, "distributed.delta_upload_overflow"),
    (
        DistributedConfig,
        {"delta_upload_shutdown_timeout": -1},
        "distributed.delta_upload_shutdown_timeout",
    ),
    (DistributedConfig, {"staleness_limit": -1}, "distributed.staleness_limit"),
    (DistributedConfig, {"global_wait_timeout": -1}, "distributed.global_wait_timeout"),
    (DistributedConfig, {"prune_after": 0}, "distributed.prune_after"),
    (DistributedConfig, {"max_local_rounds": 0}, "distributed.max_local_rounds"),
    (DistributedConfig, {"enabled": True}, "distributed.repo_id"),
    (
        DistributedConfig,
        {"enabled": True, "repo_id": "org/run", "transport": "filesystem"},
        "distributed.endpoint",
    ),
    # Upper bounds: sizes a typo produces (#19: n_layer=1e20 hung, vocab_size=1e30 crashed torch)
    (RunConfig, {"max_steps": 10**12 + 1}, "run.max_steps"),
    (ModelConfig, {"n_layer": 10**20}, "model.n_layer"),
    (ModelConfig, {"vocab_size": 10**30}, "model.vocab_size"),
    (ModelConfig, {"max_seq_len": 2**24 + 1}, "model.max_seq_len"),
    (ModelConfig, {"n_head": 2**17, "d_model": 2**17}, "model.n_head"),
    (ModelConfig, {"d_model": 2**25, "n_head": 1}, "model.d_model"),
    (ModelConfig, {"d_ff": 2**25}, "model.d_ff"),
    (DataConfig, {"target_batch_size": 10**30}, "data.target_batch_size"),
    (DataConfig, {"micro_batch_size": 2**25, "target_batch_size": 2**25}, "data.micro_batch_size"),
    (DataConfig, {"num_workers": 2147483648}, "data.num_workers"),
    (DataConfig, {"prefetch_factor": 10**6}, "data.prefetch_factor"),
    (DataConfig, {"num_tokens": 2**40}, "data.num_tokens"),
    (DataConfig, {"eval_steps": 10**13}, "data.eval_steps"),
    (OptimizerConfig, {"name": "muon", "muon_ns_steps": 10**6}, "optimizer.muon_ns_steps"),
    (SchedulerConfig, {"warmup_steps": 10**13}, "scheduler.warmup_steps"),
    (CheckpointConfig, {"every_steps": 10**13}, "checkpoint.every_steps"),
    (LoggingConfig, {"every_steps": 10**13}, "logging.every_steps"),
    (ShapeValidationConfig, {"alignment": 2**30}, "shape_validation.alignment"),
    (DistributedConfig, {"retry_attempts": 10**6}, "distributed.retry_attempts"),
    (DistributedConfig, {"global_wait_timeout": 1e300}, "distributed.global_wait_timeout"),
    (DistributedConfig, {"prune_after": 1e300}, "distributed.prune_after"),
    (DistributedConfig, {"delta_upload_queue_size": 10**9}, "distributed.delta_upload_queue_size"),
    # empty, blank or NUL names and paths
    (RunConfig, {"name": " "}, "run.name"),
    (RunConfig, {"output_dir": ""}, "run.output_dir"),
    (RunConfig, {"output_dir": "runs/\x00x"}, "run.output_dir"),
    (ModelConfig, {"name": ""}, "model.name"),
    (DataConfig, {"shard_path": "  "}, "data.shard_path"),
    (DataConfig, {"text_path": "a\x00b"}, "data.text_path"),
    (DataConfig, {"dataset": ""}, "data.dataset"),
    (DataConfig, {"dataset": "d\x00.pt"}, "data.dataset"),
    # a YAML number, boolean, list, mapping or date is no path: train failed with a TypeError
    (DataConfig, {"dataset": 3}, "data.dataset"),
    (DataConfig, {"dataset": True}, "data.dataset"),
    (DataConfig, {"dataset": ["a.pt"]}, "data.dataset"),
    (DataConfig, {"dataset": {"path": "a.pt"}}, "data.dataset"),
    (DataConfig, {"dataset": datetime.date(2024, 6, 1)}, "data.dataset"),
    (CheckpointConfig, {"directory": "ck\x00"}, "checkpoint.directory"),
    (LoggingConfig, {"json_file": ""}, "logging.json_file"),
    (DistributedConfig, {"state_dir": " "}, "distributed.state_dir"),
    (DistributedConfig, {"endpoint": ""}, "distributed.endpoint"),
    # a Hub endpoint without its scheme retried a permanent error, then trained alone (exit 0)
    (DistributedConfig, {"endpoint": "not-a-url"}, "distributed.endpoint"),
    (DistributedConfig, {"endpoint": "localhost:8080"}, "distributed.endpoint"),
    # a repository name, never a path out of the filesystem transport's endpoint (#19)
    (DistributedConfig, {"repo_id": "../../x"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "/etc"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "org/"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "a b"}, "distributed.repo_id"),
    # a Hub id huggingface_hub refuses failed only when the node started
    (DistributedConfig, {"repo_id": "org/name/extra"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "org/my--run"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "org/run.git"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "-org/run"}, "distributed.repo_id"),
    (DistributedConfig, {"repo_id": "org/" + "r" * 97}, "distributed.repo_id"),
]


@pytest.mark.parametrize("cls, values, path", REJECTED, ids=lambda item: str(item))
def test_every_rule_rejects_with_the_dotted_path(cls, values, path):
    with pytest.raises(ConfigError) as caught:
        cls(**values)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")


ACCEPTED = [
    (RunConfig, {"max_steps": 1, "log_every": 1, "seed": 0, "nonfinite_loss": "skip"}),
    (RunConfig, {"cpu_allocator": "default"}),
    (RunConfig, {"cpu_allocator": "caching"}),
    (ModelConfig, {"n_head": 4, "n_kv_head": 1, "d_model": 64, "d_ff": 1, "dropout": 0.99}),
    (ModelConfig, {"init_from": "hf:exports/my-model"}),
    (ModelConfig, {"loss_chunk_size": 1}),
    (
        DataConfig,
        {
            "micro_batch_size": 4,
            "target_batch_size": 12,
            "num_workers": 2,
            "prefetch_factor": 1,
            "eval_every": 1,
            "eval_steps": None,
            "shard_path": "d/train_*.bin",
            "seed": 2**32 - 1,
        },
    ),
    (
        OptimizerConfig,
        {
            "name": "MUON",
            "muon_plus": True,
            "cautious": True,
            "betas": [0.0, 0.999],
            "weight_decay": 0,
            "grad_clip": 1.0,
            "fused": False,
            "adamw_lr": "3e-2",
        },
    ),
    (OptimizerConfig, {"name": "adamw", "cautious": True}),
    (SchedulerConfig, {"name": "wsd", "warmup_steps": 0, "min_lr_ratio": 1.0, "decay_ratio": 1.0}),
    (SchedulerConfig, {"name": "constant", "min_lr_ratio": 0.0}),
    (PrecisionConfig, {"mode": "BF16", "dtype": "FP16"}),
    (CheckpointConfig, {"keep_last": None, "every_steps": 1}),
    (LoggingConfig, {"level": "debug", "hooks": ["tensorboard", "wandb"], "progress": "auto"}),
    (ShapeValidationConfig, {"alignment": 64}),
    (ShapeValidationConfig, {"alignment": "AUTO"}),
    (
        DistributedConfig,
        {"enabled": True, "repo_id": "org/run", "role": "worker", "node_id": "w-1.a_b"},
    ),
    (
        DistributedConfig,
        {"enabled": True, "repo_id": "r", "transport": "filesystem", "endpoint": "/shared"},
    ),
    (DistributedConfig, {"enabled": True, "mode": "disabled"}),
    (DistributedConfig, {"staleness_limit": 2, "max_local_rounds": 4, "global_wait_timeout": 300}),
    (DistributedConfig, {"staleness_limit": 0, "retry_initial": 2.0, "retry_max": 2.0}),
    (DistributedConfig, {"transport": "filesystem", "prune_after": None}),
    # the upper bounds themselves
    (RunConfig, {"max_steps": 10**12}),
    (ModelConfig, {"n_layer": 2**16, "vocab_size": 2**32, "max_seq_len": 2**24}),
    (DataConfig, {"micro_batch_size": 2**24, "target_batch_size": 2**24, "num_workers": 1024}),
    (DistributedConfig, {"repo_id": "team.a/run_1-x", "global_wait_timeout": 1e8}),
    # a folder inside the endpoint: any depth (the Hub takes NAME or NAMESPACE/NAME)
    (DistributedConfig, {"repo_id": "team/project/run-1", "transport": "filesystem"}),
]


@pytest.mark.parametrize("cls, values", ACCEPTED, ids=lambda item: str(item))
def test_boundary_values_are_accepted(cls, values):
    cls(**values)


def test_derived_and_normalized_values():
    assert ModelConfig(n_head=4, d_model=64).n_kv_head == 4
    assert ModelConfig(d_model=64, n_head=4).d_ff == 256
    assert OptimizerConfig(name="MUON").name == "muon"
    assert PrecisionConfig(mode="BF16", dtype="FP16") == PrecisionConfig(mode="bf16", dtype="fp16")
    assert LoggingConfig(level="debug").level == "DEBUG"
    assert LoggingConfig(progress="auto").progress is None
    assert LoggingConfig(progress="False").progress is False
    assert ShapeValidationConfig(alignment="AUTO").alignment == "auto"
    assert DataConfig(micro_batch_size=4, target_batch_size=12).accumulation_steps == 3
    assert OptimizerConfig(betas=[0.8, 0.9]).betas == (0.8, 0.9)


def test_a_raised_micro_batch_alone_says_which_setting_to_raise_with_it():
    with pytest.raises(ConfigError) as caught:
        DataConfig(micro_batch_size=32)
    assert str(caught.value) == (
        "data.target_batch_size: must be at least micro_batch_size=32 (got 1); set "
        "data.target_batch_size to a multiple of it (the sequences per optimizer step)"
    )


def test_an_empty_checkpoint_folder_name_says_how_to_get_the_default():
    with pytest.raises(ConfigError) as caught:
        CheckpointConfig(directory=" ")
    assert str(caught.value) == (
        "checkpoint.directory: must not be empty (got ' '); remove the key to use the default, "
        "checkpoints"
    )


def test_quoted_booleans_are_read_as_booleans_in_sections():
    assert CheckpointConfig(enabled="false").enabled is False
    assert DistributedConfig(async_delta_upload="False").async_delta_upload is False
    assert ModelConfig(tie_weights="TRUE").tie_weights is True


def test_scheduler_tracks_whether_max_steps_was_given():
    unset = SchedulerConfig()
    assert unset.follows_target and unset.max_steps == 1000
    unset.follow_target(40)
    assert unset.max_steps == 40 and unset.follows_target
    explicit = SchedulerConfig(max_steps=1000)
    explicit.follow_target(40)
    assert explicit.max_steps == 1000 and not explicit.follows_target
    unset.max_steps = 7  # a user assignment after construction counts as explicit
    unset.follow_target(40)
    assert unset.max_steps == 7


def test_token_is_not_in_the_repr():
    text = repr(DistributedConfig(token="hf_secret_value"))
    assert "hf_secret_value" not in text and "token='<redacted>'" in text
    assert "token=None" in repr(DistributedConfig())


def test_the_distributed_repr_shows_fields_only():
    assert "SECTION" not in repr(DistributedConfig())  # a ClassVar, not a setting


# Every field that takes one of a fixed set of words: each folds case alike (`role: Master`
# was refused while `optimizer: AdamW` was accepted).
CHOICE_FIELDS = [
    (RunConfig, "nonfinite_loss", "skip"),
    (RunConfig, "cpu_allocator", "caching"),
    (OptimizerConfig, "name", "muon"),
    (SchedulerConfig, "name", "wsd"),
    (PrecisionConfig, "mode", "bf16"),
    (PrecisionConfig, "dtype", "fp16"),
    (ParallelConfig, "data_parallel", "ddp"),
    (ParallelConfig, "fsdp_param_dtype", "bf16"),
    (DistributedConfig, "mode", "disabled"),
    (DistributedConfig, "role", "master"),
    (DistributedConfig, "transport", "filesystem"),
    (DistributedConfig, "delta_upload_overflow", "block"),
]


@pytest.mark.parametrize(("cls", "name", "value"), CHOICE_FIELDS)
def test_every_choice_field_folds_case(cls, name, value):
    assert getattr(cls(**{name: value.capitalize()}), name) == value
    with pytest.raises(ConfigError, match=rf"{cls.SECTION}\.{name}: .*choose one of .*{value}"):
        cls(**{name: "nonsense"})
    # A near miss names the choice it misses first (it listed them all, the reader left to spot it).
    with pytest.raises(ConfigError, match=rf"did you mean {value}\? choose one of .*{value}"):
        cls(**{name: value[:-1] + "x" if len(value) > 4 else value + "x"})


def test_an_unknown_hook_names_the_closest():
    with pytest.raises(ConfigError) as caught:
        LoggingConfig(hooks=["tensorbord"])
    assert str(caught.value).endswith("did you mean tensorboard? choose from tensorboard, wandb")
    with pytest.raises(ConfigError) as caught:
        LoggingConfig(hooks=["mlflow"])
    assert str(caught.value).endswith("; choose from tensorboard, wandb")
