from __future__ import annotations

import errno
import multiprocessing
import os
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from speedtronic_config import ConfigError, DataConfig, ModelConfig
from speedtronic_data import (
    DataError,
    ResumableLoader,
    ResumableSampler,
    SyntheticTokenDataset,
    TextFileTokenDataset,
    TokenShardDataset,
    build_dataloader,
    build_eval_dataloader,
    infinite_batches,
    loader_state,
    restore_loader,
    write_shard,
)


def section(**fields):
    defaults = dict(
        text_path=None,
        dataset=None,
        synthetic=True,
        num_tokens=40,
        vocab_size=256,
        block_size=8,
        micro_batch_size=4,
        num_workers=0,
        prefetch_factor=None,
        pin_memory=None,
        shuffle=False,
        drop_last=True,
        seed=7,
    )
    values = {**defaults, **fields}
    values.setdefault("target_batch_size", values["micro_batch_size"])
    return SimpleNamespace(**values)


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "train_000000.bin", rng.integers(0, 64, 400))
    write_shard(tmp_path / "train_000001.bin", rng.integers(0, 64, 300))
    write_shard(tmp_path / "val_000000.bin", rng.integers(0, 64, 100))
    return tmp_path


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"{i} lorem ipsum\n" for i in range(100)))
    return path


def test_selection_order(shards, text_file):
    dataset = SyntheticTokenDataset(8, 8, 64)
    everything = section(shard_path=str(shards / "train_*.bin"), text_path=str(text_file))
    assert build_dataloader(everything, dataset=dataset).dataset is dataset
    assert isinstance(build_dataloader(everything).dataset, TokenShardDataset)
    assert isinstance(
        build_dataloader(section(text_path=str(text_file))).dataset, TextFileTokenDataset
    )
    assert build_dataloader(section(dataset=dataset)).dataset is dataset
    synthetic = build_dataloader(section()).dataset
    assert (
        isinstance(synthetic, SyntheticTokenDataset) and len(synthetic) == 40
    )  # num_tokens = samples
    with pytest.raises(DataError, match="no data source"):
        build_dataloader(section(synthetic=False))


def test_loader_options_follow_the_rules(text_file):
    loader = build_dataloader(section(num_workers=2, drop_last=False))
    assert loader.prefetch_factor == 2 and loader.num_workers == 2 and not loader.drop_last
    assert build_dataloader(section(num_workers=1, prefetch_factor=5)).prefetch_factor == 5
    assert build_dataloader(section(), device="cuda").pin_memory
    assert not build_dataloader(section(pin_memory=False), device="cuda:0").pin_memory
    assert not build_dataloader(section(), device="cpu").pin_memory
    text = build_dataloader(section(text_path=str(text_file), shuffle=True))
    first = next(iter(text))["input_ids"][0].tolist()
    assert first == list(b"0 lorem ")  # shuffle forced off for the streamed file
    assert all(
        batch["input_ids"].shape == (4, 8) for batch in build_dataloader(section(num_tokens=10))
    )


def test_batches_are_the_contract_dict_and_vocab_override(shards):
    batch = next(
        iter(
            build_dataloader(
                section(shard_path=str(shards / "train_*.bin"), vocab_size=None), vocab_size=64
            )
        )
    )
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.bool
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    with pytest.raises(DataError, match="vocab_size 10;"):
        next(iter(build_dataloader(section(shard_path=str(shards / "train_*.bin")), vocab_size=10)))


def test_shuffle_is_seeded_and_changes_per_epoch():
    def epochs(seed):
        loader = build_dataloader(section(shuffle=True, seed=seed))
        return [[b["input_ids"].tolist() for b in loader] for _ in range(2)]

    a, b = epochs(1), epochs(1)
    assert a == b and a[0] != a[1] and a != epochs(2)


def test_a_lone_section_without_a_seed_takes_the_run_seed_default():
    from speedtronic_config import SpeedtronicConfig

    alone = DataConfig(block_size=8, vocab_size=32, num_tokens=64, shuffle=True)  # seed None
    whole = SpeedtronicConfig(data=DataConfig(block_size=8, vocab_size=32, num_tokens=64)).data
    whole.shuffle = True

    def batches(config):
        return [b["input_ids"].tolist() for b in build_dataloader(config)]

    assert batches(alone) == batches(whole) and alone.seed is None  # the caller's is untouched


