"""build_runtime follows the documented construction order, and train_from_config trains."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import speedtronic.runtime as runtime
from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_config.errors import raised_on_every_rank

ORDER = [
    "seed",
    "device",
    "memory",
    "paths",
    "model",
    "data",
    "optimizer",
    "scheduler",
    "checkpoint",
    "logger",
    "coordinator",
    "trainer",
    "resume",
]


def small_config(tmp_path, **overrides):
    config = {
        "name": "order",
        "device": "cpu",
        "max_steps": 2,
        "output_dir": str(tmp_path),
        "model": {"vocab_size": 64, "max_seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
        "data": {"num_tokens": 32, "micro_batch_size": 2, "target_batch_size": 2},
        "precision": "fp32",
        "scheduler": {"warmup_steps": 1},  # over within the 2 steps (else a warning)
    }
    config.update(overrides)
    return config


def test_construction_order(tmp_path, monkeypatch):
    calls: list[str] = []

    def record(name, attribute):
        original = getattr(runtime, attribute)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(runtime, attribute, wrapper)

    record("seed", "seed_everything")
    record("device", "resolve_device")
    record("memory", "check_training_memory")
    record("paths", "check_output_paths")
    record("model", "build_model")
    record("data", "build_dataloader")
    record("optimizer", "build_optimizer")
    record("scheduler", "build_scheduler")
    record("checkpoint", "_checkpoint_manager")
    record("logger", "build_logger")
    record("coordinator", "build_coordinator")
    original_trainer = runtime.Trainer

    class RecordingTrainer(original_trainer):
        def __init__(self, *args, **kwargs):
            calls.append("trainer")
            super().__init__(*args, **kwargs)

        def resume_latest(self):
            calls.append("resume")
            return super().resume_latest()

    monkeypatch.setattr(runtime, "Trainer", RecordingTrainer)
    trainer, manager = runtime.build_runtime(small_config(tmp_path), resume=True)
    assert calls == ORDER
    assert manager.directory == tmp_path / "checkpoints"
    assert trainer.max_steps == 2


def test_train_from_config_reaches_the_target(tmp_path):
    result = runtime.train_from_config(small_config(tmp_path))
    assert result.steps == 2 and result.final_loss is not None
    # absolute target: a resumed run already at step 2 does nothing
    again = runtime.train_from_config(small_config(tmp_path), resume=True)
    assert again.final_loss is None


def test_each_train_from_config_call_finishes_its_own_wandb_run(tmp_path, wandb_offline):
    # The logger was never closed: the W&B run stayed active after train_from_config returned,
    # the next call's wandb.init returned it, and the second run's steps were dropped into it.
    for name in ("a", "b"):
        hooks = {"hooks": ["wandb"]}
        runtime.train_from_config(small_config(tmp_path / name, logging=hooks))
        assert wandb_offline.run is None  # finished when the call returned
        assert len(list((tmp_path / name / "wandb").glob("offline-run-*"))) == 1


def test_config_objects_are_validated_again(tmp_path):
    config = SpeedtronicConfig.from_dict(small_config(tmp_path))
    config.model.n_head = 3  # 16 is not divisible by 3
    with pytest.raises(ConfigError, match="n_head"):
        runtime.build_runtime(config)


def test_a_diloco_node_is_given_its_data_tokenizer_and_its_checkpoint_choice(
    tmp_path, byte_shards, monkeypatch
):
    # The coordinator refuses a global model of another tokenizer's data only when it knows its
    # own, and names the one fix for a used node id only when it knows whether a checkpoint is
    # there to resume (tests/speedtronic-diloco, tests/speedtronic/test_cli.py).
    monkeypatch.chdir(tmp_path)  # the node's default state_dir is relative
    data = {"shard_path": str(byte_shards / "train_*.bin"), "micro_batch_size": 2}
    config = small_config(
        tmp_path,
        data={**data, "target_batch_size": 2},
        model={"vocab_size": 256, "max_seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
        distributed={"enabled": True, "repo_id": "me/run"},
    )
    trainer, manager = runtime.build_runtime(config)
    assert trainer.coordinator.tokenizer == trainer.tokenizer
    assert trainer.tokenizer["kind"] == "bytes"
    assert trainer.coordinator._checkpoints == (manager.directory, None)
    runtime.end_run(trainer)


def test_enabled_distributed_without_the_package_names_it(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_diloco(name, *args, **kwargs):
        if name.startswith("speedtronic_diloco"):
            raise ImportError("No module named 'speedtronic_diloco'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_diloco)
    config = small_config(tmp_path, distributed={"enabled": True, "repo_id": "me/run"})
    with pytest.raises(ConfigError, match="pip install speedtronic-diloco"):
        runtime.build_runtime(config)


def test_init_from_loads_a_llama_folder_into_the_built_model(tmp_path):
    import torch

    from speedtronic_model import build_model, save_llama

    config = small_config(tmp_path)
    source = build_model(SpeedtronicConfig.from_dict(config).model)
    with torch.no_grad():
        for param in source.parameters():  # nothing like the seeded init of the run
            param.add_(1.0)
    save_llama(source, tmp_path / "hf")
    log = tmp_path / "train.log"
    trainer, _ = runtime.build_runtime(
        {
            **config,
            "model": {**config["model"], "init_from": f"hf:{tmp_path / 'hf'}"},
            "logging": {"file": str(log)},
        }
    )
    try:
        for ours, theirs in zip(trainer.model.parameters(), source.parameters(), strict=True):
            assert torch.equal(ours, theirs)
    finally:
        trainer.close()
    assert f"model.init_from: weights loaded from hf:{tmp_path / 'hf'}" in log.read_text()
    wider = {**config["model"], "n_layer": 2, "init_from": f"hf:{tmp_path / 'hf'}"}
    with pytest.raises(ConfigError, match="model.n_layer is 2 but the checkpoint has 1"):
        runtime.build_runtime({**config, "model": wider})


@pytest.mark.parametrize("warmup", [100, 2])
def test_a_warmup_the_run_never_finishes_is_named(tmp_path, warmup):
    log = tmp_path / "train.log"
    config = small_config(tmp_path, logging={"file": str(log)}, scheduler={"warmup_steps": warmup})
    trainer, _ = runtime.build_runtime(config)  # 2 steps: a warmup of 2 peaks at the last
    trainer.close()
    said = (
        "scheduler.warmup_steps is 100 but the run ends at step 2: the learning rate never "
        "reaches optimizer.lr; lower it (e.g. --set scheduler.warmup_steps=1)"
    ) in log.read_text()
    assert said == (warmup == 100)


@pytest.mark.parametrize(
    "model",
    [
        {},
        {"n_kv_head": 1, "tie_weights": False},
        {"d_ff": 40, "n_layer": 3, "vocab_size": 100},
    ],
)
def test_the_memory_estimate_counts_the_built_models_parameters(tmp_path, model):
    from speedtronic_model import build_model
    from speedtronic_systems.memory import reference_parameter_count

    base = small_config(tmp_path)
    config = SpeedtronicConfig.from_dict({**base, "model": {**base["model"], **model}})
    built = build_model(config.model)
    unique = {id(p): p.numel() for p in built.parameters()}
    assert reference_parameter_count(config.model)[0] == sum(unique.values())


def test_a_run_too_large_for_the_machine_is_refused_before_allocating(tmp_path):
    huge = small_config(tmp_path, model={"n_layer": 60000, "d_model": 4096, "n_head": 32})
    with pytest.raises(ConfigError, match="needs at least .* but cpu"):
        runtime.build_runtime(huge)


def test_temp_files_a_killed_save_left_are_removed_at_start_up(tmp_path):
    stale = tmp_path / "checkpoints" / ".step_4.pt.0a1b2c3d4e5f.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"x" * 1000)
    trainer, _ = runtime.build_runtime(small_config(tmp_path))
    trainer.close()
    assert not stale.exists()


def test_a_data_parallel_group_is_one_diloco_node_led_by_rank_0(tmp_path):
    import torch

    from speedtronic_systems.parallel import ParallelContext

    group = ParallelContext("ddp", rank=0, world_size=2)
    distributed = {"enabled": True, "repo_id": "me/run", "global_wait_timeout": 60}
    config = SpeedtronicConfig.from_dict(small_config(tmp_path, distributed=distributed))
    model = torch.nn.Linear(2, 2)
    coordinator = runtime.build_coordinator(config, model, runtime.build_logger(config), group)
    assert coordinator.group.parallel is group and coordinator.group.is_lead
    # The other ranks wait in a collective while rank 0 waits for a global model.
    config.parallel.timeout_s = 60
    with pytest.raises(ConfigError, match="parallel.timeout_s") as refused:
        runtime.build_coordinator(config, model, runtime.build_logger(config), group)
    # Every rank reads the same config: rank 0 prints the line once for the group, not each rank.
    assert raised_on_every_rank(refused.value)


@pytest.mark.parametrize(
    ("model", "fragment"),
    [({"name": "nosuch"}, "unknown model 'nosuch'"), ({"d_model": 12, "n_head": 4}, "even")],
)
def test_a_model_the_config_cannot_build_is_refused_once_for_every_rank(tmp_path, model, fragment):
    # Every rank builds the model from the same config: under torchrun rank 0 prints the line
    # once for the group, not each rank its own `rank R:` copy.
    model = {"vocab_size": 64, "max_seq_len": 16, "n_layer": 1, **model}
    with pytest.raises(ConfigError, match=fragment) as refused:
        runtime.build_runtime(small_config(tmp_path, model=model))
    assert raised_on_every_rank(refused.value)


def test_a_rerun_and_a_changed_lr_on_resume_are_each_named_in_one_warning(tmp_path):
    log = tmp_path / "train.log"

    def config(lr: float) -> dict:
        return small_config(tmp_path, optimizer={"lr": lr}, logging={"file": str(log)})

    runtime.train_from_config(config(1e-3))
    assert "WARNING" not in log.read_text()
    trainer, _ = runtime.build_runtime(config(2e-3), resume=True)
    assert trainer.scheduler.base_lrs == [1e-3]  # the checkpoint's schedule continues
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "optimizer.lr 0.002 is not applied on resume" in warnings[0]
    assert "checkpoint's 0.001" in warnings[0]
    runtime.build_runtime(config(1e-3))  # not resumed: it will replace step_2.pt
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert (
        len(warnings) == 2
        and "holds an earlier run's checkpoints (latest step_2.pt)" in (warnings[1])
    )


def test_a_resume_names_the_optimizer_settings_it_keeps_and_records_the_kept_rate(tmp_path):
    log = tmp_path / "train.log"

    def config(max_steps: int, **optimizer) -> dict:
        optimizer = {"name": "muon", "lr": 1e-3, **optimizer}
        return small_config(
            tmp_path, max_steps=max_steps, optimizer=optimizer, logging={"file": str(log)}
        )

    def warnings() -> list[str]:
        return [line for line in log.read_text().splitlines() if "WARNING" in line]

    runtime.train_from_config(config(2))
    # torch restores each group's hyperparameters with its state: a changed one is named.
    trainer, _ = runtime.build_runtime(
        config(4, weight_decay=0.5, muon_momentum=0.8, muon_ns_steps=3, lr=2e-3), resume=True
    )
    assert {group["weight_decay"] for group in trainer.optimizer.param_groups} == {0.1}
    (said,) = [line for line in warnings() if "optimizer settings not applied" in line]
    assert "optimizer settings not applied on resume, the checkpoint's continue" in said
    # Named as the user set them, not by Muon's parameter-group keys (momentum, ns_steps).
    kept = set(said.split("continue: ")[1].split("; ")[0].split(", "))
    assert kept == {
        "optimizer.weight_decay 0.5 (checkpoint: 0.1)",
        "optimizer.muon_momentum 0.8 (checkpoint: 0.95)",
        "optimizer.muon_ns_steps 3 (checkpoint: 5)",
    }
    trainer.fit()
    trainer.close()
    # Its checkpoints record the rate the schedule kept, so a resume with the run's own config
    # (lr 1e-3) says nothing; the settings the config asked for are its own again.
    count = len(warnings())
    runtime.build_runtime(config(4), resume=True)
    assert len(warnings()) == count, warnings()[count:]


def test_a_resume_that_moves_the_schedules_horizon_says_so(tmp_path):
    log = tmp_path / "train.log"

    def config(target: int, **scheduler) -> dict:
        return small_config(
            tmp_path,
            max_steps=target,
            scheduler={"warmup_steps": 1, **scheduler},
            logging={"file": str(log)},
        )

    runtime.train_from_config(config(2))
    runtime.build_runtime(config(2), resume=True)  # the same horizon: nothing to say
    assert "WARNING" not in log.read_text()
    # The horizon follows the step target: a later target stretches the schedule.
    runtime.build_runtime(config(4), resume=True)
    (warning,) = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert "the cosine schedule's horizon is 4 steps here but 2 in the checkpoint" in warning
    assert "from step 2" in warning and "set scheduler.max_steps=2" in warning
    runtime.build_runtime(config(4, max_steps=2), resume=True)  # the advice keeps it quiet
    assert len([line for line in log.read_text().splitlines() if "WARNING" in line]) == 1


@pytest.mark.parametrize(
    "scheduler",
    [
        {},  # the horizon follows the later target
        {"warmup_steps": 4, "max_steps": 8},
        {"name": "wsd", "decay_ratio": 0.5},
        {"name": "constant"},
    ],
)
def test_a_resumed_runs_first_step_takes_the_rate_its_new_schedule_gives(tmp_path, scheduler):
    from speedtronic_optim.schedules import lr_lambda

    def config(target: int, **changed) -> dict:
        return small_config(tmp_path, max_steps=target, scheduler={"warmup_steps": 1, **changed})

    runtime.train_from_config(config(2))
    trainer, _ = runtime.build_runtime(config(8, **scheduler), resume=True)
    # The optimizer state holds the rate the checkpoint's schedule set for step 3; the first
    # resumed update must run at the new schedule's rate, as every later one does.
    factor = lr_lambda(trainer.config.scheduler)(2)
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [
        base * factor for base in trainer.scheduler.base_lrs
    ]
    assert trainer.scheduler.get_last_lr() == [base * factor for base in trainer.scheduler.base_lrs]
    trainer.close()


def test_a_resume_at_a_target_below_its_checkpoint_warns_nothing_and_deletes_nothing(tmp_path):
    log = tmp_path / "train.log"
    config = small_config(
        tmp_path, max_steps=4, scheduler={"warmup_steps": 3}, logging={"file": str(log)}
    )
    runtime.train_from_config(config)
    folder = tmp_path / "checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    # A lowered target moves an unset horizon and falls inside the warmup, but no step trains.
    trainer, _ = runtime.build_runtime({**config, "max_steps": 2}, resume=True)
    result = trainer.fit()
    trainer.close()
    assert (result.steps, result.steps_run) == (4, 0)
    assert "WARNING" not in log.read_text(), log.read_text()
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    # A run that does train only inside its warmup is still told so.
    fresh = small_config(
        tmp_path / "fresh", max_steps=2, scheduler={"warmup_steps": 3}, logging={"file": str(log)}
    )
    runtime.build_runtime(fresh)[0].close()
    assert "scheduler.warmup_steps is 3 but the run ends at step 2" in log.read_text()


def test_a_changed_batch_or_window_on_resume_is_named_in_one_warning_each(tmp_path):
    log = tmp_path / "train.log"

    def config(**data) -> dict:
        data = {"num_tokens": 32, "micro_batch_size": 2, "target_batch_size": 2, **data}
        return small_config(tmp_path, data=data, logging={"file": str(log)})

    runtime.train_from_config(config())
    runtime.build_runtime(config(), resume=True)
    assert "WARNING" not in log.read_text()  # the same settings, resolved alike on both sides
    # The loader resumes at the saved sample at any micro batch size, and the target only groups
    # micro batches into steps: neither is named, the window is.
    runtime.build_runtime(
        config(micro_batch_size=1, target_batch_size=4, block_size=8), resume=True
    )
    (warning,) = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert "data.block_size is 8 here but 16 in the checkpoint" in warning
    assert "does not continue the data exactly where it stopped" in warning


def test_num_tokens_is_compared_on_resume_only_where_both_runs_train_on_synthetic_data(tmp_path):
    log = tmp_path / "train.log"
    text = tmp_path / "corpus.txt"
    text.write_text("abcdefgh" * 64)

    def config(**data) -> dict:
        data = {"micro_batch_size": 2, "target_batch_size": 2, **data}
        return small_config(tmp_path / "run", data=data, logging={"file": str(log)})

    runtime.train_from_config(config(num_tokens=32))
    # Text data now: its source is named, not the synthetic data's size (the default 100000).
    runtime.build_runtime(config(text_path=str(text)), resume=True)[0].close()
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert any("data.text_path is" in line for line in warnings), warnings
    assert not any("data.num_tokens" in line for line in warnings), warnings
    # Synthetic both times: another size is other samples.
    log.write_text("")
    runtime.build_runtime(config(num_tokens=64), resume=True)[0].close()
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert any("data.num_tokens is 64 here but 32 in the checkpoint" in x for x in warnings)


def test_a_changed_run_seed_on_resume_is_named_in_one_warning(tmp_path):
    log = tmp_path / "train.log"

    def config(seed: int) -> dict:
        data = {"num_tokens": 32, "micro_batch_size": 2, "target_batch_size": 2, "seed": 1234}
        return small_config(tmp_path, seed=seed, data=data, logging={"file": str(log)})

    runtime.train_from_config(config(1234))
    runtime.build_runtime(config(1234), resume=True)[0].close()
    assert "WARNING" not in log.read_text()
    # The checkpoint's random state is restored: the new seed draws nothing.
    runtime.build_runtime(config(7), resume=True)[0].close()
    (warning,) = [line for line in log.read_text().splitlines() if "WARNING" in line]
    assert "run.seed 7 is not applied on resume" in warning and "seeded with 1234" in warning


def bpe_config(tmp_path, **data) -> dict:
    """small_config with a vocabulary that holds the BPE tokenizer's ids, over the given data."""
    model = {"vocab_size": 300, "max_seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16}
    data = {"micro_batch_size": 2, "target_batch_size": 2, **data}
    return small_config(tmp_path, model=model, data=data)


def test_resuming_onto_data_of_another_tokenizer_is_refused(tmp_path, bpe_json):
    import torch
    from interop_testkit import prepare

    from speedtronic_trainer import CheckpointMismatch

    bpe = prepare(tmp_path / "bpe", bpe_json)
    runtime.train_from_config(bpe_config(tmp_path, shard_path=f"{bpe}/train_*.bin"))
    trainer, _ = runtime.build_runtime(
        bpe_config(tmp_path, shard_path=f"{bpe}/train_*.bin"), resume=True
    )
    assert trainer.step == 2  # the same tokenizer: resumed
    other = prepare(tmp_path / "bytes", None)
    refused = (
        "was trained on tokens of tokenizer.json (288 ids), but this run's data holds tokens of "
        "the byte tokenizer (256 ids); prepare the data with the checkpoint's tokenizer, or start "
        "a new run"
    )
    with pytest.raises(CheckpointMismatch, match=re.escape(refused)):  # --set data.shard_path=
        runtime.build_runtime(bpe_config(tmp_path, shard_path=f"{other}/train_*.bin"), resume=True)
    prepare(bpe, None)  # the run's own folder, prepared again with the byte tokenizer
    with pytest.raises(CheckpointMismatch, match=re.escape(refused)):
        runtime.build_runtime(bpe_config(tmp_path, shard_path=f"{bpe}/train_*.bin"), resume=True)
    saved = tmp_path / "checkpoints" / "step_2.pt"
    state = torch.load(saved, weights_only=True)
    del state["tokenizer"]  # as 2.0 wrote it: resumed without the check
    torch.save(state, saved)
    log = tmp_path / "train.log"
    config = bpe_config(tmp_path, shard_path=f"{bpe}/train_*.bin")
    trainer, _ = runtime.build_runtime({**config, "logging": {"file": str(log)}}, resume=True)
    assert trainer.step == 2
    # Other shards under the same setting: the saved data position means nothing, and says so.
    assert "its files (or data.block_size) changed since" in log.read_text()


def test_validation_data_is_held_to_the_training_tokenizer(tmp_path, bpe_json):
    from interop_testkit import prepare

    from speedtronic_data import DataError, JsonTokenizer

    bpe, byte = prepare(tmp_path / "bpe", bpe_json), prepare(tmp_path / "bytes", None)
    mixed = bpe_config(
        tmp_path, shard_path=f"{byte}/train_*.bin", val_shard_path=f"{bpe}/val_*.bin"
    )
    with pytest.raises(
        DataError,
        match=re.escape(
            "data.val_shard_path holds tokens of tokenizer.json (288 ids) but data.shard_path "
            "holds tokens of the byte tokenizer (256 ids)"
        ),
    ):
        runtime.build_runtime(mixed)
    glob = bpe_config(tmp_path, dataset=f"{bpe}/train_*.bin", val_shard_path=f"{byte}/val_*.bin")
    with pytest.raises(DataError, match="but data.dataset holds tokens of tokenizer.json"):
        runtime.build_runtime(glob)
    text = tmp_path / "val.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    trainer, _ = runtime.build_runtime(
        bpe_config(tmp_path, shard_path=f"{bpe}/train_*.bin", val_text_path=str(text))
    )
    assert isinstance(trainer.eval_dataloader.dataset.tokenizer, JsonTokenizer)
    assert trainer.tokenizer["kind"] == "tokenizers"


