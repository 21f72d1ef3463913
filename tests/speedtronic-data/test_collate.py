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
