"""A user's own `transformers` causal LM (random-init from a config, no download) trained with the
trainer: the loss is transformers' own, padding is excluded, accumulation and features hold.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from trainer_testkit import RecordingHook, make_config

from speedtronic_trainer import MetricLogger, Trainer

transformers = pytest.importorskip("transformers")

VOCAB, WIDTH = 48, 16


def _decoder(family: str, tied: bool = False):
    """A tiny random-init Llama-style causal LM of transformers' `family` (Llama, Qwen2, ...)."""
    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    return getattr(transformers, f"{family}ForCausalLM")(config)


def _llama(tied: bool = False):
    return _decoder("Llama", tied)


def _gpt2():
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=2, n_head=2, n_positions=32, **no_dropout
    )
    return transformers.GPT2LMHeadModel(config)


BUILDERS = {
    "llama": _llama,
    "qwen2": lambda: _decoder("Qwen2"),
    "mistral": lambda: _decoder("Mistral"),
    "gpt2": _gpt2,
}


def padded_batches(count: int, rows: int = 2, width: int = 8, seed: int = 1) -> list[dict]:
    """Batches in the trainer's contract (labels shifted, -100 ignored); row 1 of each is
    right-padded by a different amount, its padded positions masked and ignored.
    """
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for index in range(count):
        ids = torch.randint(1, VOCAB, (rows, width), generator=generator)
        mask = torch.ones(rows, width, dtype=torch.bool)
        pad = 2 + index % 3
        ids[1, -pad:], mask[1, -pad:] = 0, False
        labels = torch.full_like(ids, -100)
        labels[:, :-1] = ids[:, 1:]
        labels[~torch.roll(mask, -1, dims=1)] = -100  # no label points at a padded token
        batches.append({"input_ids": ids, "labels": labels, "attention_mask": mask})
    return batches


def transformers_loss(model, batch: dict) -> float:
    """transformers' own loss for the batch: its unshifted labels, pads ignored."""
    labels = batch["input_ids"].masked_fill(~batch["attention_mask"], -100)
    with torch.no_grad():
        output = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels
        )
    return output.loss.item()


def make_trainer(model, batches, *, micro=2, target=2, sections=None, lr=0.0, stream=None):
    config = make_config(
        data={"micro_batch_size": micro, "target_batch_size": target}, **(sections or {})
    )
    logger = MetricLogger(stream=stream or io.StringIO(), hooks=[RecordingHook()])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return Trainer(model, optimizer, batches, device="cpu", config=config, logger=logger)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_reported_loss_is_transformers_own_loss_on_padded_batches(name):
    torch.manual_seed(0)
    model = BUILDERS[name]()
    batches = padded_batches(2)
    expected = [transformers_loss(model, batch) for batch in batches]
    trainer = make_trainer(model, batches)  # lr 0: both steps score the same weights
    trainer.fit(2)
    losses = trainer.logger.hooks[0].values("train_step", "loss")
    assert losses == [pytest.approx(value, abs=1e-5) for value in expected]
    # `tokens` (and tokens/s) count input positions, pads included (docs/concepts.md#metrics).
    assert trainer.tokens == sum(batch["input_ids"].numel() for batch in batches)


def test_a_model_its_user_compiled_is_seen_as_itself():
    """torch.compile wraps a model in an OptimizedModule. Seen as it, GPT-2 was handed the
    shifted labels, shifted them again and learnt the token after next, silently; and its
    checkpoint held `_orig_mod.` keys that fitted no uncompiled GPT-2.
    """
    torch.manual_seed(0)
    model = _gpt2()
    stream = io.StringIO()
    trainer = make_trainer(torch.compile(model, backend="eager"), padded_batches(1), stream=stream)
    assert "GPT2LMHeadModel shifts labels itself" in stream.getvalue()
    state = trainer.state_dict()
    assert set(state["model"]) == set(model.state_dict())
    assert state["model_class"] == "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"
    # Such a checkpoint written before (`_orig_mod.` keys) resumes into the model too.
    for weights in (state["model"], trainer.model.state_dict()):
        plain = make_trainer(_gpt2(), padded_batches(1))
        plain.resume({**state, "model": weights})
        assert torch.equal(plain.model.lm_head.weight, model.lm_head.weight)


