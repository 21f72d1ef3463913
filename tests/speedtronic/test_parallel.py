"""DDP and FSDP2 under torchrun, in real processes (gloo on CPU): each spawned run checks several
things (tests/speedtronic/parallel_worker.py), compared here with one process.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from speedtronic import runtime
from speedtronic.run_lock import claim_run_folders
from speedtronic_config import SpeedtronicConfig
from speedtronic_systems.parallel import SINGLE

WORKER = Path(__file__).with_name("parallel_worker.py")
sys.path.insert(0, str(WORKER.parent))
from parallel_worker import config, ignore_labels, link_checkpoint, own_loss_step  # noqa: E402


def torchrun(*args: str, nproc: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run torchrun (standalone c10d rendezvous on this machine) and return the finished process."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def ranks(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def grad_norms(out: Path) -> list[float]:
    records = [
        json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    return [r["grad_norm"] for r in records if r["event"] == "train_step"]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: one process training the same global batches."""
    out = tmp_path_factory.mktemp("single")
    trainer, _ = runtime.build_runtime(config(out, "none"))
    trainer.fit()
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return params, grad_norms(out)


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def trained(request, tmp_path_factory) -> tuple[str, Path, list[dict]]:
    out = tmp_path_factory.mktemp(request.param)
    torchrun(str(WORKER), "train", str(out), request.param)
    return request.param, out, ranks(out, 2)


def test_two_ranks_make_the_same_update_as_one_process(trained, single_process):
    _, out, _ = trained
    reference, reference_norms = single_process
    params = torch.load(out / "params_train.pt")
    assert params.keys() == reference.keys()
    for name, value in reference.items():
        assert (params[name] - value).abs().max() <= 1e-6, name
    # Token-weighted over both ranks and no double division: the same global gradient.
    assert grad_norms(out) == pytest.approx(reference_norms, rel=1e-5)


def test_the_wrapped_model_trains_compiled_to_the_eager_update(trained):
    _, _, ranks_seen = trained
    assert all(seen["compiled"]["stayed_compiled"] for seen in ranks_seen)  # no eager fallback
    assert ranks_seen[0]["compiled"]["max_difference"] <= 1e-5


def test_fsdp_accumulates_gradient_shards_unless_told_to_defer(trained, single_process):
    mode, out, ranks_seen = trained
    if mode != "fsdp":
        pytest.skip("DDP's gradients are whole on every rank; it always reduces once per step")
    for seen in ranks_seen:
        # By default each microbatch is reduce-scattered: a rank holds only its shards between
        # microbatches. Deferred, nothing reaches .grad until the step's last microbatch.
        assert seen["held_after_microbatch"] == {"True": ["shard"], "False": ["none"]}
    deferred = torch.load(out / "params_deferred_sync.pt")
    for name, value in single_process[0].items():
        assert (deferred[name] - value).abs().max() <= 1e-6, name


