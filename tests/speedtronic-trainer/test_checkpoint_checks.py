"""Every bad or mismatched checkpoint is one line naming the file and the fix (#19: 6-22 lines,
including PyTorch's advice to load with weights_only=False)."""

from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

from speedtronic_trainer.checkpoint_checks import (
    CheckpointError,
    CheckpointMismatch,
    check_settings,
    check_tokenizer,
    load_checkpoint_file,
    restore_model,
    restore_optimizer,
)

# Sharded checkpoints come from fsdp runs (torch>=2.7); these tests write one in one process with
# dcp.save(no_dist=True), also new in 2.7.
needs_sharded_torch = pytest.mark.skipif(
    torch.__version__ < (2, 7), reason="writes a sharded checkpoint with torch>=2.7's dcp.save"
)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def bad_files(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": torch.zeros(1000)}, good)
    files = {
        "malicious": lambda p: torch.save({"x": Evil()}, p),
        "raw pickle": lambda p: p.write_bytes(pickle.dumps({"x": Evil()})),
        "numpy object": lambda p: torch.save({"x": __import__("numpy").zeros(3)}, p),
        "truncated": lambda p: p.write_bytes(good.read_bytes()[:300]),
        "garbage": lambda p: p.write_bytes(bytes(range(256)) * 8),
        "empty": lambda p: p.write_bytes(b""),
        "text": lambda p: p.write_text("hello\nworld\n"),
    }
    for name, write in files.items():
        write(tmp_path / f"{name}.pt")
    return [tmp_path / f"{name}.pt" for name in files]


def test_every_bad_file_is_one_line_never_suggesting_an_unsafe_load(tmp_path, capsys):
    for path in bad_files(tmp_path):
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint_file(path)
        message = str(caught.value)
        assert "\n" not in message, message
        assert message.startswith(f"checkpoint {path} ")
        assert "weights_only" not in message and "trust" not in message, message
    assert capsys.readouterr().err == ""  # torch's pickle-protocol UserWarning is not printed


def test_a_file_cut_anywhere_says_it_is_truncated(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": torch.zeros(1000)}, good)
    whole = good.read_bytes()
    cut = tmp_path / "cut.pt"
    # Cut at many lengths, torch fails with an OSError (EINVAL) that reads like a disk fault.
    for length in range(40, len(whole), 97):
        cut.write_bytes(whole[:length])
        with pytest.raises(CheckpointError, match=r"\.pt is truncated or corrupt \("):
            load_checkpoint_file(cut)


def test_a_malicious_pickle_names_what_it_tried_to_load(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(CheckpointError, match=r"never contains \(.*system"):
        load_checkpoint_file(path)


def test_a_folder_and_a_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint_file(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint_file(tmp_path / "nope.pt")


def model(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(11)])


def test_another_model_size_is_summarized_with_the_first_mismatch_and_the_count():
    saved = {"model": model(4).state_dict(), "checkpoint_path": "ck/step_3.pt"}
    with pytest.raises(CheckpointError) as caught:
        restore_model(model(8), saved)
    message = str(caught.value)
    assert message.startswith(
        "checkpoint ck/step_3.pt does not fit this model: size mismatch for 0.weight: "
        "checkpoint [4, 4], model [8, 8] (and 21 more)"
    )
    assert "\n" not in message


def test_a_model_mismatch_names_the_settings_that_differ():
    from speedtronic_config import SpeedtronicConfig

    ours = SpeedtronicConfig.from_dict({"model": {"d_model": 64}})
    theirs = SpeedtronicConfig.from_dict({"model": {"d_model": 32}}).to_dict()
    saved = {"model": model(4).state_dict(), "config": theirs}
    with pytest.raises(CheckpointError, match="model.d_model: checkpoint 32, this run 64"):
        restore_model(model(8), saved, ours)


def test_other_model_settings_are_refused_before_loading_even_where_shapes_fit():
    from speedtronic_config import SpeedtronicConfig

    def saved(**model):
        return {"config": SpeedtronicConfig.from_dict({"model": model}).to_dict(), "step": 4}

    ours = SpeedtronicConfig.from_dict({"model": {"d_model": 64, "n_head": 8}})
    # 4 heads of 16 and 8 heads of 8 hold the same matrices: only the settings tell them apart.
    with pytest.raises(CheckpointMismatch) as caught:
        check_settings(saved(d_model=64, n_head=4), ours)
    assert (
        "(model.n_head: checkpoint 4, this run 8; model.n_kv_head: checkpoint 4, this run 8)"
        in (str(caught.value))
    )
    # A longer context, another RoPE base or dropout keep the weights: they may change.
    changed = {"max_seq_len": 512, "rope_base": 5e5, "dropout": 0.1, "gradient_checkpointing": True}
    check_settings(saved(d_model=64, n_head=8, **changed), ours)
    check_settings({"step": 4}, ours)  # no saved config (a bare state dict): nothing to compare
    check_settings(saved(d_model=32), None)  # a trainer without a config
    adamw = SpeedtronicConfig.from_dict(
        {"model": {"d_model": 64, "n_head": 8}, "optimizer": "adamw"}
    )
    muon = SpeedtronicConfig.from_dict({"model": {"d_model": 64, "n_head": 8}, "optimizer": "muon"})
    with pytest.raises(CheckpointMismatch, match="optimizer.name: muon, but this run uses"):
        check_settings({"config": muon.to_dict()}, adamw)


def test_missing_and_unexpected_weights_and_a_match():
    target = model(4)
    saved = dict(target.state_dict())
    saved["extra"] = saved.pop("0.bias")
    with pytest.raises(CheckpointError, match="missing 0.bias .and 1 more"):
        restore_model(target, {"model": saved})
    restore_model(target, {"model": model(4).state_dict()})


class WithExtraState(torch.nn.Sequential):
    """A module keeping a non-tensor entry in its state dict (get_extra_state), as
    TransformerEngine's layers do."""

    def get_extra_state(self):
        return {"recipe": "delayed", "steps": 3}

    def set_extra_state(self, state):
        self.restored = state


@needs_sharded_torch
def test_a_sharded_checkpoint_is_checked_by_its_metadata_extra_state_included(tmp_path):
    import torch.distributed.checkpoint as dcp

    from speedtronic_trainer.sharded import sharded_model_weights

    def extra(width: int) -> WithExtraState:
        return WithExtraState(*model(width))

    path = tmp_path / "step_2.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": extra(4).state_dict()}, checkpoint_id=str(path), no_dist=True)
    saved = {"model": sharded_model_weights(path), "checkpoint_path": str(path)}
    # Its extra state is a shard entry by its name, not a missing weight.
    restore_model(extra(4), saved, load=lambda *_: None)
    with pytest.raises(CheckpointMismatch, match=r"size mismatch for 0.weight.*\(and 21 more\)"):
        restore_model(extra(8), saved, load=lambda *_: None)
    with pytest.raises(CheckpointMismatch, match="unexpected _extra_state"):
        restore_model(model(4), saved, load=lambda *_: None)


class TwoBranchOptimizer:
    """State laid out like speedtronic-optim's HybridOptimizer ({"muon": ..., "adamw": ...});
    this package's tests may not import speedtronic-optim.
    """

    def __init__(self, params) -> None:
        params = list(params)
        self.children = {
            "muon": torch.optim.SGD(params[:1], lr=0.1, momentum=0.9),
            "adamw": torch.optim.AdamW(params[1:]),
        }

    def state_dict(self):
        return {name: child.state_dict() for name, child in self.children.items()}

    def load_state_dict(self, state):
        if set(state) != set(self.children):
            raise ValueError(f"expected keys {sorted(self.children)} but got {sorted(state)}")
        for name, child in self.children.items():
            child.load_state_dict(state[name])


def optimizers():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    return torch.optim.AdamW(net.parameters()), TwoBranchOptimizer(net.parameters())


@pytest.mark.parametrize("direction", ["muon->adamw", "adamw->muon"])
def test_another_optimizer_names_both_and_the_fix(direction):
    from speedtronic_config import SpeedtronicConfig

    adamw, hybrid = optimizers()
    muon_cfg = SpeedtronicConfig.from_dict({"optimizer": "muon"})
    adamw_cfg = SpeedtronicConfig.from_dict({"optimizer": "adamw"})
    if direction == "muon->adamw":  # #19: KeyError: 'param_groups'
        saved, target, ours, fix = hybrid, adamw, adamw_cfg, "optimizer.name=muon"
        theirs = muon_cfg
    else:
        saved, target, ours, fix = adamw, hybrid, muon_cfg, "optimizer.name=adamw"
        theirs = adamw_cfg
    state = {"optimizer": saved.state_dict(), "config": theirs.to_dict()}
    with pytest.raises(CheckpointError) as caught:
        restore_optimizer(target, state, ours)
    message = str(caught.value)
    assert "adamw" in message and "muon" in message and f"--set {fix}" in message
    assert "\n" not in message


def test_without_configs_the_layout_mismatch_is_still_one_clear_line():
    adamw, hybrid = optimizers()
    with pytest.raises(CheckpointError, match=r"holds Muon \(hybrid\) optimizer state .*AdamW"):
        restore_optimizer(adamw, {"optimizer": hybrid.state_dict()})
    restore_optimizer(adamw, {"optimizer": adamw.state_dict()})


@pytest.mark.parametrize("saved, resumed", [("Adam", "SGD"), ("SGD", "Adam")])
def test_another_torch_optimizer_with_the_same_layout_is_one_clear_line(saved, resumed):
    """torch.optim loads any optimizer's state when the counts agree; without this check the
    first step after the resume failed with a bare KeyError ('momentum', 'betas')."""

    def build(name):
        net = torch.nn.Linear(4, 1)
        optimizer = getattr(torch.optim, name)(net.parameters(), lr=0.1)
        net(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        return optimizer

    state = {"optimizer": build(saved).state_dict(), "checkpoint_path": "step_3.pt"}
    with pytest.raises(CheckpointMismatch) as caught:
        restore_optimizer(build(resumed), state)
    message = str(caught.value)
    assert f"step_3.pt holds the state of another optimizer than this run's {resumed}" in message
    assert ("momentum" if resumed == "SGD" else "betas") in message and "\n" not in message
    restore_optimizer(build(resumed), {"optimizer": build(resumed).state_dict()})


def test_checkpoints_are_memory_mapped_and_the_old_format_still_loads(tmp_path, monkeypatch):
    load = torch.load
    asked: list[bool] = []

    def recording_load(*args, **kwargs):
        asked.append(kwargs.get("mmap", False))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    current, legacy = tmp_path / "step_1.pt", tmp_path / "step_0.pt"
    torch.save({"model": {"w": torch.arange(3.0)}}, current)
    torch.save({"model": {"w": torch.ones(2)}}, legacy, _use_new_zipfile_serialization=False)
    assert torch.equal(load_checkpoint_file(current)["model"]["w"], torch.arange(3.0))
    assert asked == [True]  # mapped: every rank on a machine shares the page cache's copy
    assert torch.equal(load_checkpoint_file(legacy)["model"]["w"], torch.ones(2))
    assert asked == [True, True, False]  # torch cannot map the pre-1.6 format: read instead


BPE = {"kind": "tokenizers", "vocab_size": 288, "name": "tokenizer.json", "sha256": "ab" * 32}
BYTES = {"kind": "bytes", "vocab_size": 256, "name": "bytes", "sha256": None}


def test_a_checkpoint_of_another_tokenizer_is_refused_naming_both():
    state = {"checkpoint_path": "ckpt/step_4.pt", "tokenizer": BPE}
    with pytest.raises(CheckpointMismatch) as caught:
        check_tokenizer(state, BYTES)
    message = str(caught.value)
    assert message.startswith("checkpoint ckpt/step_4.pt was trained on tokens of tokenizer.json")
    assert "(288 ids), but this run's data holds tokens of the byte tokenizer (256 ids)" in message
    assert "prepare the data with the checkpoint's tokenizer" in message and "\n" not in message
    renamed = {**BPE, "name": "bpe.json"}  # the same file under another name
    check_tokenizer(state, renamed)
    apart = r"\(288 ids, sha256 abababababab\), but .* \(288 ids, sha256 cdcdcdcdcdcd\)"
    with pytest.raises(CheckpointMismatch, match=apart):
        check_tokenizer(state, {**BPE, "sha256": "cd" * 32})  # one name and size: told apart
    check_tokenizer({"tokenizer": BYTES}, {**BYTES, "vocab_size": None})  # bytes are bytes
    check_tokenizer({"step": 4}, BYTES)  # written before the record: not checked
    check_tokenizer(state, None)  # a trainer that knows no tokenizer
