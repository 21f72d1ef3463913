from __future__ import annotations

import pytest
import torch

from speedtronic_data import DataError, collate_batch, collate_causal, infinite_batches


def _example(start: int, length: int = 4) -> dict[str, torch.Tensor]:
    tokens = torch.arange(start, start + length + 1)
    return {"input_ids": tokens[:-1], "labels": tokens[1:]}


def test_collate_causal_emits_the_contract_dict():
    batch = collate_causal([_example(0), _example(10)])
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert batch["input_ids"].dtype == torch.long and batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool and bool(batch["attention_mask"].all())
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
    assert batch["input_ids"].shape == (2, 4)


def test_collate_causal_keeps_a_given_mask():
    examples = [dict(_example(0), attention_mask=torch.tensor([1, 1, 0, 0])) for _ in range(2)]
    mask = collate_causal(examples)["attention_mask"]
    assert mask.dtype == torch.bool and mask.tolist() == [[True, True, False, False]] * 2


def test_an_example_without_a_mask_is_all_true_beside_one_with_a_mask():
    # The mask of a later example was dropped (padding attended to) and one on the first
    # example alone was a KeyError.
    masked = dict(_example(0), attention_mask=torch.tensor([1, 1, 0, 0]))
    for batch, expected in (
        ([_example(0), masked], [[True] * 4, [True, True, False, False]]),
        ([masked, _example(0)], [[True, True, False, False], [True] * 4]),
    ):
        mask = collate_causal(batch)["attention_mask"]
        assert mask.dtype == torch.bool and mask.tolist() == expected


@pytest.mark.parametrize(
    ("batch", "fragment"),
    [
        ([_example(0), _example(0, length=6)], "example 1 has 6 input_ids but example 0 has 4"),
        ([{"input_ids": torch.arange(4), "labels": torch.arange(3)}], "has 3 labels but"),
        ([dict(_example(0), attention_mask=torch.ones(3))], "has 3 attention_mask but"),
    ],
)
def test_examples_of_unequal_lengths_are_named(batch, fragment):
    # Unequal lengths failed inside torch.stack, and labels shorter than the inputs passed.
    with pytest.raises(DataError, match=f"{fragment}.*pad them in the dataset"):
        collate_causal(batch)


def test_collate_causal_names_missing_keys():
    with pytest.raises(DataError, match=r"missing \['labels'\]"):
        collate_causal([{"input_ids": torch.zeros(3)}])


def test_collate_batch_tuples_and_lists():
    x, y = collate_batch([(torch.ones(2), torch.tensor(1)), (torch.zeros(2), torch.tensor(0))])
    assert x.shape == (2, 2) and y.tolist() == [1, 0]
    assert isinstance(collate_batch([[torch.ones(1), torch.ones(1)]]), list)


def test_collate_batch_rejects_ragged_and_unknown():
    with pytest.raises(DataError, match="same length"):
        collate_batch([(torch.ones(1),), (torch.ones(1), torch.ones(1))])
    with pytest.raises(DataError, match="cannot collate int"):
        collate_batch([1, 2])
    with pytest.raises(DataError, match="empty batch"):
        collate_batch([])


def test_infinite_batches_cycles_and_rejects_empty():
    stream = infinite_batches([1, 2])
    assert [next(stream) for _ in range(5)] == [1, 2, 1, 2, 1]
    with pytest.raises(DataError, match="no batches"):
        next(infinite_batches([]))
