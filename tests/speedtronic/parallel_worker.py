"""A torchrun worker for the data-parallel tests: runs one scenario, writes what it saw.

    torchrun --nproc-per-node 2 tests/speedtronic/parallel_worker.py SCENARIO OUT_DIR MODE

Each rank writes OUT_DIR/rank<r>.json (and rank 0 the parameters it ended with, params_*.pt);
tests/speedtronic/test_parallel.py runs the scenarios and checks the files.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from speedtronic import runtime
from speedtronic.run_lock import LOCK_NAME, claim_run_folders
from speedtronic.train_end import run_failed
from speedtronic_config import SpeedtronicConfig
from speedtronic_config.errors import raised_on_every_rank
from speedtronic_systems.parallel import (
    SINGLE,
    ParallelContext,
    ParallelError,
    check_optimizer_after_wrapping,
    init_parallel,
    wrap_model,
)
from speedtronic_trainer import CheckpointManager, NonFiniteLossError, Trainer
from speedtronic_trainer.checkpoint_checks import CheckpointError

# The CUDA-marked tests run the same scenarios on GPUs (NCCL through backend auto).
DEVICE = os.environ.get("SPEEDTRONIC_TEST_DEVICE", "cpu")


def config(out: Path, mode: str, **sections) -> dict:
    """The tiny run every scenario trains: 2 microbatches of 2 per rank and step at world 2."""
    values = {
        "run": {"device": DEVICE, "max_steps": 3, "output_dir": str(out / "run"), "seed": 5},
        "model": {"vocab_size": 64, "max_seq_len": 16, "n_layer": 2, "n_head": 2, "d_model": 16},
        "data": {"num_tokens": 96, "micro_batch_size": 2, "target_batch_size": 8},
        # grad_clip far above the norm: the (global) gradient norm is logged, and a gradient
        # scaled wrongly across ranks shows there even though AdamW's update is scale-invariant.
        "optimizer": {"name": "adamw", "lr": 1e-3, "grad_clip": 1e9},
        "scheduler": {"warmup_steps": 1},
        "precision": "fp32",
        "checkpoint": {"every_steps": 2, "keep_last": None},
        "logging": {"progress": False, "json_file": str(out / "run" / "metrics.jsonl")},
        "parallel": {"data_parallel": mode},
    }
    for name, extra in sections.items():
        values[name] = {**values.get(name, {}), **extra}
    return values


def full_parameters(trainer) -> dict[str, torch.Tensor]:
    """Return the whole model's parameters on every rank (FSDP shards gathered), on the CPU:
    under NCCL they are compared with weights loaded there (torch.equal refuses two devices).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if trainer.parallel.mode == "fsdp":  # cpu_offload would keep them on rank 0 alone
        options = StateDictOptions(full_state_dict=True)
        return {k: v.cpu() for k, v in get_model_state_dict(trainer.model, options=options).items()}
    model = getattr(trainer.model, "module", trainer.model)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def first_batch_ids(trainer) -> list[int]:
    return trainer.dataloader.sampler and list(iter(trainer.dataloader.sampler))[:4]


def scenario_train(out: Path, mode: str) -> dict:
    """Train 3 steps (checkpoints at 2 and 3), then check resume is exact and the agreements."""
    trainer, manager = runtime.build_runtime(config(out, mode))
    rank = trainer.parallel.rank
    seen = {"indices": first_batch_ids(trainer), "torch_seed": torch.initial_seed()}
    trainer.evaluate()  # no eval loader: None on every rank, no collective mismatch
    result = trainer.fit()
    params = full_parameters(trainer)
    if rank == 0:
        torch.save(params, out / "params_train.pt")
    seen.update(steps=result.steps, tokens=result.tokens, checkpoint=str(result.checkpoint))
    seen["latest"] = str(manager.latest_path())
    # Exact resume: a fresh run to step 2, resumed from its checkpoint to 3, equals the above.
    resumed, _ = runtime.build_runtime(config(out / "resumed", mode))
    resumed.fit(2)  # the same schedule, stopped at the step-2 checkpoint
    again, _ = runtime.build_runtime(config(out / "resumed", mode), resume=True)
    seen["resumed_from"] = again.step
    again.fit()
    after = full_parameters(again)
    seen["resume_bit_equal"] = all(torch.equal(params[k], after[k]) for k in params)
    # A non-finite loss on one rank only: every rank skips the same step.
    skipping, _ = runtime.build_runtime(
        config(out / "skip", mode, run={"nonfinite_loss": "skip", "max_steps": 2})
    )
    original = skipping._forward
    calls = {"n": 0}

    def poisoned(batch):
        calls["n"] += 1
        loss = original(batch)
        return loss * float("nan") if rank == 1 and calls["n"] == 1 else loss

    skipping._forward = poisoned
    skipped = skipping.fit()
    seen.update(skipped=skipped.skipped_steps, skip_steps=skipped.steps)
    seen["ignored_loss"] = ignored_microbatch(out, mode)
    seen["eval_loss"] = evaluate_shares(out, mode)
    seen["eval_stop"] = stop_during_evaluation(out, mode)
    seen["failed_saves"] = failed_saves(out, mode)
    seen["nonfinite_stop"] = nonfinite_stop(out, mode)
    seen["split_precision"] = split_precision(out, mode)
    seen["resume_apart"] = resume_apart(out, mode)
    seen["empty_shares"] = empty_shares(out, mode)
    seen["memory_apart"] = memory_apart(out, mode)
    seen["init_tokenizer_apart"] = init_tokenizer_apart(out, mode)
    seen["refused_apart"] = refused_apart(out, mode)
    seen["init_from_other_copy"] = init_from_other_copy(out, mode)
    seen["compile_failed"] = compile_failed_on_first_use(out, mode)
    seen["compiled"] = compiled_difference(out, mode, params)
    seen["compile_apart"] = compile_apart(out, mode)
    seen["resume_other_copy"] = resume_other_copy(out, mode)
    if mode == "ddp":
        seen["own_loss"] = own_loss_step(trainer.parallel)
        seen["forward_buffer_sync"] = forward_buffer_sync(trainer)
        seen["stage_roots"] = stage_roots(trainer)
    if mode == "fsdp":
        seen["wrong_order_refused"] = wrong_order_is_refused(trainer)
        seen["read_alone"] = read_sharded_checkpoint_alone(trainer, params)
        seen["held_after_microbatch"] = gradients_between_microbatches(out)
        seen["failed_shard_write"] = failed_shard_write(out)
    return seen


