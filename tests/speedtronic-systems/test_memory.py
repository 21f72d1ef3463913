from __future__ import annotations

import pytest

from speedtronic_config import ConfigError, SpeedtronicConfig
from speedtronic_systems import memory
from speedtronic_systems.memory import (
    check_training_memory,
    device_memory,
    estimate_training_memory,
    format_bytes,
    reference_parameter_count,
)


def config(**sections) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(sections)


def test_parameter_count_of_the_reference_shapes():
    # d=8, 2 heads of 4, 1 KV head, d_ff=16, vocab 10, 1 layer, tied: hand-counted.
    model = {"d_model": 8, "n_head": 2, "n_kv_head": 1, "d_ff": 16, "vocab_size": 10, "n_layer": 1}
    per_layer = 2 * 8 + 2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16
    assert reference_parameter_count(model) == (per_layer + 8 + 80, 80)
    untied = reference_parameter_count({**model, "tie_weights": False})
    assert untied == (per_layer + 8 + 160, 160)


def test_fsdp_ranks_each_hold_their_share_of_the_model_state(monkeypatch):
    # A model sharded because it does not fit one device was refused by the unsharded estimate.
    monkeypatch.setenv("WORLD_SIZE", "4")
    whole = estimate_training_memory(config(parallel={"data_parallel": "ddp"}))
    shared = estimate_training_memory(config(parallel={"data_parallel": "fsdp"}))
    assert (shared.parameters, shared.gradients, shared.optimizer_state) == (
        whole.parameters // 4,
        whole.gradients // 4,
        whole.optimizer_state // 4,
    )
    assert (shared.activations, shared.batches) == (whole.activations, whole.batches)


def test_estimate_parts_follow_the_settings():
    adamw = estimate_training_memory(config(precision="fp32"))
    count, _ = reference_parameter_count(config().model)
    assert adamw.parameters == adamw.gradients == 4 * count
    assert adamw.optimizer_state == 8 * count  # two moments
    muon = estimate_training_memory(config(precision="fp32", optimizer="muon"))
    assert muon.optimizer_state < adamw.optimizer_state
    assert muon.activations == adamw.activations
    recomputed = estimate_training_memory(
        config(precision="fp32", model={"gradient_checkpointing": True})
    )
    assert recomputed.activations < adamw.activations
    # The chunked head holds one chunk's logits and their gradient, not every token's.
    tokens = config().data.micro_batch_size * config().model.max_seq_len
    logits = 2 * config().model.vocab_size * 4  # fp32 values and gradient, per row
    chunked = estimate_training_memory(config(precision="fp32", model={"loss_chunk_size": 16}))
    assert adamw.activations - chunked.activations == (tokens - 16) * logits
    whole = estimate_training_memory(config(precision="fp32", model={"loss_chunk_size": 10**6}))
    assert whole.activations == adamw.activations  # a chunk of more rows than the batch holds
    accumulated = estimate_training_memory(config(data={"target_batch_size": 8}))
    assert accumulated.batches == 8 * adamw.batches
    assert adamw.total == sum(
        (adamw.parameters, adamw.gradients, adamw.optimizer_state, adamw.activations, adamw.batches)
    )


def test_a_custom_model_counts_only_its_batches():
    estimate = estimate_training_memory(config(model={"name": "my_model"}))
    assert estimate.parameters == estimate.activations == 0 and estimate.batches > 0


@pytest.mark.parametrize("name", ["reference_transformer", "gpt"])
def test_the_gpt_alias_is_estimated_as_the_reference_model(name):
    # `gpt` builds the same reference transformer; it used to count as a custom model of size 0,
    # so a run that could never fit passed the check and failed allocating the model.
    estimate = estimate_training_memory(config(model={"name": name}))
    assert estimate == estimate_training_memory(config())
    huge = config(model={"name": name, "n_layer": 200, "d_model": 8192, "n_head": 64})
    with pytest.raises(ConfigError, match="this run needs at least"):
        check_training_memory(huge, "cpu")


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 3_400_000, 1.2e12, 5e18)] == [
        "512 B",
        "3.4 MB",
        "1.2 TB",
        "5000.0 PB",
    ]


