from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speedtronic_trainer.batches import (
    batch_labels,
    batch_size_and_tokens,
    call_model,
    loss_from_output,
    move_batch,
    valid_label_count,
)

LOGITS = torch.randn(2, 3, 5)
LABELS = torch.tensor([[1, 2, -100], [4, -100, -100]])
BATCH = {"input_ids": torch.zeros(2, 3, dtype=torch.long), "labels": LABELS}
EXPECTED = F.cross_entropy(LOGITS.flatten(0, 1), LABELS.flatten(), ignore_index=-100)


@pytest.mark.parametrize(
    "output",
    [
        EXPECTED,
        {"loss": EXPECTED, "accuracy": 0.5},
        {"logits": LOGITS},
        {"loss": None, "logits": LOGITS},
        (EXPECTED, LOGITS),
        [LOGITS],
    ],
)
def test_every_output_form_yields_the_same_loss(output):
    assert torch.allclose(loss_from_output(output, BATCH), EXPECTED)


@pytest.mark.parametrize("wrap", [lambda t: t, lambda t: {"loss": t}, lambda t: (t, LOGITS)])
def test_a_one_element_loss_counts_as_a_scalar(wrap):
    # nn.DataParallel and some wrappers return a loss of shape [1]; backward() takes it, as 2.0 did.
    loss = loss_from_output(wrap(EXPECTED.reshape(1)), BATCH)
    assert loss.shape == () and torch.equal(loss, EXPECTED)


def test_logits_from_tuple_batches_use_the_second_item_as_labels():
    assert torch.allclose(loss_from_output((LOGITS,), (BATCH["input_ids"], LABELS)), EXPECTED)


@pytest.mark.parametrize(
    "output, message",
    [
        (torch.ones(3), "must be a scalar"),
        ({"accuracy": 1.0}, "without 'loss' or 'logits'"),
        ((torch.ones(2, 2),), "expected a scalar loss or 3-D logits"),
        ("loss", "unsupported model output"),
    ],
)
def test_bad_outputs_are_explained(output, message):
    with pytest.raises((TypeError, ValueError), match=message):
        loss_from_output(output, BATCH)


def test_logits_without_labels_or_with_wrong_shape():
    with pytest.raises(ValueError, match="no labels"):
        loss_from_output({"logits": LOGITS}, {"input_ids": BATCH["input_ids"]})
    with pytest.raises(ValueError, match="already be shifted"):
        loss_from_output({"logits": LOGITS}, {"labels": LABELS[:, :2]})


def test_call_model_forms():
    def model(*args, **kwargs):
        return args, kwargs

    assert call_model(model, {"a": 1}) == ((), {"a": 1})
    assert call_model(model, (1, 2, 3)) == ((1, 2), {})
    with pytest.raises(TypeError, match="at least two items"):
        call_model(model, (1,))


def test_labels_counts_and_sizes():
    assert (
        batch_labels(BATCH) is LABELS
        and batch_labels((1, LABELS)) is LABELS
        and batch_labels([1]) is None
    )
    assert valid_label_count(BATCH) == 3
    assert valid_label_count((torch.zeros(2), torch.zeros(2))) is None  # float targets: regression
    assert batch_size_and_tokens(BATCH) == (2, 6)
    assert batch_size_and_tokens((torch.zeros(4, 7), LABELS)) == (4, 28)


def test_move_batch_keeps_structure():
    moved = move_batch({"x": torch.ones(1), "nested": [torch.ones(1), "tag"]}, torch.device("cpu"))
    assert isinstance(moved["nested"], list) and moved["nested"][1] == "tag"