def compiled_difference(out: Path, mode: str, eager: dict[str, torch.Tensor]) -> dict:
    """Train the same 3 steps through torch.compile (DDP's or FSDP2's wrapped model, 2
    microbatches a step); return whether it stayed compiled and its largest parameter difference
    from the eager run.
    """
    trainer, _ = runtime.build_runtime({**config(out / "compiled", mode), "compile": True})
    trainer.fit()
    params = full_parameters(trainer)
    # FSDP2 gathers the full parameters on rank 0 only: the others compare nothing (None).
    difference = max(((params[k] - eager[k]).abs().max().item() for k in eager), default=None)
    return {"stayed_compiled": trainer._compiled is not None, "max_difference": difference}


def read_sharded_checkpoint_alone(trainer, params: dict[str, torch.Tensor]) -> bool | None:
    """Let rank 0 alone rebuild the model from the last sharded checkpoint (as the CLI's end-of-run
    sample does while its peers leave); return whether it holds the trained parameters.
    """
    from speedtronic.artifacts import load_checkpoint_model

    same = None
    if trainer.parallel.is_main:
        model, _ = load_checkpoint_model(trainer.checkpoint_manager.latest_path())
        same = all(torch.equal(value, params[name]) for name, value in model.state_dict().items())
    torch.distributed.barrier()
    return same


def gradients_between_microbatches(out: Path) -> dict[str, list[str]]:
    """Return what FSDP2 holds as parameter gradients after the first of a step's two
    microbatches: by default, and with fsdp_sync_each_microbatch off (then trained 3 steps, and
    rank 0 saves the parameters).
    """
    held = {}
    for sync in (True, False):
        steps = 1 if sync else 3
        sections = {"parallel": {"fsdp_sync_each_microbatch": sync}, "run": {"max_steps": steps}}
        trainer, _ = runtime.build_runtime(config(out / f"sync_{sync}", "fsdp", **sections))
        held[str(sync)] = note_gradients_before_second_forward(trainer)
        trainer.fit()
        if not sync:
            params = full_parameters(trainer)
            if trainer.parallel.rank == 0:
                torch.save(params, out / "params_deferred_sync.pt")
    return held


def note_gradients_before_second_forward(trainer) -> list[str]:
    """Return a list the trainer fills, on its second forward (the first microbatch's backward
    has run), with the kinds of gradient its parameters hold.
    """
    kinds: list[str] = []
    original, calls = trainer._forward, 0

    def forward(batch):
        nonlocal calls
        calls += 1
        if calls == 2:
            kinds.extend(sorted({gradient_kind(p) for p in trainer.model.parameters()}))
        return original(batch)

    trainer._forward = forward
    return kinds


def gradient_kind(parameter: torch.Tensor) -> str:
    """Describe a sharded parameter's gradient: none, this rank's shard, or the whole tensor."""
    if parameter.grad is None:
        return "none"
    local = parameter.grad.to_local() if hasattr(parameter.grad, "to_local") else parameter.grad
    return "shard" if local.shape == parameter.to_local().shape else "whole"


def ignored_microbatch(out: Path, mode: str) -> float:
    """Train one step in which rank 1's second microbatch (samples 5 and 7) has every label
    ignored; rank 0 saves the parameters. Return the step's loss.
    """
    trainer, _ = runtime.build_runtime(config(out / "ignored", mode, run={"max_steps": 1}))
    ignore_labels(trainer, {2: slice(None)} if trainer.parallel.rank == 1 else {})
    loss = trainer.fit().final_loss
    params = full_parameters(trainer)
    if trainer.parallel.is_main:
        torch.save(params, out / "params_ignored.pt")
    return loss


class IgnoringStream:
    """The trainer's batch stream, with the labels of some rows of its n-th microbatch set to
    the ignore index.
    """

    def __init__(self, stream, rows_by_microbatch: dict[int, slice]) -> None:
        self.stream, self.rows, self.drawn = stream, rows_by_microbatch, 0

    def __next__(self):
        batch = next(self.stream)
        self.drawn += 1
        if self.drawn in self.rows:
            batch = {**batch, "labels": batch["labels"].clone()}
            batch["labels"][self.rows[self.drawn]] = -100
        return batch

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def ignore_labels(trainer, rows_by_microbatch: dict[int, slice]) -> None:
    """Ignore the labels of the given rows of the trainer's n-th microbatches (from 1)."""
    trainer._stream = IgnoringStream(trainer._stream, rows_by_microbatch)