def test_batches_without_token_labels_make_the_same_step_as_one_process(trained):
    mode, _, ranks_seen = trained
    if mode != "ddp":
        pytest.skip("a linear model has no blocks for FSDP2 to shard")
    reference = own_loss_step()
    for seen in ranks_seen:  # the loss and update of the whole batch, not world-size times them
        assert seen["own_loss"]["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        assert seen["own_loss"]["weights"] == pytest.approx(reference["weights"], rel=1e-5)


def test_a_microbatch_ignored_on_one_rank_still_joins_the_step(trained, tmp_path):
    _, out, (zero, one) = trained
    # One process, the same global batch: samples 5 and 7 are row 1 of its 3rd and 4th
    # microbatches. Rank 1 alone skipping them used to leave rank 0 waiting in the all-reduce.
    trainer, _ = runtime.build_runtime(config(tmp_path, "none", run={"max_steps": 1}))
    ignore_labels(trainer, {3: slice(1, 2), 4: slice(1, 2)})
    reference = trainer.fit().final_loss
    assert zero["ignored_loss"] == one["ignored_loss"] == pytest.approx(reference, rel=1e-6)
    params = torch.load(out / "params_ignored.pt")
    for name, value in trainer.model.state_dict().items():
        assert (params[name] - value).abs().max() <= 1e-6, name


def test_ranks_read_disjoint_shares_and_reseed(trained):
    _, _, (zero, one) = trained
    assert zero["indices"] == [0, 2, 4, 6] and one["indices"] == [1, 3, 5, 7]
    assert zero["torch_seed"] != one["torch_seed"]  # per-rank randomness after the same model
    assert zero["steps"] == one["steps"] == 3 and zero["tokens"] == 3 * 8 * 16


def test_checkpoints_resume_bit_for_bit_at_world_two(trained):
    mode, out, (zero, one) = trained
    suffix = ".dcp" if mode == "fsdp" else ".pt"
    assert zero["latest"].endswith(f"step_3{suffix}") and zero["resumed_from"] == 2
    assert zero["resume_bit_equal"] and one["resume_bit_equal"]
    checkpoints = sorted(p.name for p in (out / "run" / "checkpoints").glob("step_*"))
    assert checkpoints == [f"step_2{suffix}", f"step_3{suffix}"]  # one per step, not per rank


def test_ddp_broadcasts_buffers_every_forward_only_for_a_model_with_state_buffers(trained):
    mode, _, seen = trained
    if mode != "ddp":
        pytest.skip("DDP's flag")
    # The reference model's only buffers are its RoPE tables: no collective before each forward.
    assert [rank["forward_buffer_sync"] for rank in seen] == [[False, True]] * 2


def test_a_nonfinite_loss_on_one_rank_is_skipped_on_every_rank(trained):
    _, _, (zero, one) = trained
    assert zero["skipped"] == one["skipped"] == 1
    assert zero["skip_steps"] == one["skip_steps"] == 2


def test_evaluation_sums_every_ranks_share_and_only_rank_zero_logs(trained):
    _, out, (zero, one) = trained
    assert zero["eval_loss"] == one["eval_loss"]
    whole, without_one_batch, uneven, even = zero["eval_loss"]
    assert whole is not None and math.isfinite(without_one_batch) and without_one_batch != whole
    assert uneven == even  # the batch only rank 1 held was left out on every rank, not awaited
    records = [
        json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r["step"] for r in records if r["event"] == "train_step"]
    assert steps == [1, 2, 3]  # rank 0's records only


def test_a_signal_during_evaluation_on_one_rank_stops_every_rank_at_that_step(trained):
    mode, _, (zero, one) = trained
    suffix = ".pt" if mode == "ddp" else ".dcp"
    stopped = {"stopped_by": "SIGTERM", "steps": 2, "checkpoint": f"step_2{suffix}", "dealt": 2}
    assert zero["eval_stop"] == one["eval_stop"] == stopped  # of 6 batches a rank


def test_a_resume_runs_the_evaluation_a_signal_cut_short_on_every_rank(trained):
    _, out, _ = trained
    lines = (out / "eval_stop" / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    # Step 2's pass, cut short before the stop, is run by the resume before step 3.
    assert [r["step"] for r in records if r["event"] == "eval"] == [2, 3]


def test_a_checkpoint_rank_zero_fails_to_write_fails_on_every_rank(trained):
    _, _, (zero, one) = trained
    assert [e.split(" (")[0] for e in zero["failed_saves"]] == [
        "injected: write failed",
        "injected: commit failed",
    ]
    assert one["failed_saves"][0].startswith("rank 0 failed to write checkpoint ")
    assert one["failed_saves"][1].startswith("rank 0 failed to point `latest` at ")


def test_a_nonfinite_loss_on_one_rank_stops_every_rank_with_one_line_for_the_group(trained):
    _, _, (zero, one) = trained
    assert zero["nonfinite_stop"] == one["nonfinite_stop"]
    line, every_rank = zero["nonfinite_stop"]
    assert line.startswith("NonFiniteLossError: non-finite loss=nan at step 1; ")
    assert line.endswith("; no checkpoint of this run was written")
    assert every_rank  # rank 0 prints it once, not each rank


def test_a_shard_write_one_rank_fails_is_one_line_on_every_rank(trained):
    mode, out, (zero, one) = trained
    if mode != "fsdp":
        pytest.skip("DDP's rank 0 writes the one file (test above)")
    assert (
        zero["failed_shard_write"]
        == one["failed_shard_write"]
        == [
            f"no space left on {out / 'failed_shard_write' / 'run' / 'checkpoints'} while writing "
            "step 0; no earlier checkpoint exists",
            True,
            False,
        ]
    )


def test_ranks_that_resolve_different_precisions_all_train_in_fp32(trained):
    _, out, (zero, one) = trained
    assert zero["split_precision"] == one["split_precision"]
    mode, reason = zero["split_precision"]
    assert mode == "fp32" and "bf16 on rank 0;" in reason and "on rank 1)" in reason
    log = (out / "split" / "train.log").read_text()
    assert f"precision: {reason}" in log


def test_ranks_that_find_different_checkpoints_refuse_to_resume_together(trained):
    mode, out, (zero, one) = trained
    name = "step_3.dcp" if mode == "fsdp" else "step_3.pt"
    # Each rank names the folder its own config points at (here they differ on purpose).
    for index, (rank_1, found) in enumerate(
        [("elsewhere", "none"), ("corrupt", "no loadable checkpoint")]
    ):
        for seen, folder in [(zero, out / "run"), (one, out / rank_1)]:
            assert seen["resume_apart"][index] == (
                f"the ranks found different checkpoints to resume ({name} on rank 0; {found} on "
                f"rank 1); every node must see the same checkpoint folder "
                f"{folder / 'checkpoints'}: put it on a filesystem all nodes share, or copy it to "
                "each node"
            )


def test_ranks_holding_different_copies_of_a_checkpoint_refuse_to_resume_together(trained):
    mode, out, ranks_seen = trained
    name = "step_3.dcp" if mode == "fsdp" else "step_3.pt"
    digests = []
    for rank, seen in enumerate(ranks_seen):
        step, sums = seen["resume_other_copy"]["same"]  # rank 1 holds a copy of rank 0's file
        assert step == 3 and (mode == "fsdp" or sums[0] == sums[1])  # FSDP2: shards differ
        # Rank 1's is another save of step 3: without the check it resumed from other weights.
        refused = seen["resume_other_copy"]["other"]
        assert isinstance(refused, str), f"resumed apart: [step, weight sums] {refused}"
        folder = out / "other_copy" / f"node{rank}" / "run" / "checkpoints"
        match = re.fullmatch(
            rf"the ranks hold different copies of {re.escape(name)} \(contents (\w{{12}}) on "
            rf"rank 0; (\w{{12}}) on rank 1\): another save of that step is on some node; give "
            rf"every node the same copy of {re.escape(str(folder))}, or put it on a filesystem "
            "all nodes share",
            refused,
        )
        assert match and match[1] != match[2], refused
        digests.append(match.groups())
    assert digests[0] == digests[1]  # one line for the group


def test_a_split_that_leaves_a_rank_without_a_batch_is_refused_on_every_rank(trained):
    _, _, (zero, one) = trained
    need = "each rank needs at least one batch of 2 x 16 = 32 tokens"
    few, apart, validation = zero["empty_shares"]
    assert few == [
        f"the training data holds 40 tokens (2 blocks of 16), too few for 2 data-parallel ranks: "
        f"{need} (data.micro_batch_size x model.max_seq_len); use fewer processes "
        "(--nproc-per-node), a smaller data.micro_batch_size or model.max_seq_len, or more data",
        False,  # nothing left behind
    ]
    assert apart == few  # rank 1's own copy is large enough: it refuses with rank 0
    assert validation[0].startswith("the validation data holds 20 tokens (1 block of 16), ")
    assert validation[1] is False
    assert [error for error, _ in one["empty_shares"]] == [few[0], few[0], validation[0]]


def test_a_rank_whose_machine_is_too_small_refuses_on_every_rank(trained):
    _, _, (zero, one) = trained
    error, every, left = zero["memory_apart"]
    assert one["memory_apart"] == [error, True, False] and every and not left
    assert error.startswith("on rank 1, this run needs at least ")
    assert "but cpu (RAM) has 1.0 kB" in error


def test_an_init_from_folder_one_rank_lacks_is_refused_on_every_rank(trained):
    _, out, (zero, one) = trained
    if zero["init_tokenizer_apart"] is None:
        pytest.skip("check_init_tokenizer reads tokenizer.json with the tokenizers package")
    folder = out / "init_from_rank1"
    expected = f"model.init_from: on rank 1, {folder} has no config.json; point it at a folder"
    error, every = zero["init_tokenizer_apart"]
    assert one["init_tokenizer_apart"] == [error, True] and every
    assert error.startswith(expected)


def test_every_rank_starts_from_rank_0s_copy_of_the_init_from_weights(trained):
    _, _, (zero, one) = trained
    # Rank 1's node holds a stale copy (other weights): both start from rank 0's, as DDP's
    # broadcast makes them; FSDP2 used to keep each rank's shards of its own copy, a mixture.
    assert zero["init_from_other_copy"] == [True, True]
    assert one["init_from_other_copy"] == [True, False]  # [rank 0's copy, its own]


def test_what_one_rank_alone_refuses_at_startup_is_refused_on_every_rank(trained):
    _, out, (zero, one) = trained
    assert zero["refused_apart"] == one["refused_apart"]  # the same line, marked every rank's
    node0, node1 = out / "apart" / "node0", out / "apart" / "node1"
    expected = {
        "output_dir": (
            "ConfigError",
            f"run.output_dir: on rank 1, cannot write to {node1 / 'blocked' / 'run'} ("
            f"{node1 / 'blocked'} is a file, not a folder); choose a writable folder",
        ),
        # Resolving rank 1's folder, before the startup checks: rank 1 alone raised there.
        "output_loop": (
            ("RuntimeError", f"on rank 1, Symlink loop from '{node1 / 'loop'}'")
            if sys.version_info < (3, 13)  # then Path.resolve ignores loops; the probe refuses
            else ("ConfigError", f"run.output_dir: on rank 1, cannot write to {node1 / 'loop'}")
        ),
        "data": (
            "DataError",
            f"on rank 1, data.shard_path = '{node1 / 'train_000000.bin'}' matches no files; ",
        ),
        "data_size": (
            "DataError",
            "the training data differs between ranks (24 blocks on rank 0; 18 blocks on rank 1)",
        ),
        "init_from": (
            "ConfigError",
            f"model.init_from: on rank 1, {node1 / 'export'} has neither model.safetensors nor ",
        ),
        "hooks": ("HookUnavailable", "tensorboard is not installed; "),
    }
    for name, (kind, start) in expected.items():
        refused = zero["refused_apart"][name]
        assert refused[0] == kind and refused[1].startswith(start), refused
        assert refused[2:] == [True, False], name  # every rank's; no run folder left behind
    assert not (node0 / "run").exists()


def test_a_compiled_model_failing_on_first_use_stops_every_rank_in_one_line(trained):
    _, _, ranks_seen = trained
    for rank, seen in enumerate(ranks_seen):  # not an eager retry that repeats the collectives
        assert seen["compile_failed"] == (
            f"the compiled model failed on its first step on rank {rank} (RuntimeError: "
            "injected: inductor failed); under data parallelism a rank cannot fall back to eager "
            "alone (its peers are in the step's collectives); set compile: false"
        )


def test_ranks_that_resolve_compile_auto_differently_all_train_eagerly(trained):
    _, _, (zero, one) = trained
    # Only rank 0's machine has a C++ compiler: compiled beside an eager rank 1 before.
    assert zero["compile_apart"][0] is one["compile_apart"][0] is False
    (warning,) = zero["compile_apart"][1]  # one line, from rank 0 for the group
    assert warning.startswith(
        "the ranks decided differently (compiled on rank 0; eager on rank 1); every rank trains "
        "eagerly. Rank 1: auto: no C++ compiler for torch.compile on CPU ("
    )


def test_out_of_order_backprop_finds_the_stages_inside_ddp(trained):
    mode, _, ranks_seen = trained
    if mode != "ddp":
        pytest.skip("FSDP2 shards the model in place: there is no wrapper")
    wrapped, inner = ranks_seen[0]["stage_roots"]
    assert inner == ["tok_emb", "blocks.0", "blocks.1", "norm", "lm_head"]
    assert wrapped == inner  # not one stage, "module", on one stream


def test_fsdp_refuses_an_optimizer_built_before_wrapping(trained):
    mode, _, (zero, _) = trained
    if mode != "fsdp":
        pytest.skip("fully_shard replaces parameters; DDP keeps them")
    assert zero["wrong_order_refused"]


def test_one_rank_reads_a_sharded_checkpoint_while_its_peers_wait(trained):
    mode, _, (zero, one) = trained
    if mode != "fsdp":
        pytest.skip("DDP writes single-file checkpoints")
    assert zero["read_alone"] is True and one["read_alone"] is None


def test_a_sweep_of_runs_in_one_process_leaves_no_group_threads_or_files_behind(tmp_path):
    # Each run joins a new process group: the second used to read the first's gloo addresses
    # from torchrun's store (a connection refused, or a hang).
    torchrun(str(WORKER), "sweep", str(tmp_path), "ddp")
    for seen in ranks(tmp_path, 2):
        before = seen["before"]
        assert [run.pop("outcome") for run in seen["runs"]] == [
            "trained",
            "NonFiniteLossError",
            "trained",
        ]
        assert seen["runs"] == [before] * 3


def test_what_differs_on_one_rank_is_agreed_on_by_every_rank(tmp_path):
    torchrun(str(WORKER), "apart", str(tmp_path), "ddp")
    zero, one = ranks(tmp_path, 2)
    # Each rank's next collective meets its peer's (3.0): a rank that raised alone used to meet
    # its peer's gradient all-reduce there (a wrong sum), or leave it waiting.
    assert [seen.pop() for seen in zero.values()] == [3.0] * 14
    assert [seen.pop() for seen in one.values()] == [3.0] * 14
    lock = tmp_path / "lock" / "run" / ".speedtronic-run.lock"
    assert (
        zero["lock"] == one["lock"] == [f"IsADirectoryError: [Errno 21] Is a directory: '{lock}'"]
    )
    failed = "RuntimeError: rank {} could not read its batch from the {}{}"
    why = " (that rank's error says why); every rank stops with it"
    assert one["ran_out"][0].startswith("ValueError: the batch iterator is exhausted and ")
    assert zero["ran_out"] == [failed.format(1, "training data loader, for step 4", why)]
    assert zero["failed"] == ["OSError: injected: shard unreadable"]
    assert one["failed"] == [failed.format(0, "training data loader, for step 3", why)]
    assert one["eval_failed"] == ["OSError: injected: shard unreadable"]
    evaluation = "eval_dataloader, in the evaluation at step 2"
    assert zero["eval_failed"] == [failed.format(1, evaluation, why)]
    # Rank 1's eval loader could not start (its iter() raised): not rank 1 alone.
    assert one["eval_iter"] == ["OSError: injected: workers failed to start"]
    assert zero["eval_iter"] == [failed.format(1, evaluation, why)]
    # An evaluation of no batch starts no loader: every rank returns None, as one process does.
    assert zero["evaluate_none"] == one["evaluate_none"] == [None, 0]
    # Asked for different counts of eval batches, every rank refuses, naming them.
    assert (
        zero["evaluate_counts"]
        == one["evaluate_counts"]
        == [
            "ValueError: evaluate(max_batches=...) differs between the ranks (2 on rank 0; 0 on "
            "rank 1); call it with the same max_batches on every rank: each batch is a collective"
        ]
    )
    # Rank 0 could not resolve the run folder (a symlink loop): every rank raises what one
    # process raises there (RuntimeError before Python 3.13), not rank 0 alone.
    loop = SpeedtronicConfig.from_dict({"run": {"output_dir": str(tmp_path / "lock_loop" / "run")}})
    with pytest.raises((OSError, RuntimeError)) as alone:
        claim_run_folders(loop, SINGLE)
    assert zero["lock_loop"] == one["lock_loop"] == [f"{alone.typename}: {alone.value}"]
    # Rank 1's node could not list its checkpoint folder: every rank refuses the resume.
    for rank, seen in enumerate((zero, one)):
        folder = tmp_path / "resume" / f"node{rank}" / "checkpoints"
        assert seen["resume"] == [
            "CheckpointError: the ranks found different checkpoints to resume (none on rank 0; "
            "an unreadable folder (Too many levels of symbolic links) on rank 1); every node "
            f"must see the same checkpoint folder {folder}: put it on a filesystem all nodes "
            "share, or copy it to each node"
        ]
    # Token labels on rank 1 alone: every rank weighs its microbatches alike, and trains alike.
    assert zero["labels"] == one["labels"] and len(zero["labels"]) == 2
    refused = "invalid (max_steps must be a positive absolute step target, got 0) on rank 1"
    for key, name, split in [
        ("target", "step target", "4 on rank 0; 6 on rank 1"),
        ("invalid_target", "step target", f"4 on rank 0; {refused}"),  # not raised alone
        ("evaluation", "evaluation", "every 2 steps on rank 0; none on rank 1"),
        ("checkpoints", "checkpoints", "every 2 steps on rank 0; none on rank 1"),
    ]:
        assert (
            zero[key]
            == one[key]
            == [
                f"ValueError: the ranks' fit() calls differ in their {name} ({split}): they would "
                "wait for each other or pair up different collectives; call fit() with the same "
                "max_steps on every rank, and give every rank its share of the eval_dataloader and "
                "the same checkpoint_manager (every rank takes part in each evaluation and save)"
            ]
        )


@pytest.mark.parametrize("world", [1, 4])
def test_a_checkpoint_resumes_at_another_world_size(trained, tmp_path, world):
    mode, source, _ = trained
    torchrun(
        str(WORKER), "resume", str(tmp_path), mode, nproc=world, env={"SOURCE_RUN": str(source)}
    )
    for seen in ranks(tmp_path, world):
        fewer = seen.pop("fewer_layers")
        assert seen == {"resumed_at": 3, "world_size": world, "steps": 4}
        assert (
            "was written with other model settings (model.n_layer: checkpoint 2, this run 1)"
            in fewer
        )


def test_ddp_checkpoints_resume_under_fsdp_and_make_the_same_update(trained, tmp_path):
    mode, source, _ = trained
    if mode != "ddp":
        pytest.skip("resumes the DDP run's single-file checkpoint")
    env = {"SOURCE_RUN": str(source)}
    torchrun(str(WORKER), "resume_into_fsdp", str(tmp_path), "fsdp", env=env)
    for seen in ranks(tmp_path, 2):
        wider = seen.pop("wider")
        assert seen == {"resumed_at": 2, "steps": 3, "muon": {"resumed_at": 2, "steps": 3}}
        assert "was written with other model settings (model.d_model: checkpoint 16, " in wider
    # Step 3 from DDP's step-2 weights, optimizer state (AdamW moments; Muon momentum) and data
    # position, now sharded: the same parameters as the DDP run's own step 3.
    for reference, resumed in [
        (source / "params_train.pt", tmp_path / "adamw" / "params_resumed.pt"),
        (tmp_path / "muon_ddp" / "params_train.pt", tmp_path / "muon" / "params_resumed.pt"),
    ]:
        expected, got = torch.load(reference), torch.load(resumed)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert (got[name] - value).abs().max() <= 1e-6, (resumed, name)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_on_cuda_with_nccl_two_ranks_match_one_process(tmp_path, mode):
    """One rank per GPU (cuda:LOCAL_RANK, NCCL): two with two GPUs, else a group of one."""
    trainer, _ = runtime.build_runtime(config(tmp_path / "single", "none"), device="cuda")
    trainer.fit()
    reference = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    out = tmp_path / mode
    nproc = min(2, torch.cuda.device_count())
    torchrun(
        str(WORKER), "train", str(out), mode, nproc=nproc, env={"SPEEDTRONIC_TEST_DEVICE": "cuda"}
    )
    params = torch.load(out / "params_train.pt", map_location="cpu")
    for name, value in reference.items():
        assert (params[name].cpu() - value).abs().max() <= 1e-5, name


def test_one_process_resumes_a_sharded_checkpoint_without_torchs_warning(trained, tmp_path):
    mode, source, _ = trained
    if mode != "fsdp":
        pytest.skip("DDP writes single-file checkpoints")
    values = config(tmp_path, "none", run={"max_steps": 4}, data={"target_batch_size": 16})
    link_checkpoint(source / "run" / "checkpoints" / "step_3.dcp", tmp_path / "run")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer, _ = runtime.build_runtime(values, resume=True)
    trainer.close()
    assert trainer.step == 3
    assert not [str(w.message) for w in seen if "torch.distributed" in str(w.message)]


def test_the_last_checkpoint_exports_to_transformers_with_the_trained_weights(trained, tmp_path):
    # A DDP step_3.pt and an FSDP2 step_3.dcp (shards gathered in one process) alike.
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    from speedtronic.artifacts import export_hf
    from speedtronic_model import build_model

    _, out, _ = trained
    # The byte tokenizer's 256 ids do not fit the 64-id model (refused); one of 64 ids does.
    small = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0")).save(str(small))
    folder = export_hf(out / "run" / "checkpoints", tmp_path / "hf", tokenizer=small)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = build_model(config(out, "none")["model"]).eval()
    ours.load_state_dict(torch.load(out / "params_train.pt"))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (theirs(ids).logits - ours(ids)["logits"]).abs().max() <= 1e-5