def test_accumulated_padded_microbatches_train_as_one_batch():
    """Two microbatches with different numbers of valid labels update the weights as their
    concatenation does: each weighs by its labels, not by one half.
    """

    def trained(micro):
        torch.manual_seed(0)
        model = _llama()
        batches = padded_batches(2)
        if micro == 4:
            batches = [{key: torch.cat([b[key] for b in batches]) for key in batches[0]}]
        make_trainer(model, batches, micro=micro, target=4, lr=0.5).fit(1)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.allclose(trained(2), trained(4), atol=1e-6)


def test_gradient_checkpointing_switches_on_a_transformers_models_own():
    """`gradient_checkpointing: true` recomputes a transformers model's decoder layers in the
    backward pass (its gradient_checkpointing_enable()), as `speedtronic.set_gradient_
    checkpointing` does; it warned and trained without.
    """

    def run(enabled):
        torch.manual_seed(0)
        model = _llama()
        calls = []
        # Inside the checkpointed layer: its recomputation in backward calls it again.
        model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
        stream = io.StringIO()
        trainer = make_trainer(
            model,
            padded_batches(1),
            sections={"gradient_checkpointing": enabled},
            lr=0.1,
            stream=stream,
        )
        loss = trainer.fit(1).final_loss
        return len(calls), loss, stream.getvalue()

    plain_calls, plain_loss, _ = run(False)
    calls, loss, log = run(True)
    assert "set_gradient_checkpointing" not in log
    assert (plain_calls, calls) == (1, 2)  # the layer ran again in backward
    assert loss == pytest.approx(plain_loss, abs=1e-6)


def test_unshifted_labels_are_refused_before_a_transformers_model_learns_to_copy():
    """transformers' own convention is labels = input_ids (the model shifts them); the trainer's
    labels are shifted already and the model is called without them, so such a batch trained it
    to predict the token it was given (the loss fell towards 0) without a word.
    """
    torch.manual_seed(0)
    model = _llama()
    batches = padded_batches(1)
    unshifted = dict(batches[0])
    unshifted["labels"] = unshifted["input_ids"].masked_fill(~unshifted["attention_mask"], -100)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = make_trainer(model, [unshifted], lr=0.1)
    with pytest.raises(ValueError, match=r"labels equal input_ids .* not shifted"):
        trainer.fit(1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # Shifted labels of a constant row also equal its input ids: those train.
    constant = {key: value.clone() for key, value in batches[0].items()}
    constant["input_ids"][:], constant["labels"][:] = 5, 5
    constant["labels"][:, -1] = -100
    constant["attention_mask"][:] = True
    assert make_trainer(_llama(), [constant]).fit(1).steps == 1
    # Validation batches of that form would score copying the input: refused alike.
    checked = make_trainer(_llama(), batches)
    checked.eval_dataloader = [unshifted]
    with pytest.raises(ValueError, match=r"labels equal input_ids .* give the eval_dataloader"):
        checked.evaluate()
    checked.eval_dataloader = batches
    assert checked.evaluate() is not None


def test_a_checkpoint_names_the_models_class_and_a_resume_into_another_names_both(tmp_path):
    """A checkpoint of Trainer(config=..., model=<transformers model>) described its weights only
    by the config's default `model.name: reference_transformer`; it records the model's class,
    and a resume into a model of another class names both instead of only a missing weight.
    """
    from speedtronic_trainer import CheckpointManager, CheckpointMismatch

    def trainer(model):
        manager = CheckpointManager(tmp_path, every_steps=1)
        config = make_config(data={"micro_batch_size": 2, "target_batch_size": 2})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        batches = padded_batches(1)
        return Trainer(
            model, optimizer, batches, device="cpu", config=config, checkpoint_manager=manager
        )

    first = trainer(_gpt2())
    first.fit(1)
    state = first.checkpoint_manager.load_latest()
    assert state["config"]["model"]["name"] == "reference_transformer"  # the config's, as given
    gpt2 = "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"
    assert state["model_class"] == gpt2
    llama = "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    with pytest.raises(CheckpointMismatch, match=f"holds a {gpt2}'s weights, .* is a {llama}"):
        trainer(_llama()).resume(state)
    trainer(_gpt2()).resume(state)  # its own class resumes
    # A sharded (.dcp) one alike, checked by its .metadata: it failed in DCP's load with "could
    # not be loaded (RuntimeError: Missing key ...); move it out of the checkpoints folder".
    folder = tmp_path / "step_1.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": state.pop("model")}, checkpoint_id=str(folder), no_dist=True)
    state.pop("optimizer")
    with pytest.raises(CheckpointMismatch, match=f"holds a {gpt2}'s weights, .* is a {llama}"):
        trainer(_llama()).resume({**state, "sharded": str(folder)})