def test_muons_adamw_lr_trains_that_branch_and_a_changed_one_is_named_on_resume(tmp_path):
    log = tmp_path / "train.log"

    def config(adamw_lr: float | None) -> dict:
        optimizer = {"name": "muon", "lr": 1e-3, "adamw_lr": adamw_lr}
        return small_config(tmp_path, optimizer=optimizer, logging={"file": str(log)})

    runtime.train_from_config(config(1e-2))
    # The metrics name both rates, which the schedule moves alike.
    steps = [line for line in log.read_text().splitlines() if "train_step" in line]
    assert len(steps) == 2
    for line in steps:
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        assert float(fields["lr_adamw"]) == pytest.approx(10 * float(fields["lr"]))
    trainer, _ = runtime.build_runtime(config(1e-2), resume=True)
    assert trainer.scheduler.base_lrs == [1e-3, 1e-2]  # Muon's group, then AdamW's
    assert "WARNING" not in log.read_text()
    for changed, named in ((2e-2, "optimizer.adamw_lr 0.02"), (None, "optimizer.adamw_lr 0.001")):
        trainer, _ = runtime.build_runtime(config(changed), resume=True)
        assert trainer.scheduler.base_lrs == [1e-3, 1e-2]
        warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
        assert f"{named} is not applied on resume" in warnings[-1]
        assert "checkpoint's 0.01" in warnings[-1]
    assert len(warnings) == 2


