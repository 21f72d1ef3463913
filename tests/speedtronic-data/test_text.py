from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

import speedtronic_data.text as text_module
from speedtronic_data import (
    DataError,
    JsonTokenizer,
    TextFileTokenDataset,
    build_dataloader,
    collate_causal,
)

TEXT = "".join(f"line {i}: the quick brown fox é\n" for i in range(200))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _all_tokens(dataset) -> list[list[int]]:
    return [sample["input_ids"].tolist() + sample["labels"][-1:].tolist() for sample in dataset]


def test_blocks_cover_the_file_with_shifted_labels(text_file):
    ds = TextFileTokenDataset(text_file, block_size=32)
    data = list(TEXT.encode("utf-8"))
    samples = list(ds)
    assert len(samples) == (len(data) - 1) // 32
    for i, sample in enumerate(samples):
        assert sample["input_ids"].tolist() == data[i * 32 : (i + 1) * 32]
        assert sample["labels"].tolist() == data[i * 32 + 1 : (i + 1) * 32 + 1]
        assert sample["input_ids"].dtype == torch.long


def test_small_read_chunks_give_the_same_blocks(text_file, monkeypatch):
    whole = _all_tokens(TextFileTokenDataset(text_file, block_size=13))
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 7)
    assert _all_tokens(TextFileTokenDataset(text_file, block_size=13)) == whole


def test_custom_tokenizer_is_used(text_file):
    words = {}
    tokenizer = lambda text: [words.setdefault(w, len(words)) for w in text.split()]  # noqa: E731
    samples = list(
        TextFileTokenDataset(text_file, block_size=4, tokenizer=tokenizer, vocab_size=10_000)
    )
    assert samples and max(int(s["input_ids"].max()) for s in samples) < len(words)


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_a_hugging_face_tokenizer_adds_no_special_token_per_chunk(
    tmp_path, monkeypatch, bpe_json, library
):
    # The file is encoded a chunk at a time: a post-processor's BOS was added to every chunk, so
    # one landed mid-text every megabyte (here every 16 KiB).
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.processors import TemplateProcessing

    tokenizer = tokenizers.Tokenizer.from_file(str(bpe_json))
    bos = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    # 7 chunks, cut after a line break; the lines open with a letter, as a byte-level BPE's split
    # joins a line break to the next line's indentation, which no cut after it keeps.
    whole_text = "".join(f"point {i} = add(x, y)\n" for i in range(5000))
    expected = tokenizer.encode(whole_text, add_special_tokens=False).ids
    if library == "transformers":
        transformers = pytest.importorskip("transformers")
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    encoded = tokenizer.encode("add")  # a Tokenizer returns an Encoding, transformers a list
    assert getattr(encoded, "ids", encoded)[0] == bos  # the post-processor is in force
    path = tmp_path / "corpus.txt"
    path.write_text(whole_text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 1 << 14)
    streamed = _all_tokens(TextFileTokenDataset(path, 1, tokenizer, 300))
    assert [block[0] for block in streamed] + streamed[-1][1:] == expected


def test_a_transformers_subclass_with_its_own_encode_is_called_as_it_is(tmp_path, bpe_json):
    # 2.0 called encode(text): an override without add_special_tokens raised a TypeError.
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")

    class Mine(transformers.PreTrainedTokenizerFast):
        def encode(self, text):
            return super().encode(text, add_special_tokens=False)

    tokenizer = Mine(tokenizer_object=tokenizers.Tokenizer.from_file(str(bpe_json)))
    path = tmp_path / "corpus.txt"
    path.write_text("point = add(x, y)\n", encoding="utf-8")
    streamed = _all_tokens(TextFileTokenDataset(path, 1, tokenizer, 300))
    assert [block[0] for block in streamed] + streamed[-1][1:] == tokenizer.encode(
        path.read_text(encoding="utf-8")
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [2, 3])
def test_each_block_produced_once_with_workers_in_single_process_order(text_file, workers):
    ds = TextFileTokenDataset(text_file, block_size=16)
    expected = [s["input_ids"] for s in ds]
    ds.batch_size = 4
    loader = DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate_causal)
    got = [row for batch in loader for row in batch["input_ids"]]
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="data.text_path .* does not exist"):
        TextFileTokenDataset(tmp_path / "nope.txt", 8)
    with pytest.raises(DataError, match="data.val_text_path .* is a folder"):
        TextFileTokenDataset(tmp_path, 8, setting="data.val_text_path")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="is empty"):
        TextFileTokenDataset(tmp_path / "empty.txt", 8)


