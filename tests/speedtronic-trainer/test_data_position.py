from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from speedtronic_trainer import BatchStream


def loader(shuffle=True, generator=None, n=10):
    return DataLoader(
        TensorDataset(torch.arange(n)), batch_size=3, shuffle=shuffle, generator=generator
    )


def take(stream, k):
    return [next(stream)[0].tolist() for _ in range(k)]


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("stop_at", [1, 3, 4, 7])
def test_resumed_stream_continues_exactly(with_generator, stop_at):
    def make():
        return BatchStream(
            loader(generator=torch.Generator().manual_seed(3) if with_generator else None)
        )

    torch.manual_seed(0)
    expected = take(make(), 12)
    torch.manual_seed(0)
    first = make()
    head = take(first, stop_at)
    state = first.state_dict()
    rng = torch.get_rng_state()
    torch.manual_seed(42)  # a new process: different RNG, fresh generator
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # the trainer restores the checkpointed RNG alongside
    assert head + take(resumed, 12 - stop_at) == expected


def test_epochs_and_consumed_are_tracked():
    stream = BatchStream(loader(shuffle=False))
    take(stream, 5)  # 4 batches per epoch (10 samples, batch 3, last partial)
    assert (stream.epoch, stream.consumed) == (1, 1)
    assert stream.state_dict()["epoch"] == 1


def test_fresh_state_without_batches_resumes_from_the_start():
    state = BatchStream(loader(shuffle=False)).state_dict()
    resumed = BatchStream(loader(shuffle=False))
    resumed.load_state_dict(state)
    assert take(resumed, 1) == [[0, 1, 2]]


def test_empty_loader_is_a_clear_error():
    with pytest.raises(ValueError, match="no batches"):
        next(BatchStream([]))


class StatefulSampler(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n, self.start = n, 0

    def __iter__(self):
        start, self.start = self.start, 0
        return iter(range(start, self.n))

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def test_stateful_sampler_is_saved_and_not_fast_forwarded():
    sampler = StatefulSampler(9)
    stream = BatchStream(DataLoader(TensorDataset(torch.arange(9)), batch_size=3, sampler=sampler))
    take(stream, 1)
    sampler.start = 3  # what a resumable sampler would report after one batch
    state = stream.state_dict()
    assert state["source"] == {"kind": "sampler", "state": {"start": 3}}
    fresh = StatefulSampler(9)
    resumed = BatchStream(DataLoader(TensorDataset(torch.arange(9)), batch_size=3, sampler=fresh))
    resumed.load_state_dict(state)
    assert take(resumed, 2) == [[3, 4, 5], [6, 7, 8]]