def test_bad_settings_name_the_field():
    # The section is validated by speedtronic-config's DataConfig, the one definition of its rules.
    with pytest.raises(ConfigError, match=r"data.micro_batch_size: must be positive \(got 0\)"):
        build_dataloader(section(micro_batch_size=0))
    with pytest.raises(ConfigError, match="data.num_workers"):
        build_dataloader(section(num_workers=-1))
    with pytest.raises(DataError, match="data.block_size is unset"):
        build_dataloader(DataConfig())  # a bare section has no model to take the context from
    assert (
        build_dataloader(section(block_size=None)).dataset.block_size == ModelConfig().max_seq_len
    )
    with pytest.raises(DataError, match="does not exist"):
        build_dataloader(section(dataset="missing.pt"))


def test_dataset_setting_loads_saved_datasets_and_shard_globs(tmp_path, shards):
    torch.save(SyntheticTokenDataset(12, 8, 64, seed=3), tmp_path / "ds.pt")
    trusted = {"dataset": str(tmp_path / "ds.pt"), "trust_pickle": True}
    assert len(build_dataloader(section(**trusted)).dataset) == 12
    assert isinstance(
        build_dataloader(section(dataset=str(shards / "val_*.bin"))).dataset, TokenShardDataset
    )
    torch.save({"not": "a dataset"}, tmp_path / "dict.pt")
    with pytest.raises(DataError, match="holds a dict, not a torch Dataset"):
        build_dataloader(section(dataset=str(tmp_path / "dict.pt"), trust_pickle=True))


def test_a_dataset_file_torch_save_did_not_write_names_the_fix(tmp_path):
    # A text file given as data.dataset: was a bare UnpicklingError, exit 1.
    (tmp_path / "corpus.txt").write_text("hello world\n" * 100)
    with pytest.raises(DataError, match=r"corpus.txt' is not one torch.save wrote \(.*; save the"):
        build_dataloader(section(dataset=str(tmp_path / "corpus.txt"), trust_pickle=True))


def test_a_dataset_whose_class_cannot_be_imported_names_the_fix(tmp_path, monkeypatch):
    # Saved from a module this process cannot import (a script's own class): was a bare
    # ModuleNotFoundError, exit 1.
    (tmp_path / "my_datasets.py").write_text(
        "import torch\n"
        "class Rows(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 1\n"
        "    def __getitem__(self, i):\n        return torch.zeros(9, dtype=torch.long)\n"
    )
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        import my_datasets

        torch.save(my_datasets.Rows(), tmp_path / "rows.pt")
    del sys.modules["my_datasets"]
    (tmp_path / "my_datasets.py").unlink()
    with pytest.raises(DataError, match=r"rows.pt' holds a class this process cannot import \("):
        build_dataloader(section(dataset=str(tmp_path / "rows.pt"), trust_pickle=True))


def test_a_dataset_object_that_is_no_dataset_names_the_setting():
    # A Python object kept in data.dataset that is neither a Dataset nor a path: was a TypeError
    # from pathlib ("expected str, bytes or os.PathLike object"), exit 1, naming nothing.
    with pytest.raises(DataError, match=r"^data.dataset holds a SimpleNamespace, not a torch"):
        build_dataloader(section(dataset=SimpleNamespace(rows=[1, 2])))


class Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_a_pickled_dataset_is_not_unpickled_without_trust(tmp_path, capsys):
    # #19: a config file could run code: data.dataset was loaded with weights_only=False.
    torch.save(Payload(), tmp_path / "evil.pt")
    with pytest.raises(DataError, match="set data.trust_pickle: true only if you wrote it"):
        build_dataloader(section(dataset=str(tmp_path / "evil.pt")))
    assert "pickled code ran" not in capsys.readouterr().out


def test_eval_loader(shards, text_file):
    assert build_eval_dataloader(section()) is None
    loader = build_eval_dataloader(section(val_shard_path=str(shards / "val_*.bin"), shuffle=True))
    assert (
        isinstance(loader.dataset, TokenShardDataset)
        and len(loader.dataset) == 12
        and not loader.drop_last
    )
    assert [b["input_ids"].tolist() for b in loader] == [b["input_ids"].tolist() for b in loader]
    assert isinstance(
        build_eval_dataloader(section(val_text_path=str(text_file))).dataset, TextFileTokenDataset
    )
    # A bad validation path is named as the setting it came from, not as the training data's.
    with pytest.raises(DataError, match=r"^data.val_shard_path = .* matches no files"):
        build_eval_dataloader(section(val_shard_path=str(shards / "nope_*.bin")))
    with pytest.raises(DataError, match=r"^data.val_text_path .* does not exist"):
        build_eval_dataloader(section(val_text_path=str(shards / "nope.txt")))