def test_block_size_larger_than_the_data(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abc")
    with pytest.raises(DataError, match=r"holds 3 tokens, fewer than block_size \+ 1 = 9"):
        TextFileTokenDataset(path, 8)
    ds = TextFileTokenDataset(path, 8, tokenizer=lambda t: [1] * len(t))
    with pytest.raises(DataError, match="holds 3 tokens"):
        list(ds)


def test_token_id_beyond_vocab_names_file_id_and_vocab(text_file):
    ds = TextFileTokenDataset(text_file, 8, tokenizer=lambda t: [0, 99, 5] * 10, vocab_size=50)
    with pytest.raises(DataError, match=r"corpus.txt.*token id 99 is >= vocab_size 50"):
        next(iter(ds))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tokenizer_larger_than_the_vocabulary_is_refused_when_the_loader_is_built(
    text_file, bpe_json, workers
):
    # Not at the first batch, where a worker would wrap it in a traceback: before any step.
    config = {"text_path": str(text_file), "block_size": 8, "vocab_size": 256}
    config |= {"micro_batch_size": 2, "target_batch_size": 2, "num_workers": workers}
    tokenizer = JsonTokenizer.from_file(bpe_json)
    ids = tokenizer.vocab_size
    assert ids > 256
    with pytest.raises(DataError) as refused:
        build_dataloader(config, tokenizer=tokenizer)
    assert str(refused.value) == (
        f"data.text_path {str(text_file)!r} is tokenized by tokenizer.json ({ids} ids) but "
        "data.vocab_size (model.vocab_size unless set) is 256; set model.vocab_size (and "
        f"data.vocab_size, if set) to at least {ids} or tokenize it with a tokenizer of at most "
        "256 ids"
    )
    next(iter(build_dataloader({**config, "vocab_size": ids}, tokenizer=tokenizer)))


def test_invalid_utf8_names_the_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello world " * 10 + b"\xff\xfe")
    with pytest.raises(DataError, match=r"bad.txt' is not valid UTF-8 near byte 120"):
        list(TextFileTokenDataset(path, 8))


@pytest.mark.parametrize(
    "kind, write", [("gzip", "gzip"), ("bzip2", "bz2"), ("xz", "lzma"), ("zip", None)]
)
def test_a_compressed_file_is_named_as_such(tmp_path, kind, write):
    import importlib
    import zipfile

    path = tmp_path / "corpus.txt"
    if write is None:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("corpus.txt", "hello world\n" * 100)
    else:
        path.write_bytes(importlib.import_module(write).compress(b"hello world\n" * 100))
    with pytest.raises(DataError, match=rf"corpus.txt' is a {kind} file, not text; decompress it"):
        list(TextFileTokenDataset(path, 8))


def test_a_byte_order_mark_is_dropped_and_offsets_count_it(tmp_path):
    path = tmp_path / "marked.txt"
    path.write_bytes(b"\xef\xbb\xbf" + b"hello world " * 10)
    first = next(iter(TextFileTokenDataset(path, 8)))["input_ids"]
    assert bytes(first.tolist()) == b"hello wo"
    path.write_bytes(b"\xef\xbb\xbf" + b"hello world " * 10 + b"\xff")
    with pytest.raises(DataError, match=r"marked.txt' is not valid UTF-8 near byte 123"):
        list(TextFileTokenDataset(path, 8))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("8",), "block_size must be a positive integer, got '8'"),
        ((8.0,), "block_size must be a positive integer, got 8.0"),
        ((8, None, 0), "vocab_size must be positive, got 0"),
    ],
)
def test_sizes_of_the_wrong_type_are_named(tmp_path, args, fragment):
    path = tmp_path / "corpus.txt"
    path.write_text("hello world\n" * 10)
    with pytest.raises(DataError, match=f"TextFileTokenDataset {fragment}"):
        TextFileTokenDataset(path, *args)


def test_a_file_of_one_long_line_is_read_in_bounded_chunks_cut_at_spaces(
    tmp_path, monkeypatch, bpe_json
):
    # readline() after each chunk read the rest of the line: a one-line file (text8 is 100 MB)
    # was held whole, as bytes, text and int64 ids (2 GB resident for 96 MB).
    import inspect

    from speedtronic_data import JsonTokenizer

    text = " ".join(inspect.getsource(inspect).split("\n")[:400])  # real text, one line
    path = tmp_path / "one_line.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 256)
    chunks = list(text_module.iter_text_chunks(path))
    assert "".join(chunks) == text
    assert len(chunks) > 20 and max(len(c.encode("utf-8")) for c in chunks) <= 3 * 256
    assert all(c.startswith(" ") for c in chunks[1:])  # cut before a space, not inside a word
    # so a byte-level BPE sees the same words and gives the ids of the whole text
    tokenizer = JsonTokenizer.from_file(bpe_json)
    streamed = _all_tokens(TextFileTokenDataset(path, 1, tokenizer, tokenizer.vocab_size))
    assert [t for block in streamed for t in block[:1]] + streamed[-1][1:] == tokenizer.encode(text)


def test_chunks_end_before_the_spaces_between_two_words_in_any_script(
    tmp_path, monkeypatch, bpe_json
):
    # A cut is made before a run of spaces with a non-space on each side, so a byte-level BPE
    # gives the whole text's ids. The sides are whole characters: a space beside a no-break or
    # ideographic space (whitespace to the pre-tokenizer) is no such run, and a read that ends
    # inside a character keeps it whole; text without spaces ends after a line break.
    from speedtronic_data import JsonTokenizer

    text = (
        "слово слово\u00a0 слово \u3000слово  ελληνικά κείμενο\n"
        + "日本語の文章です。\n" * 8
        + "  indented\n\tline 2\u00a0 x \u2028 y\n"
    ) * 3
    path = tmp_path / "mixed.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 23)  # ends reads inside characters
    chunks = list(text_module.iter_text_chunks(path))
    assert "".join(chunks) == text and len(chunks) > 10
    for before, chunk in itertools.pairwise(chunks):
        gap = chunk[: len(chunk) - len(chunk.lstrip(" "))]
        if gap:  # between two words
            assert not before[-1].isspace() and not chunk[len(gap)].isspace(), (before, chunk)
        else:  # no such run in two reads: after a line break
            assert before.endswith("\n"), (before, chunk)
    tokenizer = JsonTokenizer.from_file(bpe_json)
    assert [t for c in chunks for t in tokenizer.encode(c)] == tokenizer.encode(text)