def test_a_run_stopped_and_resumed_ends_with_the_uninterrupted_runs_weights(tmp_path):
    import torch

    text, val = tmp_path / "train.txt", tmp_path / "val.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 12)
    val.write_text("pack my box with five dozen liquor jugs. " * 4)

    def run(folder: str, target: int, resume: bool = False) -> list:
        # Muon and AdamW state, accumulation (2 micro batches a step), dropout, shuffled data, an
        # evaluation between steps and the schedule pinned while the step target moves.
        data = {"text_path": str(text), "val_text_path": str(val), "synthetic": False}
        data |= {"block_size": 8, "micro_batch_size": 1, "target_batch_size": 2}
        data |= {"shuffle": True, "eval_every": 2, "eval_steps": 1}
        config = small_config(
            tmp_path / folder,
            max_steps=target,
            model={"vocab_size": 256, "n_layer": 1, "n_head": 2, "d_model": 16, "dropout": 0.1},
            data=data,
            optimizer={"name": "muon", "lr": 1e-2, "adamw_lr": 3e-3},
            scheduler={"warmup_steps": 1, "max_steps": 4},
            checkpoint={"every_steps": 2},
        )
        trainer, _ = runtime.build_runtime(config, resume=resume)
        try:
            trainer.fit()
            return [p.detach().clone() for p in trainer.model.parameters()]
        finally:
            trainer.close()

    whole = run("whole", 4)
    run("split", 3)  # off-interval: a final evaluation, then a final checkpoint of step 3
    torch.manual_seed(1234)  # a new process would not share the first part's RNG state
    resumed = run("split", 4, resume=True)
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed, strict=True))