class _Counting(IterableDataset):
    def __iter__(self):
        for i in range(30):
            yield {"input_ids": torch.full((4,), i), "labels": torch.full((4,), i)}


def _position(state):
    """Return a loader state's (epoch, batches, samples)."""
    return state["epoch"], state["batches"], state["samples"]


def _resume_cases(shards, text_file):
    return {
        "synthetic shuffled": section(shuffle=True),
        "shards shuffled": section(shard_path=str(shards / "train_*.bin"), shuffle=True),
        "shards sequential, 2 workers": section(
            shard_path=str(shards / "train_*.bin"), num_workers=2
        ),
        "text": section(text_path=str(text_file)),
        "text, 2 workers": section(text_path=str(text_file), num_workers=2, micro_batch_size=3),
    }


@pytest.mark.parametrize(
    "case",
    [
        "synthetic shuffled",
        "shards shuffled",
        "shards sequential, 2 workers",
        "text",
        "text, 2 workers",
        "unknown iterable",
    ],
)
@pytest.mark.parametrize("stop_at", [0, 3])
def test_resume_yields_exactly_the_remaining_batches(shards, text_file, case, stop_at):
    def build():
        if case == "unknown iterable":
            return build_dataloader(section(), dataset=_Counting())
        return build_dataloader(_resume_cases(shards, text_file)[case])

    reference = build()
    expected = [b["input_ids"] for _ in range(2) for b in reference]  # two epochs
    first = build()
    iterator, taken = iter(first), []
    for _ in range(stop_at):
        taken.append(next(iterator)["input_ids"])
    state = loader_state(first)
    assert _position(state) == (0, stop_at, stop_at * first.batch_size)
    resumed = build()
    restore_loader(resumed, state)
    rest = [b["input_ids"] for _ in range(2) for b in resumed]
    got = taken + rest
    per_epoch = len(expected) // 2
    assert len(got) == len(expected) and per_epoch > stop_at
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize(
    "case",
    ["synthetic shuffled", "shards shuffled", "text", "text, 2 workers", "unknown iterable"],
)
def test_a_state_saved_after_the_last_batch_of_an_epoch_resumes_in_the_next(
    shards, text_file, case
):
    # The state after an epoch's last batch is {"epoch": e, "batches": all of them}: the resumed
    # loader's first pass is the (empty) rest of epoch e, which infinite_batches steps over to
    # epoch e + 1 instead of refusing it as a loader without batches.
    def build():
        if case == "unknown iterable":
            return build_dataloader(section(), dataset=_Counting())
        return build_dataloader(_resume_cases(shards, text_file)[case])

    reference = infinite_batches(build())
    per_epoch = len(list(build()))
    expected = [next(reference)["input_ids"] for _ in range(2 * per_epoch)]
    first = build()
    stream = infinite_batches(first)
    taken = [next(stream)["input_ids"] for _ in range(per_epoch)]
    state = loader_state(first)
    assert _position(state) == (0, per_epoch, per_epoch * first.batch_size)
    resumed = build()
    restore_loader(resumed, state)
    stream = infinite_batches(resumed)
    got = taken + [next(stream)["input_ids"] for _ in range(per_epoch)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert _position(loader_state(resumed)) == (1, per_epoch, per_epoch * first.batch_size)
    plain = build()  # a for loop sees the same: the rest of epoch 0, then epoch 1
    restore_loader(plain, state)
    assert [len(list(plain)), len(list(plain))] == [0, per_epoch]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    "case", ["synthetic shuffled", "shards sequential, 2 workers", "text, 2 workers"]
)
def test_a_state_saved_after_a_for_loop_over_an_epoch_resumes_at_the_next_epoch(
    shards, text_file, case
):
    # A training loop of its own saves after `for batch in loader` ran out: the resumed loader's
    # next pass is the next epoch, as in the run that went on, not an empty rest of the last one
    # (a loop over epochs would have spent an epoch on it, training one fewer).
    config = _resume_cases(shards, text_file)[case]
    reference = build_dataloader(config)
    expected = [[b["input_ids"] for b in reference] for _ in range(3)]
    first = build_dataloader(config)
    got = [[b["input_ids"] for b in first]]
    state = loader_state(first)
    assert _position(state) == (1, 0, 0)
    resumed = build_dataloader(config)
    restore_loader(resumed, state)
    got += [[b["input_ids"] for b in resumed] for _ in range(2)]
    assert [len(epoch) for epoch in got] == [len(epoch) for epoch in expected]
    assert all(
        torch.equal(a, b)
        for mine, theirs in zip(got, expected, strict=True)
        for a, b in zip(mine, theirs, strict=True)
    )