def test_cpu_memory_is_known_here():
    size, what = device_memory("cpu")
    assert size > 0 and what.startswith("cpu")


@pytest.mark.parametrize(
    "sections",
    [
        {"model": {"n_layer": 60000, "d_model": 4096, "n_head": 32}},  # #19: 1e20 layers hung
        {"model": {"vocab_size": 2**32, "d_model": 1024}},
        {"data": {"micro_batch_size": 2**20, "target_batch_size": 2**24}},  # held micro-batches
    ],
)
def test_a_run_that_cannot_fit_is_refused_with_the_estimate(sections):
    with pytest.raises(ConfigError) as caught:
        check_training_memory(config(**sections), "cpu")
    message = str(caught.value)
    assert "needs at least" in message and "cpu (" in message and "run.memory_check" in message
    assert "\n" not in message


def test_the_check_can_be_turned_off_and_passes_small_runs():
    huge = config(run={"memory_check": False}, model={"n_layer": 60000, "d_model": 4096})
    assert check_training_memory(huge, "cpu").total > 10**12
    assert check_training_memory(config(), "cpu").total < 10**9


def test_a_container_limit_lower_than_ram_is_the_limit(monkeypatch, tmp_path):
    limit = tmp_path / "memory.max"
    limit.write_text("1000000\n")
    monkeypatch.setattr(memory, "_CGROUP_LIMITS", (tmp_path / "absent", limit))
    assert device_memory("cpu") == (1_000_000, "cpu (container memory limit)")
    limit.write_text("max\n")  # no limit set
    assert device_memory("cpu")[1] == "cpu (RAM)"


def test_processes_on_one_machine_share_its_ram(monkeypatch):
    # torchrun --nproc_per_node N on CPU: N copies of the run draw from the one RAM, so each gets
    # 1/N of it. Found: every process compared itself with the whole RAM and N copies that
    # could not fit together all started.
    small = config()
    limit, _ = device_memory("cpu")
    fitting = limit // estimate_training_memory(small).total
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(fitting))
    check_training_memory(small, "cpu")  # exactly as many copies as fit: allowed
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(fitting + 1))
    with pytest.raises(ConfigError) as caught:
        check_training_memory(small, "cpu")
    message = str(caught.value)
    assert f"shared by {fitting + 1} processes on this machine" in message
    assert "--nproc-per-node" in message and "\n" not in message
    # The switch still turns the check off.
    check_training_memory(config(run={"memory_check": False}), "cpu")


class Peers:
    """Rank 0 of a group whose other ranks computed `theirs` (their all_gather_object values)."""

    def __init__(self, *theirs) -> None:
        self.theirs, self.gathered = theirs, 0

    def all_gather_object(self, value):
        self.gathered += 1
        return [value, *self.theirs]


def test_every_rank_refuses_when_a_peers_device_is_too_small(monkeypatch):
    # GPUs of different sizes, or nodes with different RAM: rank 1 cannot hold the run, rank 0
    # can. Found: rank 1 raised alone (marked as raised on every rank) while rank 0 went on to
    # wait for it in the next collective, until the process-group timeout.
    small = config()
    fits = check_training_memory(small, "cpu", Peers(None))
    assert fits == estimate_training_memory(small)
    theirs = ("this run needs at least 2 GB of memory, but cuda:1 (GPU) has 1 GB", "lower it")
    with pytest.raises(ConfigError) as caught:
        check_training_memory(small, "cpu", Peers(None, theirs))
    assert str(caught.value) == (
        "on rank 2, this run needs at least 2 GB of memory, but cuda:1 (GPU) has 1 GB; lower it"
    )
    # Every rank too small: the same line on each, without a rank.
    monkeypatch.setattr(memory, "device_memory", lambda device: (1000, "cuda:0 (GPU)"))
    with pytest.raises(ConfigError, match=r"^this run needs at least .* cuda:0 \(GPU\) has 1.0 kB"):
        check_training_memory(small, "cuda", Peers(theirs))
    # With the check off no rank computes it, so none takes part in a collective for it.
    group = Peers(theirs)
    check_training_memory(config(run={"memory_check": False}), "cpu", group)
    assert group.gathered == 0