class Regression(torch.nn.Module):
    """A model that computes its own loss from float targets: batches without token labels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Integer targets too: the trainer counts them as token labels (batches_apart).
        return torch.nn.functional.mse_loss(self.linear(inputs), targets.float())


def forward_buffer_sync(trainer) -> list[bool]:
    """Return whether DDP broadcasts buffers before every forward: for the reference model (its
    RoPE tables are not saved) and for a model with running statistics.
    """
    statistics = torch.nn.BatchNorm1d(2).to(trainer.device)
    wrapped = [trainer.model, wrap_model(statistics, trainer.parallel, {"data_parallel": "ddp"})]
    return [model.broadcast_buffers for model in wrapped]  # forward_sync_buffers from torch 2.13


def regression_trainer(
    context: ParallelContext, batches, settings: dict, **kwargs
) -> tuple[Trainer, torch.nn.Module]:
    """Return a Trainer of SGD (lr 0.1) on a Regression model wrapped for `context`, over
    `batches`, with `settings` over fp32, no checkpoints and no progress bar (kwargs: Trainer's),
    and the model.
    """
    # DDP wraps a module already on the rank's device (cuda:LOCAL_RANK under NCCL).
    model = wrap_model(Regression().to(context.device), context, {"data_parallel": context.mode})
    values = {
        "precision": "fp32",
        "checkpoint": {"enabled": False},
        "logging": {"progress": False},
        **settings,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, optimizer, batches, device=context.device, config=values, parallel=context, **kwargs
    )
    return trainer, model


def own_loss_step(context: ParallelContext = SINGLE) -> dict:
    """Train one SGD step on 8 samples (this rank's share, microbatches of 2) of a model whose
    batches have no token labels; return the step's loss and the weights it ended with.
    """
    torch.manual_seed(3)
    inputs, targets = torch.randn(8, 4), torch.randn(8, 1)
    share = 8 // context.world_size
    first = context.rank * share
    batches = [(inputs[i : i + 2], targets[i : i + 2]) for i in range(first, first + share, 2)]
    settings = {
        "data": {"micro_batch_size": 2, "target_batch_size": 8},
        "optimizer": {"grad_clip": 1e9},
    }
    trainer, model = regression_trainer(context, itertools.cycle(batches), settings)
    result = trainer.fit(1)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"loss": result.final_loss, "weights": weights}


def failed_saves(out: Path, mode: str) -> list[str]:
    """Return what each rank raised when rank 0 alone failed to write, then to commit, a
    checkpoint: every rank must raise, none may wait for the others or train on.
    """
    trainer, manager = runtime.build_runtime(config(out / "failed_saves", mode))
    raised = []
    write = "publish_sharded" if mode == "fsdp" else "write"  # FSDP2's staged folder
    for step, method in (("write", write), ("commit", "commit")):
        original = getattr(manager, method)
        if trainer.parallel.rank == 0:

            def failing(*args, step=step):
                raise CheckpointError(f"injected: {step} failed (No space left on device)")

            setattr(manager, method, failing)
        try:
            trainer._checkpoint(force=True)
            raised.append("nothing")
        except CheckpointError as error:
            raised.append(str(error))
        finally:
            setattr(manager, method, original)
    return raised


def nonfinite_stop(out: Path, mode: str) -> list:
    """Return the run's one-line failure when a non-finite loss on rank 1 alone stops it (policy
    stop), and whether it is marked as every rank's (rank 0 then prints it for the group).
    """
    stopping, _ = runtime.build_runtime(
        config(out / "nonfinite_stop", mode, run={"nonfinite_loss": "stop"})
    )
    original = stopping._forward

    def poisoned(batch):
        loss = original(batch)
        return loss * float("nan") if stopping.parallel.rank == 1 else loss

    stopping._forward = poisoned
    try:
        stopping.fit()
    except NonFiniteLossError as error:
        failed = run_failed(error, stopping, None)  # no checkpoint yet: no resume command
        return [str(failed), raised_on_every_rank(failed)]
    return ["nothing"]


def failed_shard_write(out: Path) -> list:
    """Return what each rank raised when rank 1 alone failed to write its DCP shards (a full
    disk), whether it is marked as every rank's, and whether the shards written are left.
    """
    import errno

    from torch.distributed.checkpoint import FileSystemWriter

    trainer, _ = runtime.build_runtime(config(out / "failed_shard_write", "fsdp"))
    original = FileSystemWriter.write_data

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if trainer.parallel.rank == 1:
        FileSystemWriter.write_data = full
    try:
        trainer._checkpoint(force=True)
        return ["nothing"]
    except CheckpointError as error:
        trainer.parallel.barrier()  # rank 0 has cleared what the save left
        left = trainer.checkpoint_manager.sharded_staging_for(trainer.step).exists()
        return [str(error), raised_on_every_rank(error), left]
    finally:
        FileSystemWriter.write_data = original


def evaluate_shares(out: Path, mode: str) -> list[float | None]:
    """Return the validation loss every rank agrees on (each evaluates its own share), the loss
    when rank 1's first batch has every label ignored (it still joins the forward), then the loss
    when rank 1 holds one batch more than rank 0 and when both hold rank 0's two.
    """
    from speedtronic_data import write_shard

    shard = out / "val_000000.bin"
    if int(os.environ["RANK"]) == 0:
        write_shard(shard, torch.arange(400) % 64)
    torch.distributed.barrier()
    trainer, _ = runtime.build_runtime(
        config(out / "eval", mode, data={"val_shard_path": str(shard), "eval_steps": 3})
    )
    whole = trainer.evaluate()
    batches = list(itertools.islice(trainer.eval_dataloader, 3))
    # A streamed split deals its last batch to one rank: every rank stops at the shortest share.
    trainer.eval_dataloader = batches[:2] if trainer.parallel.rank == 0 else batches
    uneven = trainer.evaluate()
    trainer.eval_dataloader = batches[:2]
    even = trainer.evaluate()
    if trainer.parallel.rank == 1:
        batches[0] = {**batches[0], "labels": torch.full_like(batches[0]["labels"], -100)}
    trainer.eval_dataloader = batches
    return [whole, trainer.evaluate(), uneven, even]


class SignalOnSecondBatch:
    """An eval loader that has this process receive SIGTERM as it deals its second batch (when
    `send`), counting the batches it dealt.
    """

    def __init__(self, loader, send: bool) -> None:
        self.loader, self.send, self.dealt = loader, send, 0

    def __iter__(self):
        for batch in self.loader:
            self.dealt += 1
            if self.send and self.dealt == 2:
                signal.raise_signal(signal.SIGTERM)
            yield batch


def stop_during_evaluation(out: Path, mode: str) -> dict:
    """Train with a whole-split validation pass at step 2, in which rank 1 alone receives
    SIGTERM; return where this rank stopped and how many validation batches it drew.
    """
    sections = {"val_shard_path": str(out / "val_000000.bin"), "eval_every": 2, "eval_steps": None}
    values = config(out / "eval_stop", mode, data=sections, run={"max_steps": 100})
    trainer, _ = runtime.build_runtime(values)
    evaluation = SignalOnSecondBatch(trainer.eval_dataloader, send=trainer.parallel.rank == 1)
    trainer.eval_dataloader = evaluation
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = trainer.fit()
    finally:  # a stopped torchrun worker ignores both until it exits: not this one's later work
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    checkpoint = Path(result.checkpoint).name if result.checkpoint else None
    # The resume runs the cut evaluation of step 2 first (the test reads rank 0's records).
    resumed, _ = runtime.build_runtime(values, resume=True)
    resumed.fit(3)
    return {"stopped_by": result.stopped_by, "steps": result.steps, "checkpoint": checkpoint,
            "dealt": evaluation.dealt}  # fmt: skip


def split_precision(out: Path, mode: str) -> list[str]:
    """Return the (mode, reason) this rank trains in when only rank 0 has native BF16 and
    `precision: auto` meets a model wide enough for it.
    """
    from speedtronic_systems import precision

    native = int(os.environ["RANK"]) == 0
    saved = precision.cpu_bf16_supported, precision._cuda_bf16_supported
    precision.cpu_bf16_supported = precision._cuda_bf16_supported = lambda *device: native
    try:
        values = config(out / "split", mode, model={"d_model": 256})
        values["logging"]["file"] = str(out / "split" / "train.log")
        values["precision"] = "auto"
        trainer, _ = runtime.build_runtime(values)
    finally:
        precision.cpu_bf16_supported, precision._cuda_bf16_supported = saved
    return [trainer.precision.mode, trainer.precision.reason]


def resume_apart(out: Path, mode: str) -> list[str]:
    """Resume with rank 1 on a "node" that lacks the run's checkpoint folder (no shared
    filesystem), then on one where it holds only a corrupt file; return the errors every rank
    must raise instead of training apart (or waiting for a rank that failed alone).
    """
    seen = []
    for folder in ("elsewhere", "corrupt"):
        values = config(out, mode)
        if int(os.environ["RANK"]) == 1:
            values["run"]["output_dir"] = str(out / folder)
            if folder == "corrupt":
                (out / folder / "checkpoints").mkdir(parents=True, exist_ok=True)
                (out / folder / "checkpoints" / "step_3.pt").write_bytes(b"torn")
        try:
            runtime.build_runtime(values, resume=True)
            seen.append("resumed")
        except CheckpointError as error:
            seen.append(str(error))
    return seen


def empty_shares(out: Path, mode: str) -> list[list]:
    """Return [error, run folder left behind] of build_runtime when the training shards give each
    rank 1 block of the 2 a batch needs, when only rank 0's copy is that small (no shared
    filesystem: every rank must still refuse), and when the validation shard holds 1 block for
    2 ranks.
    """
    from speedtronic_data import DataError, write_shard

    small, large = out / "small" / "train_000000.bin", out / "large" / "train_000000.bin"
    single = out / "single" / "val_000000.bin"
    if int(os.environ["RANK"]) == 0:
        write_shard(small, torch.arange(40) % 64)  # (40 - 1) // 16 = 2 blocks
        write_shard(large, torch.arange(400) % 64)
        write_shard(single, torch.arange(20) % 64)
    torch.distributed.barrier()
    rank_zero_small = small if int(os.environ["RANK"]) == 0 else large
    cases = {
        "few": {"shard_path": str(small)},
        "apart": {"shard_path": str(rank_zero_small)},
        "validation": {"val_shard_path": str(single)},
    }
    seen = []
    for name, data in cases.items():
        try:
            runtime.build_runtime(config(out / f"shares_{name}", mode, data=data))
            seen.append(["built", None])
        except DataError as error:
            torch.distributed.barrier()  # every rank has cleaned up after itself
            seen.append([str(error), (out / f"shares_{name}").exists()])
    return seen


def memory_apart(out: Path, mode: str) -> list:
    """Return [error, marked as raised on every rank, run folder left behind] of build_runtime
    when only rank 1's machine is too small for the run (nodes with different RAM): every rank
    must refuse, not rank 1 alone while rank 0 goes on and waits for it in a collective.
    """
    from speedtronic_config import ConfigError
    from speedtronic_systems import memory

    saved = memory.device_memory
    if int(os.environ["RANK"]) == 1:
        memory.device_memory = lambda device: (1000, "cpu (RAM)")
    try:
        runtime.build_runtime(config(out / "memory_apart", mode))
        return ["built", False, True]
    except ConfigError as error:
        return [str(error), raised_on_every_rank(error), (out / "memory_apart").exists()]
    finally:
        memory.device_memory = saved


def init_tokenizer_apart(out: Path, mode: str) -> list | None:
    """Return [error, marked as raised on every rank] of build_runtime when model.init_from
    names a folder that only rank 1's node lacks a config.json in (no shared filesystem): every
    rank must refuse, not rank 1 alone while rank 0 waits for it. None without the tokenizers
    package (the check then reads nothing).
    """
    import importlib.util

    from speedtronic_config import ConfigError

    if importlib.util.find_spec("tokenizers") is None:
        return None
    folder = out / f"init_from_rank{os.environ['RANK']}"
    folder.mkdir()
    if int(os.environ["RANK"]) == 0:
        (folder / "config.json").write_text("{}")
    try:
        runtime.build_runtime(config(out / "init_apart", mode, model={"init_from": f"hf:{folder}"}))
        return ["built", False]
    except ConfigError as error:
        return [str(error), raised_on_every_rank(error)]


def refused_apart(out: Path, mode: str) -> dict[str, list]:
    """Return [error type, error, marked as raised on every rank, run folder left behind] of
    build_runtime when one rank alone meets something it refuses (each node reads its own
    files): rank 1's run folder blocked by a file or a symlink loop, rank 1's copy of the data
    missing or shorter, rank 1's init_from folder without its weights, and rank 0 (the one that
    logs) without tensorboard for logging.hooks. Every rank must refuse, not one while the others
    wait for it (or, for the shorter copy, train on overlapping shares).
    """
    from speedtronic_data import write_shard
    from speedtronic_model import build_model
    from speedtronic_model.hf_llama import WEIGHTS_NAME, save_llama

    rank = int(os.environ["RANK"])
    node = out / "apart" / f"node{rank}"  # what this rank's node holds
    blocked = node / "blocked"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where rank 1's run folder goes")
    if rank == 1:
        symlink_loop(node / "loop")
    export = node / "export"
    save_llama(build_model(config(out, mode)["model"]), export)
    shard = node / "train_000000.bin"
    if rank == 0:
        write_shard(shard, torch.arange(400) % 64)
    else:
        (export / WEIGHTS_NAME).unlink()
    copy = node / "copy" / "train_000000.bin"  # rank 1's copy of the data is shorter
    write_shard(copy, torch.arange(300 if rank else 400) % 64)
    cases = {
        "output_dir": {"run": {"output_dir": str(blocked / "run" if rank else node / "run")}},
        "output_loop": {"run": {"output_dir": str(node / ("loop" if rank else "run"))}},
        "data": {"data": {"shard_path": str(shard)}},
        "data_size": {"data": {"shard_path": str(copy)}},
        "init_from": {"model": {"init_from": f"hf:{export}"}},
        "hooks": {"logging": {"hooks": ["tensorboard"]}},
    }
    seen = {}
    for name, sections in cases.items():
        values = config(out / "apart" / name, mode, **sections)
        saved = sys.modules.get("torch.utils.tensorboard")
        if name == "hooks" and rank == 0:
            sys.modules["torch.utils.tensorboard"] = None  # an import of it fails
        try:
            runtime.build_runtime(values)
            seen[name] = ["built"]
        except Exception as error:
            torch.distributed.barrier()  # every rank has cleaned up after itself
            folder = Path(values["run"]["output_dir"])
            seen[name] = [type(error).__name__, str(error), raised_on_every_rank(error)]
            seen[name].append(folder.exists())
        finally:
            if name == "hooks" and rank == 0:
                sys.modules.pop("torch.utils.tensorboard")
                if saved is not None:
                    sys.modules["torch.utils.tensorboard"] = saved
    return seen


def init_from_other_copy(out: Path, mode: str) -> list[bool]:
    """Return [the weights after setup are rank 0's copy, they are this rank's own copy] when
    model.init_from names a folder whose copy on rank 1's node holds other weights (a stale
    copy). Every rank must start from rank 0's, as DDP's broadcast makes them, not (FSDP2) from
    its own shards of its own copy: a mixture no node holds.
    """
    from speedtronic_model import apply_init_from, build_model
    from speedtronic_model.hf_llama import save_llama

    rank = int(os.environ["RANK"])
    model_section = config(out, mode)["model"]
    exports = [out / "init_other" / f"node{r}" / "export" for r in range(2)]
    torch.manual_seed(100 + rank)  # rank 1's copy: other weights of the same shapes
    save_llama(build_model(model_section), exports[rank])
    values = config(out / "init_other", mode, model={"init_from": f"hf:{exports[rank]}"})
    trainer, _ = runtime.build_runtime(values)  # its collectives: rank 0's copy is written
    weights = full_parameters(trainer)
    copies = [apply_init_from(build_model(model_section), f"hf:{exports[r]}") for r in (0, rank)]
    return [all(torch.equal(weights[k], v) for k, v in c.state_dict().items()) for c in copies]


def compile_failed_on_first_use(out: Path, mode: str) -> str:
    """Return what fit() raised when the compiled model failed on its first use on every rank,
    after the forward's collectives ran (as when inductor fails on the graph after the FSDP2
    hooks): falling back to eager rank by rank would repeat them, so each rank must stop.
    """

    def failing_compile(model, **options):
        def compiled(*args, **kwargs):
            model(*args, **kwargs)
            raise RuntimeError("injected: inductor failed")

        return compiled

    original, torch.compile = torch.compile, failing_compile
    try:
        values = {**config(out / "compile_failed", mode, run={"max_steps": 1}), "compile": True}
        trainer, _ = runtime.build_runtime(values)
        trainer.fit()
        return f"trained, compiled: {trainer._compiled is not None}"
    except RuntimeError as error:
        return str(error)
    finally:
        torch.compile = original


def compile_apart(out: Path, mode: str) -> list:
    """Return [compiled, the warning] after one step of `compile: auto` where only rank 0's
    machine has a C++ compiler (and the run is long enough to pay for compiling): every rank
    must train alike, eagerly. torch.compile is replaced by the model itself (no inductor).
    """
    from speedtronic_systems import compile_choice

    rank = int(os.environ["RANK"])
    saved = compile_choice.inductor_cpp_compiler, compile_choice.CPU_COMPILE_BREAK_EVEN_STEPS
    saved_compile = torch.compile
    compile_choice.inductor_cpp_compiler = lambda: None if rank else "/usr/bin/g++"
    compile_choice.CPU_COMPILE_BREAK_EVEN_STEPS = 1
    torch.compile = lambda model, **options: model
    try:
        values = {**config(out / "compile_apart", mode, run={"max_steps": 1}), "compile": "auto"}
        values["logging"]["file"] = str(out / "compile_apart" / "train.log")
        trainer, _ = runtime.build_runtime(values)
        trainer.fit()
    finally:
        compile_choice.inductor_cpp_compiler, compile_choice.CPU_COMPILE_BREAK_EVEN_STEPS = saved
        torch.compile = saved_compile
    log = (out / "compile_apart" / "train.log").read_text() if rank == 0 else ""
    warned = [line.split("compile: ", 1)[1] for line in log.splitlines() if "ranks decided" in line]
    return [trainer._compiled is not None, warned]


def resume_other_copy(out: Path, mode: str) -> dict[str, list | str]:
    """Resume where each rank's node holds its own copy of step 3: rank 1's copied from rank 0's
    ("same"), then ("other") another save of that step under the same name (the compiled run's,
    as an earlier attempt's file left on a node). The first resumes; the second must be refused
    on every rank, not train rank 1 on from other weights than rank 0's. A resume is [its step,
    every rank's sum of its weights (DDP) or of its shard (FSDP2)].
    """
    import shutil

    rank = int(os.environ["RANK"])
    seen = {}
    for case in ("same", "other"):
        source = out / ("compiled" if rank and case == "other" else "") / "run" / "checkpoints"
        checkpoint = sorted(source.glob("step_3.*"))[0]
        values = config(out / f"{case}_copy" / f"node{rank}", mode)
        folder = Path(values["run"]["output_dir"]) / "checkpoints"
        folder.mkdir(parents=True)
        copy = shutil.copytree if checkpoint.is_dir() else shutil.copy2
        copy(checkpoint, folder / checkpoint.name)
        try:
            trainer, _ = runtime.build_runtime(values, resume=True)
        except CheckpointError as error:
            seen[case] = str(error)
            continue
        mine = [p.to_local() if hasattr(p, "to_local") else p for p in trainer.model.parameters()]
        sums = trainer.parallel.all_gather_object(sum(float(p.double().sum()) for p in mine))
        seen[case] = [trainer.step, sums]
    return seen


def stage_roots(trainer) -> list[list[str]]:
    """Return the stage names StageStreamScheduler finds (on faked CUDA streams) in the trainer's
    DDP-wrapped model and in the model it wraps.
    """
    from speedtronic_systems.scheduling import StageStreamScheduler

    saved = torch.cuda.is_available, torch.cuda.Stream
    torch.cuda.is_available, torch.cuda.Stream = (lambda: True), (lambda device=None: object())
    try:
        names = []
        for model in (trainer.model, trainer.model.module):
            scheduler = StageStreamScheduler(model, "cuda", num_streams=2)
            scheduler.remove_hooks()
            names.append([stage.name for stage in scheduler.stages])
        return names
    finally:
        torch.cuda.is_available, torch.cuda.Stream = saved


def wrong_order_is_refused(trainer) -> bool:
    """An optimizer built from the parameters before fully_shard must be refused."""
    from speedtronic_model import build_model

    model = build_model(trainer.config.model)
    stale = torch.optim.AdamW(model.parameters())
    from speedtronic_systems.parallel import wrap_model

    wrapped = wrap_model(model, trainer.parallel, trainer.config.parallel)
    try:
        check_optimizer_after_wrapping(wrapped, stale)
    except ParallelError as error:
        return "built before the model was wrapped" in str(error)
    return False


def scenario_resume(out: Path, mode: str) -> dict:
    """Resume the checkpoint of `train` (saved at world 2) at this world size and train on."""
    source = Path(os.environ["SOURCE_RUN"])
    values = config(source, mode, run={"max_steps": 4}, data={"target_batch_size": 16})
    values["run"]["output_dir"] = str(out / "run")
    checkpoint = sorted((source / "run" / "checkpoints").glob("step_3.*"))[0]
    link_checkpoint(checkpoint, Path(values["run"]["output_dir"]))
    trainer, _ = runtime.build_runtime(values, resume=True)
    seen = {"resumed_at": trainer.step, "world_size": trainer.parallel.world_size}
    seen["steps"] = trainer.fit().steps
    # Fewer layers: DCP would load the keys the smaller model asks for and train on silently.
    fewer = config(source, mode, model={"n_layer": 1}, data={"target_batch_size": 16})
    fewer["run"]["output_dir"] = str(out / "fewer")
    link_checkpoint(checkpoint, out / "fewer")
    try:
        runtime.build_runtime(fewer, resume=True)
        seen["fewer_layers"] = "resumed"
    except CheckpointError as error:
        seen["fewer_layers"] = str(error)
    return seen


def scenario_resume_into_fsdp(out: Path, mode: str) -> dict:
    """Resume single-file DDP checkpoints (step_2.pt) under FSDP2 at world 2 and train to step 3:
    the AdamW run of `train`, and a hybrid Muon run trained here under DDP first.
    """
    source = Path(os.environ["SOURCE_RUN"])
    adamw = source / "run" / "checkpoints" / "step_2.pt"
    seen = resume_under(mode, adamw, out / "adamw")
    try:  # another model size: refused in one line on every rank, as without FSDP
        resume_under(mode, adamw, out / "wider", model={"d_model": 32})
    except CheckpointError as error:
        seen["wider"] = str(error)
    muon = {"name": "muon", "lr": 0.02, "grad_clip": 1e9}
    trainer, _ = runtime.build_runtime(config(out / "muon_ddp", "ddp", optimizer=muon))
    trainer.fit()
    if trainer.parallel.is_main:
        torch.save(full_parameters(trainer), out / "muon_ddp" / "params_train.pt")
    checkpoint = out / "muon_ddp" / "run" / "checkpoints" / "step_2.pt"
    # Reduced once per step, as DDP does: a last-bit difference in the summed gradient (per
    # microbatch reduce-scatters add in another order) grows to 1e-4 through bf16 Newton-Schulz.
    deferred = {"fsdp_sync_each_microbatch": False}
    seen["muon"] = resume_under(mode, checkpoint, out / "muon", optimizer=muon, parallel=deferred)
    return seen


def resume_under(mode: str, checkpoint: Path, out: Path, **sections) -> dict:
    """Resume `checkpoint` in a fresh run folder under `mode`, train to step 3 and let rank 0
    write the parameters it ended with (out/params_resumed.pt).
    """
    link_checkpoint(checkpoint, out / "run")
    trainer, _ = runtime.build_runtime(config(out, mode, **sections), resume=True)
    seen = {"resumed_at": trainer.step, "steps": trainer.fit().steps}
    params = full_parameters(trainer)
    if trainer.parallel.is_main:
        torch.save(params, out / "params_resumed.pt")
    return seen


def link_checkpoint(checkpoint: Path, run_dir: Path) -> None:
    """Make `checkpoint` the one a run in `run_dir` resumes from (a link in its checkpoints)."""
    target = run_dir / "checkpoints"
    target.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # every rank tries; one link wins
        os.symlink(checkpoint, target / checkpoint.name)


def scenario_apart(out: Path, mode: str) -> dict:
    """What each rank raised (or trained to) when its loader alone ran out, failed or gave
    batches of another kind than its peers', when its fit() alone had another target, no
    evaluation or no checkpoints, or when rank 0 could not open the run folder's lock file; each
    followed by the sum of one more collective (1 + 2 = 3 on both ranks unless it met a peer's
    leftover collective).
    """
    # A collective that never meets its peer's raises after 30 s instead of waiting 30 minutes.
    context = init_parallel({"data_parallel": mode, "timeout_s": 30}, torch.device(DEVICE))
    seen = {}
    for name, apart in APART.items():
        seen[name] = [*fit_apart(context, **apart(context.rank, out / name)), next_sum(context)]
    seen["lock"] = [*lock_apart(context, out / "lock" / "run"), next_sum(context)]
    seen["lock_loop"] = [*lock_apart(context, out / "lock_loop" / "run", loop=True)]
    seen["lock_loop"].append(next_sum(context))
    seen["resume"] = [*resume_apart_loop(context, out / "resume"), next_sum(context)]
    seen["evaluate_none"] = [*evaluate_none_apart(context), next_sum(context)]
    seen["evaluate_counts"] = [*evaluate_counts_apart(context), next_sum(context)]
    return seen


def next_sum(context: ParallelContext) -> float:
    """Return the sum of the ranks' rank + 1 over one more collective."""
    return context.all_reduce_sum([context.rank + 1.0])[0]


def lock_apart(context: ParallelContext, run: Path, loop: bool = False) -> list[str]:
    """What each rank raised when rank 0 (which locks the run folder) could not open its lock
    file, a folder of that name, or (`loop`) could not resolve the folder, a symlink loop.
    """
    if context.rank == 0 and loop:
        symlink_loop(run)
    elif context.rank == 0:
        (run / LOCK_NAME).mkdir(parents=True)
    try:
        claim_run_folders(SpeedtronicConfig.from_dict({"run": {"output_dir": str(run)}}), context)
    except (OSError, RuntimeError) as error:  # a loop: RuntimeError before Python 3.13
        return [f"{type(error).__name__}: {error}"]
    return ["claimed"]


def symlink_loop(path: Path) -> None:
    """Make `path` a symlink loop (through path.loop), which no one can list or resolve."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(path.with_suffix(".loop"), path)
    os.symlink(path, path.with_suffix(".loop"))


def resume_apart_loop(context: ParallelContext, folder: Path) -> list[str]:
    """What each rank raised when resume_latest() found no checkpoint on rank 0's node and
    could not list the checkpoint folder on rank 1's (a symlink loop).
    """
    checkpoints = folder / f"node{context.rank}" / "checkpoints"
    if context.rank == 1:
        symlink_loop(checkpoints)
    shares = {"data": {"micro_batch_size": 2, "target_batch_size": 4}}
    manager = CheckpointManager(checkpoints)
    trainer, _ = regression_trainer(context, [], shares, checkpoint_manager=manager)
    try:
        trainer.resume_latest()
    except Exception as error:
        return [f"{type(error).__name__}: {error}"]
    return ["resumed"]


def regression_batches(count: int, labels: bool = False) -> list[tuple[torch.Tensor, ...]]:
    """`count` microbatches of 2 for Regression: float targets, or integer ones (token labels)."""
    generator = torch.Generator().manual_seed(count)
    targets = [torch.randint(0, 3, (2, 1), generator=generator) for _ in range(count)]
    inputs = [torch.randn(2, 4, generator=generator) for _ in range(count)]
    return [(x, y if labels else y.float()) for x, y in zip(inputs, targets, strict=True)]


def failing_at(count: int):
    """A loader that reads `count` batches and then fails, as an unreadable shard would."""
    yield from regression_batches(count)
    raise OSError("injected: shard unreadable")


class Unstartable:
    """An eval loader whose iteration cannot start, as a DataLoader whose workers fail to;
    `tried` counts the attempts.
    """

    tried = 0

    def __iter__(self):
        self.tried += 1
        raise OSError("injected: workers failed to start")


def evaluate_none_apart(context: ParallelContext) -> list:
    """What each rank's evaluate(max_batches=0) returned when rank 1's eval loader cannot start,
    and how often that loader was iterated (an evaluation of no batch starts no loader).
    """
    loader = Unstartable() if context.rank == 1 else regression_batches(4)
    shares = {"data": {"micro_batch_size": 2, "target_batch_size": 4}}
    trainer, _ = regression_trainer(context, [], shares, eval_dataloader=loader)
    try:
        seen = [trainer.evaluate(max_batches=0)]
    except Exception as error:
        seen = [f"{type(error).__name__}: {error}"]
    return [*seen, getattr(loader, "tried", 0)]


def evaluate_counts_apart(context: ParallelContext) -> list:
    """What each rank's evaluate raised when rank 0 asked for 2 batches and rank 1 for none
    (rank 1 returned None at once, leaving rank 0 waiting at its first batch's collective).
    """
    shares = {"data": {"micro_batch_size": 2, "target_batch_size": 4}}
    trainer, _ = regression_trainer(context, [], shares, eval_dataloader=regression_batches(4))
    try:
        return [trainer.evaluate(max_batches=2 if context.rank == 0 else 0)]
    except ValueError as error:
        return [f"ValueError: {error}"]


# Each check's fit_apart arguments by rank and folder: only one rank's differ from the defaults.
APART = {
    "ran_out": lambda rank, _: {"training": iter(regression_batches(8 if rank == 0 else 3))},
    "failed": lambda rank, _: {"training": failing_at(2) if rank == 0 else None},
    "labels": lambda rank, _: {"training": regression_batches(8, labels=rank == 1)},
    "eval_failed": lambda rank, _: {
        "validation": failing_at(1) if rank == 1 else regression_batches(4)
    },
    "target": lambda rank, _: {"target": 4 + 2 * rank},
    "invalid_target": lambda rank, _: {"target": 0 if rank == 1 else 4},
    "eval_iter": lambda rank, _: {
        "validation": Unstartable() if rank == 1 else regression_batches(4)
    },
    "evaluation": lambda rank, _: {"validation": regression_batches(4) if rank == 0 else None},
    "checkpoints": lambda rank, folder: {
        "manager": CheckpointManager(folder, every_steps=2) if rank == 0 else None
    },
}


def fit_apart(
    context: ParallelContext, training=None, validation=None, target: int = 4, manager=None
) -> list:
    """Train Regression to `target` (evaluating every 2 steps when given `validation`); return
    what this rank raised, or its final loss and weights.
    """
    torch.manual_seed(3)
    trainer, model = regression_trainer(
        context,
        regression_batches(8) if training is None else training,
        {"data": {"micro_batch_size": 2, "target_batch_size": 4, "eval_every": 2}},
        eval_dataloader=validation,
        checkpoint_manager=manager,
    )
    try:
        loss = trainer.fit(target).final_loss
    except Exception as error:
        return [f"{type(error).__name__}: {error}"]
    return [loss, torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()]


def process_resources() -> dict:
    """What a run left in this process: a process group, threads, open files."""
    return {
        "group": torch.distributed.is_initialized(),
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def scenario_sweep(out: Path, mode: str) -> dict:
    """Call train_from_config 3 times in this process, as a sweep does (the second run stops on
    a non-finite loss); return what each left behind, and what was there before the first.
    """
    seen = {"before": process_resources(), "runs": []}
    for run in range(3):
        optimizer = {"lr": 1e30} if run == 1 else {}  # a non-finite loss stops the run
        values = config(out / str(run), mode, optimizer=optimizer, parallel={"timeout_s": 30})
        try:
            runtime.train_from_config(values)
            outcome = "trained"
        except Exception as error:
            outcome = type(error).__name__
        seen["runs"].append({"outcome": outcome, **process_resources()})
    return seen


SCENARIOS = {
    "train": scenario_train,
    "apart": scenario_apart,
    "resume": scenario_resume,
    "resume_into_fsdp": scenario_resume_into_fsdp,
    "sweep": scenario_sweep,
}


@record  # a failing rank's traceback ends torchrun's summary, where a test's tail shows it
def main() -> None:
    scenario, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    seen = SCENARIOS[scenario](out, mode)
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    if torch.distributed.is_initialized():  # a sweep's runs have left their groups
        # Leave together: a rank that exits first can abort a peer still in its last gloo
        # operation.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip interpreter finalization, as parallel_muon_worker.py does: about 1 launch in 50, an FSDP
    # rank aborted there ("terminate called without an active exception") after its results were
    # written and the group destroyed (gloo threads releasing tensors at teardown; pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