@pytest.mark.parametrize("case", ["shards shuffled", "text"])
def test_a_resume_at_another_batch_size_continues_at_the_same_sample(shards, text_file, case):
    # A run resumed with a smaller data.micro_batch_size (a GPU with less memory) must neither
    # skip nor repeat samples: 3 batches of 4 are samples 0-11, so the next one starts at 12.
    config = _resume_cases(shards, text_file)[case]

    def batches_of(size):
        sizes = {"micro_batch_size": size, "target_batch_size": size}
        return build_dataloader(vars(config) | sizes)

    one_by_one = [batch["input_ids"][0] for batch in batches_of(1)]
    first = build_dataloader(config)
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    resumed = batches_of(6)
    assert resumed.resumes_exactly(loader_state(first))  # so the trainer warns of nothing
    restore_loader(resumed, loader_state(first))
    assert torch.equal(next(iter(resumed))["input_ids"], torch.stack(one_by_one[12:18]))


@pytest.mark.parametrize("case", ["text, 2 ranks", "unknown iterable"])
def test_a_resume_at_another_batch_size_is_exact_where_the_samples_fill_its_batches(tmp_path, case):
    # Ranks take a text file's blocks a batch at a time, and an unknown iterable dataset is
    # replayed a batch at a time: 8 samples taken in batches of 4 resume exactly in batches of 2
    # but not of 3, so only then does the trainer still warn of the changed micro_batch_size.
    path = tmp_path / "numbered.txt"
    path.write_text("".join(f"{i:04d}\n" for i in range(100)))  # block i holds "{i:04d}\n"
    ranks = 2 if case == "text, 2 ranks" else 1

    def loader(rank, batch_size):
        if case == "unknown iterable":
            return ResumableLoader(_Counting(), batch_size=batch_size)
        dataset = TextFileTokenDataset(path, block_size=5)
        return ResumableLoader(dataset, batch_size=batch_size, rank=rank, world_size=ranks)

    def blocks(batch):
        if case == "unknown iterable":
            return batch["input_ids"][:, 0].tolist()
        return [int(bytes(row.tolist())) for row in batch["input_ids"]]

    taken, states = [], []
    for rank in range(ranks):
        first = loader(rank, 4)
        iterator = iter(first)
        taken += [block for _ in range(2) for block in blocks(next(iterator))]
        states.append(first.state_dict())
    assert sorted(taken) == list(range(8 * ranks))
    for batch_size, exact in ((2, True), (3, False)):
        after = []
        for rank in range(ranks):
            resumed = loader(rank, batch_size)
            assert resumed.resumes_exactly(states[rank]) is exact
            resumed.load_state_dict(states[rank])
            iterator = iter(resumed)
            after += [block for _ in range(4) for block in blocks(next(iterator))]
        continues = sorted(after) == list(range(8 * ranks, 8 * ranks + len(after)))
        assert continues is exact, (batch_size, sorted(after))
    # A state without samples counts batches of the size it was saved at, unknown here.
    assert not loader(0, 4).resumes_exactly({"epoch": 0, "batches": 2})