GROUP_AT_SHUTDOWN = """
import json, os, sys
import speedtronic.runtime as runtime

def threads():
    return len(os.listdir("/proc/self/task"))

real, seen = runtime.shutdown_parallel, {"before": threads()}

def shutdown_and_count(context):
    real(context)
    seen["after_shutdown"] = threads()

runtime.shutdown_parallel = shutdown_and_count
config = json.loads(sys.argv[1])
seen["steps"] = runtime.train_from_config(config).steps
print(json.dumps(seen))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_train_from_config_destroys_its_ddp_group_at_shutdown(tmp_path):
    # With the trainer (and DDP's reducer) still alive there, the group would be destroyed later,
    # by the reducer, holding the GIL while it joins gloo's threads: a deadlock waiting to happen.
    config = small_config(tmp_path, parallel={"data_parallel": "ddp"}, logging={"progress": False})
    launch = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launch} | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", GROUP_AT_SHUTDOWN, json.dumps(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["steps"] == 2 and seen["after_shutdown"] == seen["before"], seen


def test_a_run_that_saved_nothing_leaves_no_empty_checkpoint_folder(tmp_path):
    import gc

    import torch

    from speedtronic_trainer import NonFiniteLossError

    output = tmp_path / "run"
    (output / "logs").mkdir(parents=True)  # there before the run: kept, though empty
    config = small_config(output, logging={"json_file": str(output / "logs" / "m" / "x.jsonl")})
    trainer, manager = runtime.build_runtime(config)
    assert manager.directory.is_dir()  # made (and write-probed) before the first step
    with torch.no_grad():  # the first step's loss is NaN: stopped before any checkpoint
        for parameter in trainer.model.parameters():
            parameter.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    del trainer
    gc.collect()
    assert not manager.directory.exists()  # it left an empty checkpoints/ folder
    assert (output / "logs" / "m" / "x.jsonl").is_file() and (output / "logs").is_dir()


def test_the_hooks_get_the_config_the_checkpoints_record_without_its_secret(
    tmp_path, wandb_offline
):
    # W&B's run config was empty and TensorBoard had no settings: runs could not be filtered or
    # compared by a hyperparameter.
    pytest.importorskip("tensorboard")
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    from speedtronic_trainer import WandbHook

    secret = "hf_HOOK_secret_token"
    config = small_config(
        tmp_path,
        optimizer={"lr": 2e-3},
        distributed={"repo_id": "me/run", "token": secret},
        logging={"hooks": ["tensorboard", "wandb"]},
    )
    trainer, _ = runtime.build_runtime(config)
    trainer.fit()
    (wandb_hook,) = [hook for hook in trainer.logger.hooks if isinstance(hook, WandbHook)]
    logged = dict(wandb_hook.run.config)  # what the run's file records, before it closes
    trainer.close()
    runtime.end_run(trainer)
    recorded = torch.load(tmp_path / "checkpoints" / "step_2.pt", weights_only=True)["config"]
    assert recorded["optimizer"]["lr"] == 2e-3 and recorded["distributed"]["token"] is None
    # W&B: the recorded config, as nested sections (filtered as `optimizer.lr`). Not read back
    # from the offline run's file: wandb's service may still be writing it after finish() (once
    # 8 bytes beside a busy core).
    assert {name: logged[name] for name in recorded} == recorded
    # TensorBoard: each setting an hparam (the HParams dashboard), and the YAML as text.
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (start,) = [
        data.session_start_info.hparams
        for data in map(HParamsPluginData.FromString, events.PluginTagToContent("hparams").values())
        if data.HasField("session_start_info")
    ]
    assert start["optimizer.lr"].number_value == 2e-3
    assert start["model.name"].string_value == "reference_transformer"
    assert start["optimizer.betas"].string_value == "[0.9, 0.95]"
    assert start["checkpoint.enabled"].string_value == "true"  # was the number 1.0
    assert "distributed.token" not in start  # unset: null
    (text,) = events.Tensors("config/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert "    optimizer:\n" in shown and "      lr: 0.002\n" in shown
    # The token is in no file either hook wrote.
    for path in [*(tmp_path / "wandb").rglob("*"), *(tmp_path / "tensorboard").rglob("*")]:
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