@pytest.mark.parametrize("case", ["shards shuffled", "text"])
def test_resuming_over_data_that_changed_on_disk_warns(shards, text_file, case):
    config = _resume_cases(shards, text_file)[case]
    first = build_dataloader(config)
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = loader_state(first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same data: no warning
        restore_loader(build_dataloader(config), state)
    if case == "text":  # more text appended to the file
        text_file.write_text(text_file.read_text() + "appended line\n" * 20)
    else:  # the second shard prepared again from other text
        write_shard(shards / "train_000001.bin", np.arange(200) % 64)
    with pytest.warns(UserWarning, match="changed since, so training does not continue"):
        restore_loader(build_dataloader(config), state)


def test_resuming_synthetic_samples_over_a_text_file_names_each_unit(text_file):
    first = build_dataloader(section())  # 40 synthetic tokens: 40 samples
    next(iter(first))
    state = loader_state(first)
    size = text_file.stat().st_size
    with pytest.warns(UserWarning) as said:
        restore_loader(build_dataloader(section(text_path=str(text_file))), state)
    (line,) = [str(warning.message) for warning in said]
    assert f"was taken over 40 samples, but the data now holds {size} bytes of text" in line
    assert "the data changed kind since" in line
    # A state saved before the unit was recorded counts in the loader's own unit.
    del state["data_unit"]
    with pytest.warns(
        UserWarning, match=f"taken over 40 bytes of text, but the data now holds {size}:"
    ):
        restore_loader(build_dataloader(section(text_path=str(text_file))), state)


def test_calling_iter_without_drawing_does_not_start_an_epoch():
    loader = build_dataloader(section(shuffle=True))
    reference = [b["input_ids"].tolist() for b in build_dataloader(section(shuffle=True))]
    iter(loader)  # e.g. an `iter(x) is x` check
    assert [b["input_ids"].tolist() for b in loader] == reference


def test_state_round_trip_and_bad_states():
    loader = build_dataloader(section())
    list(loader)
    it = iter(loader)
    next(it)
    assert loader.state_dict() == {
        "epoch": 1,
        "batches": 1,
        "samples": 4,
        "data_size": 40,
        "data_unit": "samples",
    }
    with pytest.raises(DataError, match="not a ResumableLoader state"):
        loader.load_state_dict({"epoch": 1})
    with pytest.raises(DataError, match="'samples': int"):
        loader.load_state_dict({"epoch": 1, "batches": 2, "samples": "eight"})
    with pytest.raises(DataError, match="negative"):
        loader.load_state_dict({"epoch": -1, "batches": 0})
    with pytest.raises(DataError, match="needs a ResumableLoader"):
        loader_state([1, 2])
    with pytest.raises(DataError, match="needs a ResumableLoader"):
        restore_loader([1, 2], {"epoch": 0, "batches": 0})
    assert isinstance(loader, ResumableLoader)


# ----------------------------------------------------------- shard batches and the dataset's own
# position


def _windows(shards, block_size=8):
    """Every window of the train shards by the format's definition, read with plain numpy (not the
    dataset).
    """
    out = []
    for path in sorted(shards.glob("train_*.bin")):
        tokens = np.fromfile(path, dtype="<u2", offset=1024).astype(np.int64)
        out += [
            tokens[i * block_size : (i + 1) * block_size + 1]
            for i in range((len(tokens) - 1) // block_size)
        ]
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_shard_loader_batches_equal_the_per_window_reference(shards, shuffle, workers):
    loader = build_dataloader(
        section(
            shard_path=str(shards / "train_*.bin"),
            shuffle=shuffle,
            num_workers=workers,
            micro_batch_size=5,
        )
    )
    windows = _windows(shards)
    for _ in range(2):
        batches = list(loader)
        order = list(loader.sampler)  # the pass's order (sampler keeps the epoch the loader set)
        assert sorted(order) == list(range(len(windows))) and (order != sorted(order)) == shuffle
        assert len(batches) == len(windows) // 5
        for b, batch in enumerate(batches):
            expected = torch.from_numpy(np.stack([windows[i] for i in order[b * 5 : (b + 1) * 5]]))
            assert set(batch) == {"input_ids", "labels", "attention_mask"}
            assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long
            assert batch["attention_mask"].dtype == torch.bool and batch[
                "attention_mask"
            ].shape == (5, 8)
            assert bool(batch["attention_mask"].all())
            assert torch.equal(batch["input_ids"], expected[:, :-1]) and torch.equal(
                batch["labels"], expected[:, 1:]
            )


def _shard_run(shards, **fields):
    dataset = TokenShardDataset(str(shards / "train_*.bin"), 8, 64)
    return dataset, build_dataloader(
        section(shard_path=str(shards / "train_*.bin"), **fields), dataset=dataset
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"shuffle": True},
        {"shuffle": True, "num_workers": 2},
        {"num_workers": 2, "drop_last": False},
    ],
    ids=str,
)
@pytest.mark.parametrize("stop_at", [0, 4, 17])  # 17: in the second epoch (13 batches per epoch)
def test_dataset_state_resumes_at_exactly_the_next_batch(shards, fields, stop_at):
    _, reference = _shard_run(shards, **fields)
    expected = [(b["input_ids"], b["labels"]) for _ in range(3) for b in reference]  # three epochs
    per_epoch = len(expected) // 3
    dataset, loader = _shard_run(shards, **fields)
    taken, passes = [], 0
    while len(taken) < stop_at:  # stop mid-pass, as a preempted run does
        for batch in loader:
            taken.append((batch["input_ids"], batch["labels"]))
            if len(taken) == stop_at:
                break
        passes += 1
    state = dataset.state_dict()
    epoch, within = divmod(stop_at, per_epoch)
    assert state == {"epoch": epoch, "windows": within * 4, "num_windows": len(dataset)}
    fresh, resumed = _shard_run(shards, **fields)
    fresh.load_state_dict(state)
    assert resumed.state_dict() == {
        "epoch": epoch,
        "batches": within,
        "samples": within * 4,
        "data_size": len(dataset),
        "data_unit": "samples",
    }  # the loader shares the dataset's position
    rest = [(b["input_ids"], b["labels"]) for _ in range(3 - epoch) for b in resumed]
    got = taken + rest
    assert len(got) == len(expected)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(got, expected, strict=True)
    )


def test_dataset_state_resumes_under_another_batch_size(shards):
    dataset, loader = _shard_run(shards, shuffle=True)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = dataset.state_dict()  # 12 windows of epoch 0
    fresh, resumed = _shard_run(shards, shuffle=True, micro_batch_size=5)
    fresh.load_state_dict(state)
    assert _position(resumed.state_dict()) == (0, 3, 12)
    batch = next(iter(resumed))
    order = list(
        ResumableSampler(len(fresh), shuffle=True, seed=7)
    )  # epoch 0 of seed 7, from the start
    windows = _windows(shards)
    assert batch["input_ids"].tolist() == [windows[i][:-1].tolist() for i in order[12:17]]
    assert fresh.state_dict()["windows"] == 17 and _position(resumed.state_dict()) == (0, 4, 17)
    _, other = _shard_run(shards, shuffle=True, micro_batch_size=5)
    other.load_state_dict(resumed.state_dict())  # the loader's form keeps the exact window too
    assert next(iter(other))["input_ids"].tolist() == [
        windows[i][:-1].tolist() for i in order[17:22]
    ]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_disjoint_equal_shares_of_every_epoch(shuffle, world):
    loaders = [
        build_dataloader(section(num_tokens=41, shuffle=shuffle), rank=r, world_size=world)
        for r in range(world)
    ]
    for _ in range(2):  # two epochs: every rank's order changes with the epoch, shares stay apart
        shares = [[int(i) for i in loader.sampler] for loader in loaders]
        assert len({len(share) for share in shares}) == 1 and len(shares[0]) == 41 // world
        flat = [i for share in shares for i in share]
        assert len(set(flat)) == len(flat)  # no window on two ranks
        for loader in loaders:
            list(loader)  # the pass ends: the next one is the next epoch
    # Every rank draws the single-process order and keeps every world-th index from its rank.
    single = [int(i) for i in build_dataloader(section(num_tokens=41, shuffle=shuffle)).sampler]
    fresh = build_dataloader(section(num_tokens=41, shuffle=shuffle), rank=1, world_size=world)
    assert [int(i) for i in fresh.sampler] == single[1 : (41 // world) * world : world]


def test_a_rank_resumes_its_own_share(shards):
    def loader():
        return build_dataloader(section(shard_path=str(shards / "train_*.bin"), shuffle=True),
                                rank=1, world_size=2)  # fmt: skip

    first = loader()
    iterator = iter(first)
    seen = [next(iterator)["input_ids"] for _ in range(3)]
    state = loader_state(first)
    rest = [b["input_ids"] for b in iterator]
    resumed = loader()
    restore_loader(resumed, state)
    again = [b["input_ids"] for b in resumed]
    assert len(again) == len(rest) and all(
        torch.equal(a, b) for a, b in zip(again, rest, strict=True)
    )
    assert seen and not any(torch.equal(seen[0], b) for b in again)


@pytest.mark.parametrize("world", [1, 4])
def test_a_rank_state_loaded_at_another_world_size_is_refused(shards, world):
    # A rank's position counts its own share; at another world size the shares are other slices
    # of the data, so the count silently skipped and repeated windows.
    config = section(shard_path=str(shards / "train_*.bin"), shuffle=True)
    first = build_dataloader(config, rank=1, world_size=2)
    next(iter(first))
    state = loader_state(first)
    assert state["world_size"] == 2
    with pytest.raises(DataError, match="share of 2 data-parallel ranks, but this loader is one"):
        restore_loader(build_dataloader(config, rank=0, world_size=world), state)


def test_ranks_that_read_data_of_different_sizes_refuse_together(shards):
    from speedtronic_config.errors import raised_on_every_rank
    from speedtronic_data.rank_shares import check_rank_shares

    # Rank 1's node holds one shard of the two (a stale or partial copy): each rank dealt its
    # share from another seeded order of another size, overlapping, unequal, without a word.
    whole = section(shard_path=str(shards / "train_*.bin"), block_size=16, micro_batch_size=2)
    part = section(shard_path=str(shards / "train_000000.bin"), block_size=16, micro_batch_size=2)
    on_rank_1 = [_gathered_answer(build_dataloader(part, rank=1, world_size=2))]

    def gather(answer):  # what all_gather_object returns: rank 0's answer, then rank 1's
        return [answer, on_rank_1[0]]

    with pytest.raises(DataError) as refused:
        check_rank_shares(build_dataloader(whole, world_size=2), gather=gather)
    assert str(refused.value) == (
        "the training data differs between ranks (42 blocks on rank 0; 24 blocks on rank 1): "
        "each node reads its own copy, and ranks would train on overlapping, unequal shares; "
        "give every node the same data"
    )
    assert raised_on_every_rank(refused.value)
    on_rank_1[0] = _gathered_answer(build_dataloader(whole, rank=1, world_size=2))
    check_rank_shares(build_dataloader(whole, world_size=2), gather=gather)  # the same copy


def _gathered_answer(loader) -> object:
    """Return what check_rank_shares gives its gather on this loader's rank."""
    from speedtronic_data.rank_shares import check_rank_shares

    answers = []
    check_rank_shares(loader, gather=lambda answer: answers.append(answer) or [answer])
    return answers[0]


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_rank_left_without_a_batch_is_named_before_the_first_step(tmp_path, shards, drop_last):
    from speedtronic_config.errors import raised_on_every_rank
    from speedtronic_data.rank_shares import check_rank_shares, rank_share_problem

    # 400 + 300 tokens in windows of 16: 24 + 18 = 42 blocks, 21 per rank of 2 (all of a batch
    # of 21 on each), 10 per rank of 4 (none of a batch of 21 on any).
    data = section(
        shard_path=str(shards / "train_*.bin"),
        block_size=16,
        micro_batch_size=21,
        drop_last=drop_last,
    )
    assert rank_share_problem(build_dataloader(data, world_size=2), "training") is None
    one = section(shard_path=str(shards / "train_*.bin"), block_size=16, micro_batch_size=43)
    assert rank_share_problem(build_dataloader(one), "training") == (
        "the training data holds 700 tokens (42 blocks of 16), too few for one batch of 43 x 16 "
        "= 688 tokens (data.micro_batch_size x model.max_seq_len); use a smaller "
        "data.micro_batch_size or model.max_seq_len, or more data"
    )
    loader = build_dataloader(data, world_size=4)
    problem = rank_share_problem(loader, "training")
    if not drop_last:  # a short last batch is still a batch
        assert problem is None
        return
    assert problem.startswith(
        "the training data holds 700 tokens (42 blocks of 16), too few for 4 data-parallel ranks: "
        "each rank needs at least one batch of 21 x 16 = 336 tokens"
    )
    with pytest.raises(DataError, match="too few for 4 data-parallel ranks") as refused:
        check_rank_shares(loader)
    assert raised_on_every_rank(refused.value)  # the CLI prints it once, from rank 0
    # Streamed text deals whole batches in turn: 4 ranks need 4 of them.
    text = tmp_path / "bytes.txt"
    text.write_bytes(b"x" * (3 * 21 * 16 + 1))  # 63 blocks: 3 batches
    streamed = section(text_path=str(text), block_size=16, micro_batch_size=21, drop_last=drop_last)
    assert "data holds 1,009 tokens (63 blocks" in rank_share_problem(
        build_dataloader(streamed, world_size=4), "training"
    )
    assert rank_share_problem(build_dataloader(streamed, world_size=3), "training") is None


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize(("world", "workers"), [(2, 0), (3, 0), (2, 2)])
def test_streamed_text_gives_every_rank_the_same_whole_rounds_of_batches(
    tmp_path, drop_last, world, workers
):
    from speedtronic_data.rank_shares import rank_share_problem

    # 23 blocks of 8 in batches of 3: 7 whole batches and one of 2 blocks. Dealt in turn, some
    # rank would get a batch more than another every epoch (and start its next epoch apart).
    text = tmp_path / "bytes.txt"
    text.write_bytes(bytes(32 + i // 8 for i in range(23 * 8 + 1)))  # block k starts with 32 + k
    data = section(
        text_path=str(text), block_size=8, micro_batch_size=3, drop_last=drop_last,
        num_workers=workers,
    )  # fmt: skip
    shares = [
        [b["input_ids"][:, 0].tolist() for b in build_dataloader(data, rank=r, world_size=world)]
        for r in range(world)
    ]
    batches = [[32 + k for k in range(g * 3, min(g * 3 + 3, 23))] for g in range(8)]
    if drop_last:
        batches = batches[:7]
    rounds = len(batches) // world  # only rounds in which every rank gets a batch
    for rank, share in enumerate(shares):
        assert sorted(share) == sorted(batches[rank : rounds * world : world])
    assert rank_share_problem(build_dataloader(data, world_size=world), "training") is None


class _Refusing(torch.utils.data.Dataset):
    """Windows whose third raises `error` (a data fault found mid-epoch)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index == 2:
            raise self.error
        return {"input_ids": torch.zeros(4, dtype=torch.long), "labels": torch.zeros(4).long()}


class _TwoArgError(Exception):
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}; {fix}")


class _ShardUnreadable(OSError):
    """A dataset's own OSError, made from one message (an OSError's text, say)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _raised(dataset, workers: int) -> Exception:
    loader = build_dataloader(section(num_workers=workers, micro_batch_size=2), dataset=dataset)
    with pytest.raises(Exception) as caught:
        list(loader)
    return caught.value


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_an_error_in_a_worker_reads_as_without_workers(tmp_path):
    # A shard cut short after the dataset checked it: each worker finds it when it maps it.
    write_shard(tmp_path / "train_000000.bin", np.arange(100) % 64)
    dataset = TokenShardDataset(str(tmp_path / "train_*.bin"), 8, 64)
    with open(tmp_path / "train_000000.bin", "r+b") as handle:
        handle.truncate(1100)
    alone, in_worker = _raised(dataset, 0), _raised(dataset, 2)
    assert type(alone) is type(in_worker) is DataError
    assert str(in_worker) == str(alone) and "header promises 100 tokens" in str(alone)
    assert "Original Traceback" in str(in_worker.__cause__)  # the worker's, for debugging
    # the workers are gone while the error lives (not when a garbage collection frees it)
    assert multiprocessing.active_children() == []
    # any type rebuilt from its message alone, a multi-line message whole
    error = ValueError("bad window\nsecond line")
    assert str(_raised(_Refusing(error), 2)) == str(error)


class _RefusingStream(IterableDataset):
    """A stream whose third item raises a DataError."""

    def __iter__(self):
        for index in range(8):
            if index == 2:
                raise DataError("item 2 is bad")
            yield torch.tensor([index])


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_an_error_in_a_worker_while_a_resume_replays_batches_reads_as_without_workers():
    # An iterable dataset resumes by replaying the batches it had given: the error is in those.
    loader = ResumableLoader(_RefusingStream(), batch_size=1, num_workers=1)
    loader.load_state_dict({"epoch": 0, "batches": 4, "samples": 4})
    with pytest.raises(DataError) as caught:
        list(loader)
    assert str(caught.value) == "item 2 is bad"


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_an_os_error_in_a_worker_keeps_its_errno_and_file_names(tmp_path):
    errors = [
        FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / "it's.bin")),
        PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
        FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), tmp_path / "a: b.bin"),  # a Path
        OSError(errno.EBADF, os.strerror(errno.EBADF), 7),  # a file descriptor
        OSError(errno.EXDEV, os.strerror(errno.EXDEV), "a.bin", "b.bin"),  # two names: message only
        OSError("disk gone"),
        # its message reads as an errno's, but its constructor takes the message alone
        _ShardUnreadable(str(FileNotFoundError(errno.ENOENT, "No such file", "a.bin"))),
    ]
    for error in errors:
        raised = _raised(_Refusing(error), 2)
        assert type(raised) is type(error) and str(raised) == str(error)
        assert raised.filename == (None if error.filename2 else error.filename)
        assert raised.errno == (None if error.filename2 else error.errno)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("error", [_TwoArgError("bad", "fix it"), KeyError("input_ids")])
def test_an_error_that_cannot_be_rebuilt_stays_as_torch_raised_it(error):
    raised = _raised(_Refusing(error), 2)
    assert "in DataLoader worker process" in str(raised) and raised.__cause__ is None
