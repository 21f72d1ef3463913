from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from speedtronic_data import (
    DataError,
    TokenShardDataset,
    prepare_shards,
    read_shard_tokens,
    stdlib_corpus,
    write_shard,
)


def _tokens(paths) -> list[int]:
    return [int(t) for p in paths for t in read_shard_tokens(p)]


def test_files_and_texts_become_train_and_val_shards(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("".join(f"line {i}\n" for i in range(1000)))
    lines = []
    result = prepare_shards(
        [source],
        tmp_path / "out",
        val_fraction=0.1,
        shard_tokens=2000,
        texts=["extra text\n"],
        progress=lines.append,
    )
    data = source.read_bytes() + b"extra text\n"
    assert result.train_tokens + result.val_tokens == len(data)
    assert 0 < result.val_tokens < len(data) // 5
    assert sorted(_tokens(result.val_paths) + _tokens(result.train_paths)) == sorted(data)
    val = bytes(_tokens(result.val_paths))
    # Validation is the head of each source, rounded up to a whole line; the one-line text's only
    # break is far past its 10% (1 byte), so it is cut at that byte instead.
    assert val == source.read_bytes()[: len(val) - 1] + b"e" and val.count(b"\n") > 50
    assert val.endswith(b"\ne")
    assert [p.name for p in result.train_paths][:2] == ["train_000000.bin", "train_000001.bin"]
    assert all(len(read_shard_tokens(p)) == 2000 for p in result.train_paths[:-1])
    assert len(lines) == len(result.train_paths) + len(result.val_paths) and "tokens/s" in lines[0]
    assert len(TokenShardDataset(str(tmp_path / "out" / "train_*.bin"), 16)) > 0


def test_progress_says_how_far_the_input_is_between_shard_lines(tmp_path, monkeypatch):
    # A line per shard written was all: a default shard (100M tokens) takes minutes with a subword
    # tokenizer, so a run without a progress bar (a log file, Python) said nothing meanwhile.
    from speedtronic_data import prepare as prepare_module
    from speedtronic_data import text as text_module

    source = tmp_path / "a.txt"
    source.write_text("".join(f"line {i}\n" for i in range(3000)))
    size = source.stat().st_size
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 4096)
    chunks = [len(chunk) for chunk in text_module.iter_text_chunks(source)]
    monkeypatch.setattr(prepare_module, "PROGRESS_SECONDS", 0.0)  # a line after each chunk
    lines = []
    prepare_shards([source], tmp_path / "out", val_fraction=0.0, progress=lines.append)
    *read, wrote = lines
    assert len(read) == len(chunks) > 5 and wrote.startswith("wrote ")
    share = f"{chunks[0] / size:.0%}"
    assert read[0].startswith(f"read {share} of the input ({chunks[0]:,} of {size:,} bytes): ")
    assert read[0].endswith(" tokens/s")
    assert read[-1].startswith(f"read 100% of the input ({size:,} of {size:,} bytes): {size:,} ")
    monkeypatch.setattr(prepare_module, "PROGRESS_SECONDS", 3600.0)
    lines.clear()
    prepare_shards([source], tmp_path / "out", val_fraction=0.0, progress=lines.append)
    assert len(lines) == 1  # within the interval, the shard line alone


def test_progress_through_json_lines_reaches_the_whole_file(tmp_path):
    """Progress counted a JSON Lines file's text alone against the file's size: with fields
    beside the text and non-ASCII text escaped (json.dumps' default), it ended at 24%.
    """
    source = tmp_path / "docs.jsonl"
    rows = [
        {"id": n, "url": f"https://example.com/{n}", "text": f"中文文本 第{n}行"}
        for n in range(300)
    ]
    rows[5]["text"] = None
    source.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")  # and a blank line
    calls = []
    result = prepare_shards(
        [source], tmp_path / "out", progress=None, on_progress=lambda *call: calls.append(call)
    )
    size = source.stat().st_size
    assert calls[-1][:2] == (size, size)
    assert calls[-1][2] == result.train_tokens + result.val_tokens
    assert [done for done, _, _ in calls] == sorted(done for done, _, _ in calls)


def test_a_shard_waits_in_memory_at_the_width_it_is_written_in(tmp_path, monkeypatch):
    """A shard's ids are held until it is written: as int64 a 100M-token shard took 800 MB, and
    as much again while they were joined (a uint16 shard is 200 MB).
    """
    import tracemalloc

    import speedtronic_data.text

    # Small reads, so what one read holds on its way to the shard is small beside the shard.
    monkeypatch.setattr(speedtronic_data.text, "CHUNK_BYTES", 1 << 16)

    class Codes:  # a tokenizer of 300 ids, as fast as the byte one
        vocab_size = 300

        def encode(self, text):
            return list(text.encode("utf-8"))

    source = tmp_path / "a.txt"
    source.write_text("word " * 200_000)
    tracemalloc.start()
    try:
        result = prepare_shards([source], tmp_path / "out", Codes(), 0.0, progress=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _tokens(result.train_paths) == list(source.read_bytes())
    # uint16: 2 bytes a token held and 2 joined; int64 took 16, and 2 more for a copy to write.
    assert peak < 5 * result.train_tokens, f"{peak / result.train_tokens:.1f} bytes a token"


def test_a_long_line_never_takes_a_source_into_validation(tmp_path):
    """A cut at the next line break would put a whole long line in validation: 95% of this
    source, whose only break ends its one 120 KB line.
    """
    one_line = tmp_path / "one_line.txt"
    one_line.write_text("x" * 120_000 + "\n" + "tail\n")
    short_lines = tmp_path / "short.txt"
    short_lines.write_text("".join(f"line {i}\n" for i in range(2000)))
    result = prepare_shards([one_line, short_lines], tmp_path / "out", progress=None)
    val = bytes(_tokens(result.val_paths))
    assert val[:6000] == b"x" * 6000 and val[6000:7000] != b"x" * 1000  # 5% of 120,006 bytes
    assert val[6000:].startswith(b"line 0\n")  # the short-line source still cuts at a break
    assert 0.04 < result.val_tokens / (result.val_tokens + result.train_tokens) < 0.06
    # Within half the target of a break, the cut stays at the break: before it when the next one
    # is too far.
    text = "a" * 60 + "\n" + "b" * 90 + "\n"  # 152 bytes: 50% is 76; next break 76 away, last 15
    (tmp_path / "mid.txt").write_text(text)
    result = prepare_shards([tmp_path / "mid.txt"], tmp_path / "mid", None, 0.5, progress=None)
    assert bytes(_tokens(result.val_paths)) == ("a" * 60 + "\n").encode()


def test_rerun_removes_stale_shards_and_custom_tokenizer(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("word " * 5000)
    first = prepare_shards([source], tmp_path, shard_tokens=1000, progress=None)
    assert len(first.train_paths) > 3
    second = prepare_shards(
        [source],
        tmp_path,
        tokenizer=lambda t: [7] * len(t.split()),
        shard_tokens=10**6,
        progress=None,
    )
    assert (
        sorted(tmp_path.glob("train_*.bin")) == second.train_paths and len(second.train_paths) == 1
    )
    assert set(_tokens(second.train_paths)) == {7}


def test_shards_prepare_did_not_write_are_refused_never_replaced(tmp_path):
    # llm.c's shards, or a download of them: no tokenizer_record.json beside them
    downloaded = {}
    for name in ("train_000000.bin", "train_000001.bin", "val_000000.bin"):
        downloaded[name] = write_shard(tmp_path / name, np.arange(1000)).read_bytes()
    with pytest.raises(DataError, match=r"holds 3 token shards \(train_000000.bin, ...\) that "):
        prepare_shards([], tmp_path, texts=["word " * 500], progress=None)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == downloaded
    # an interrupted prepare's part (marked unfinished) is rebuilt, as before
    (tmp_path / ".prepare_unfinished").touch()
    result = prepare_shards([], tmp_path, texts=["word " * 500], progress=None)
    assert sorted(tmp_path.glob("*.bin")) == result.train_paths + result.val_paths


def test_bad_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty out_dir was the current folder, which got the shards
    with pytest.raises(DataError, match="empty out_dir; name a folder"):
        prepare_shards([], "", texts=["some text"], progress=None)
    assert not list(tmp_path.iterdir())
    with pytest.raises(DataError, match="val_fraction"):
        prepare_shards([], tmp_path, val_fraction=1.0)
    with pytest.raises(DataError, match="no text"):
        prepare_shards([], tmp_path, progress=None)
    with pytest.raises(DataError, match="does not exist"):
        prepare_shards([tmp_path / "missing.txt"], tmp_path)
    with pytest.raises(DataError, match="shard_tokens"):
        prepare_shards([], tmp_path, shard_tokens=0)


def test_a_refused_input_or_output_leaves_no_folder(tmp_path):
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe not UTF-8")
    out = tmp_path / "new" / "out"
    with pytest.raises(DataError, match="not valid UTF-8"):
        prepare_shards([tmp_path / "binary.txt"], out, progress=None)
    assert not (tmp_path / "new").exists()  # nor the parent made for it
    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(
        DataError,
        match=r"^cannot write shards into '.*a-file/out' \(.*a-file is a file, not a folder\)",
    ):
        prepare_shards([], tmp_path / "a-file" / "out", texts=["text\n"], progress=None)


@pytest.mark.parametrize(
    ("make", "name", "fragment"),
    [
        # The shell's <(zcat corpus.gz) is a pipe: it was said not to exist.
        (os.mkfifo, "piped.txt", "is a pipe, socket or device, not a regular file; save its"),
        (os.mkfifo, "piped.jsonl", "is a pipe, socket or device, not a regular file; save its"),
        (lambda p: os.symlink(p.name, p), "loop.txt", r"is a symlink loop \(its links lead"),
        (lambda p: os.symlink("gone.txt", p), "link.jsonl", "is a symlink to gone.txt, which does"),
    ],
)
def test_an_input_that_is_no_regular_file_is_named_for_what_it_is(tmp_path, make, name, fragment):
    make(tmp_path / name)
    with pytest.raises(DataError, match=f"{name}'? {fragment}"):
        prepare_shards([tmp_path / name], tmp_path / "out", progress=None)
    assert not (tmp_path / "out").exists()


def _unreadable(path, monkeypatch):
    """Take path's read permission; where that does not stop this process (root reads any file),
    have speedtronic_data's open() refuse it as the system does.
    """
    from speedtronic_data import records, text

    path.chmod(0)
    try:
        path.open("rb").close()
    except PermissionError:
        return
    real = open

    def refusing(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real(file, *args, **kwargs)

    for module in (text, records):
        monkeypatch.setattr(module, "open", refusing, raising=False)


@pytest.mark.parametrize("name", ["locked.txt", "locked.jsonl"])
def test_an_unreadable_input_is_refused_before_any_is_tokenized(tmp_path, monkeypatch, name):
    # It was a PermissionError (exit 1 from the CLI) once every input before it was tokenized.
    (tmp_path / "first.txt").write_text("line\n" * 1000)
    (tmp_path / name).write_text(json.dumps({"text": "a document"}) + "\n")
    _unreadable(tmp_path / name, monkeypatch)
    seen = []
    with pytest.raises(DataError, match=rf"'.*{name}' cannot be read \(Permission denied\); make"):
        prepare_shards(
            [tmp_path / "first.txt", tmp_path / name],
            tmp_path / "out",
            progress=None,
            on_progress=lambda *progress: seen.append(progress),
        )
    assert not seen and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (gzip.compress(b"line\n" * 100), "is a gzip file, not text; decompress"),
        ("café\n".encode("latin-1"), r"is not valid UTF-8 near byte 3; re-encode"),
    ],
)
def test_an_input_that_is_not_text_is_refused_before_any_is_tokenized(tmp_path, content, fragment):
    # Found when it was reached, once every input before it was tokenized (hours, with a BPE).
    (tmp_path / "first.txt").write_text("line\n" * 1000)
    (tmp_path / "second.txt").write_bytes(content)
    seen = []
    with pytest.raises(DataError, match=f"second.txt' {fragment}"):
        prepare_shards(
            [tmp_path / "first.txt", tmp_path / "second.txt"],
            tmp_path / "out",
            progress=None,
            on_progress=lambda *progress: seen.append(progress),
        )
    assert not seen and not (tmp_path / "out").exists()


def test_an_input_given_twice_is_tokenized_twice_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("line\n" * 100)
    Path("b.txt").write_text("other\n" * 100)
    Path("link.txt").symlink_to("a.txt")
    Path("docs.jsonl").write_text(json.dumps({"text": "doc"}) + "\n" + json.dumps({"text": "x"}))
    docs = str(Path("docs.jsonl").resolve())  # the same file by its absolute path
    inputs = ["a.txt", "b.txt", "./a.txt", "link.txt", "docs.jsonl", docs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = prepare_shards(inputs, "out", progress=None)
    assert [str(w.message) for w in caught] == [
        "inputs given more than once are tokenized each time, so their text weighs that many "
        "times in the shards: 'a.txt' (3 times), 'docs.jsonl' (2 times); leave out the repeats "
        "unless that is meant"
    ]
    assert caught[0].filename == __file__  # the line that called prepare_shards
    # Allowed (repeating a source up-weights it): every copy is split alike, none leaks to train.
    assert result.train_tokens + result.val_tokens == 3 * 500 + 600 + 2 * len(b"doc\nx\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # distinct inputs: no warning
        prepare_shards(["a.txt", "b.txt"], "again", progress=None)


def test_a_run_that_would_write_no_validation_tokens_is_refused(tmp_path):
    # A file under 1 / val_fraction bytes gave train shards alone, exit 0: `train` with
    # data.val_shard_path then said no file matched and to run prepare, and a CLI rerun took
    # the folder for unfinished and rebuilt it, again without validation, every time.
    (tmp_path / "short.txt").write_text("hello world\n")  # 5% of 12 bytes is under one
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "one document"}) + "\n")
    for source in ("short.txt", "one.jsonl"):
        with pytest.raises(DataError, match=r"no validation tokens from \[.*\(val_fraction 0.05"):
            prepare_shards([tmp_path / source], tmp_path / "out", progress=None)
        assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match=r"raise val_fraction \(--val-fraction\), or set it to 0"):
        prepare_shards([], tmp_path / "out", texts=["hello world\n"], progress=None)
    result = prepare_shards([tmp_path / "short.txt"], tmp_path / "out", None, 0.0, progress=None)
    assert result.train_tokens == 12 and not result.val_paths  # asked for none: fine
    result = prepare_shards([tmp_path / "short.txt"], tmp_path / "out", None, 0.1, progress=None)
    assert result.val_tokens == 1 and result.train_tokens == 11  # 10% of 12 bytes: one


def test_hugging_face_tokenizer_vocab_is_enforced(tmp_path):
    class Tok:
        def get_vocab_size(self):
            return 10

        def encode(self, text):
            return [len(w) for w in text.split()]

    (tmp_path / "a.txt").write_text("a bb ccccccccccccccc")
    with pytest.raises(DataError, match="token id 15 is >= vocab_size 10"):
        prepare_shards([tmp_path / "a.txt"], tmp_path / "out", tokenizer=Tok(), progress=None)
    assert not (tmp_path / "out").exists()


def test_stdlib_corpus_is_deterministic_python_source_of_the_requested_size():
    text = stdlib_corpus(200_000)
    assert len(text.encode("utf-8")) <= 200_000 and len(text.encode("utf-8")) > 190_000
    assert text == stdlib_corpus(200_000)
    assert stdlib_corpus(50_000) == text.encode("utf-8")[:50_000].decode("utf-8", errors="ignore")
    assert "def " in text and "import " in text
    assert np.frombuffer(text.encode("utf-8"), dtype=np.uint8).max() < 256


def test_record_sources_split_by_documents(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20)))
    seen = []
    result = prepare_shards(
        [docs],
        tmp_path / "out",
        val_fraction=0.1,
        progress=None,
        on_progress=lambda done, total, tokens: seen.append((done, total, tokens)),
    )
    val, train = bytes(_tokens(result.val_paths)), bytes(_tokens(result.train_paths))
    assert val == b"doc 0\ndoc 1\n"  # the first 10% of the rows, each ending with a line break
    assert train == b"".join(f"doc {i}\n".encode() for i in range(2, 20))
    size = docs.stat().st_size  # progress counts the lines read, JSON syntax and all
    assert seen[-1] == (size, size, len(val) + len(train))
    assert result.seconds > 0 and result.tokens_per_s > 0


def test_a_tokenizer_json_prepares_and_is_recorded(tmp_path, bpe_json):
    from speedtronic_data import JsonTokenizer

    tokenizer = JsonTokenizer.from_file(bpe_json)
    (tmp_path / "a.txt").write_text("def add(a, b):\n    return a + b\n" * 50)
    result = prepare_shards([tmp_path / "a.txt"], tmp_path / "out", tokenizer, progress=None)
    ids = _tokens(result.val_paths) + _tokens(result.train_paths)
    assert tokenizer.decode(ids) == (tmp_path / "a.txt").read_text()
    assert len(ids) < len((tmp_path / "a.txt").read_bytes()) / 2  # merges happened
    assert result.tokenizer.kind == "tokenizers"
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    assert json.loads((tmp_path / "out" / "tokenizer_record.json").read_text())["vocab_size"] == (
        tokenizer.vocab_size
    )
    # A later prepare into the folder that refuses an input keeps its record and tokenizer.
    record = (tmp_path / "out" / "tokenizer_record.json").read_bytes()
    (tmp_path / "b.txt").write_bytes(b"more text\n\xff not UTF-8")
    with pytest.raises(DataError, match="not valid UTF-8"):
        prepare_shards([tmp_path / "b.txt"], tmp_path / "out", tokenizer, progress=None)
    assert (tmp_path / "out" / "tokenizer_record.json").read_bytes() == record


def test_an_in_memory_text_is_cut_between_words_not_inside_them(tmp_path, bpe_json, monkeypatch):
    # texts= (the CLI's stdlib corpus) was cut every CHUNK_BYTES characters, inside words: a BPE
    # tokenizer then encoded the halves apart, and the shards held other ids than the text has.
    from speedtronic_data import JsonTokenizer
    from speedtronic_data import text as text_module

    monkeypatch.setattr(text_module, "CHUNK_BYTES", 8)  # shorter than a line
    tokenizer = JsonTokenizer.from_file(bpe_json)
    text = "return a + b\n" * 20
    result = prepare_shards([], tmp_path, tokenizer, val_fraction=0.0, texts=[text], progress=None)
    assert _tokens(result.train_paths) == tokenizer.encode(text)


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_a_hugging_face_tokenizer_object_gets_no_special_tokens(tmp_path, library):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    tok = tokenizers.Tokenizer(WordLevel({"<s>": 0, "a": 1, "b": 2}, unk_token="<s>"))
    tok.pre_tokenizer = Whitespace()
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    if library == "transformers":  # its encode also adds them unless told not to
        tok = pytest.importorskip("transformers").PreTrainedTokenizerFast(tokenizer_object=tok)
    encoded = tok.encode("a b")
    assert getattr(encoded, "ids", encoded) == [0, 1, 2]  # a Tokenizer returns an Encoding
    result = prepare_shards([], tmp_path, tok, val_fraction=0.0, texts=["a b a\n"], progress=None)
    assert _tokens(result.train_paths) == [1, 2, 1]  # one stream: no <s> per chunk


def test_arguments_of_the_wrong_type_are_named(tmp_path):
    for kwargs, fragment in (
        ({"val_fraction": "0.1"}, "val_fraction must be a number"),
        ({"val_fraction": None}, "val_fraction must be a number"),
        ({"shard_tokens": 2.5}, "shard_tokens must be a positive integer"),
        ({"shard_tokens": "100"}, "shard_tokens must be a positive integer"),
    ):
        with pytest.raises(DataError, match=fragment):
            prepare_shards([], tmp_path / "out", texts=["some text\n"], **kwargs)


def test_one_path_or_one_text_is_not_taken_character_by_character(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} lorem ipsum\n" for i in range(200)))
    listed = prepare_shards([corpus], tmp_path / "listed", progress=None)
    for single in (str(corpus), corpus):
        alone = prepare_shards(single, tmp_path / "alone", progress=None)
        assert _tokens(alone.train_paths) == _tokens(listed.train_paths)
        assert _tokens(alone.val_paths) == _tokens(listed.val_paths)
    text = corpus.read_text()
    one = prepare_shards([], tmp_path / "one", texts=text, progress=None)
    assert _tokens(one.val_paths) == _tokens(listed.val_paths)  # one source, one split


def test_a_byte_order_mark_is_not_tokenized(tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("hello world\n" * 20)
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    runs = [prepare_shards([p], tmp_path / p.stem, progress=None) for p in (plain, marked)]
    assert _tokens(runs[0].train_paths) == _tokens(runs[1].train_paths)
    assert _tokens(runs[0].val_paths) == _tokens(runs[1].val_paths)


def test_a_run_with_no_training_tokens_keeps_the_earlier_shards(tmp_path):
    # A --val-fraction 0 folder holds train shards alone, so a rerun is not a no-op; one refused
    # for having no training tokens used to delete those shards and the record first.
    out = tmp_path / "data"
    prepare_shards([], out, val_fraction=0.0, texts=["hello world\n" * 50], progress=None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "train_000000.bin" in before and not list(out.glob("val_*.bin"))
    with pytest.raises(DataError, match="no training tokens"):
        prepare_shards([], out, val_fraction=0.9, texts=["aaaa\n"], progress=None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(DataError, match="no training tokens"):  # nor a new folder behind
        prepare_shards([], tmp_path / "new", val_fraction=0.9, texts=["aaaa\n"], progress=None)
    assert not (tmp_path / "new").exists()


def test_a_tokenizer_json_prepare_did_not_write_is_kept(tmp_path, bpe_json):
    from speedtronic_data import JsonTokenizer

    folder = tmp_path / "d"
    folder.mkdir()
    mine = folder / "tokenizer.json"
    mine.write_bytes(bpe_json.read_bytes())  # the user's own, beside the text
    (folder / "book.txt").write_text("def add(a, b):\n    return a + b\n" * 50)
    with pytest.raises(DataError, match=r"was not written by speedtronic prepare.*would delete"):
        prepare_shards([folder / "book.txt"], folder, progress=None)  # --tokenizer forgotten
    assert mine.read_bytes() == bpe_json.read_bytes() and not list(folder.glob("*.bin"))
    # Prepared with it, the copy is that very file; the record then names it as prepare's own,
    # so a later prepare with the byte tokenizer may remove it, as before.
    tokenizer = JsonTokenizer.from_file(mine)
    prepare_shards([folder / "book.txt"], folder, tokenizer, progress=None)
    assert mine.read_bytes() == bpe_json.read_bytes()
    prepare_shards([folder / "book.txt"], folder, progress=None)
    assert not mine.exists()


def test_the_users_tokenizer_json_passes_whatever_its_line_endings_or_loader(tmp_path, bpe_json):
    import tokenizers

    from speedtronic_data import JsonTokenizer

    for load in (JsonTokenizer.from_file, lambda path: tokenizers.Tokenizer.from_file(str(path))):
        folder = tmp_path / str(id(load))
        folder.mkdir()
        mine = folder / "tokenizer.json"
        mine.write_bytes(bpe_json.read_bytes().replace(b"\n", b"\r\n"))  # saved on Windows
        (folder / "book.txt").write_text("def add(a, b):\n    return a + b\n" * 50)
        prepare_shards([folder / "book.txt"], folder, load(mine), progress=None)
        assert json.loads(mine.read_text()) == json.loads(bpe_json.read_text())


def _encoder(kind: str, tokenizer_json, folder):
    """Return (tokenizer, encode) of a kind users bring, built here from a small trained model."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    if kind == "transformers GPT-2":
        transformers = pytest.importorskip("transformers")
        tokenizer.model.save(str(folder))  # vocab.json and merges.txt
        tokenizer = transformers.GPT2TokenizerFast.from_pretrained(str(folder))
        return tokenizer, lambda text: tokenizer.encode(text, add_special_tokens=False)
    return tokenizer, lambda text: tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    "kind, trained",
    [
        ("byte-level BPE", "bpe_json"),  # GPT-2's pre-tokenizer regex
        ("transformers GPT-2", "bpe_json"),
        ("Metaspace BPE", "metaspace_json"),
        ("Metaspace Unigram", "unigram_json"),
    ],
)
def test_text_encoded_in_chunks_has_the_ids_of_the_whole_text(
    tmp_path, monkeypatch, request, kind, trained
):
    # Chunks ended after a line break. GPT-2's split joins a line break to the next line's
    # indentation ("\n   " then " return"; a cut after "\n" gives "\n" then "   " " return"), and
    # Metaspace joins it to the previous word ("b\n\nclass" is one piece; a chunk "class" becomes
    # "▁class"): on the stdlib's code most cuts gave a token more or other ids. A cut
    # inside a run of spaces would give the Unigram's normalizer, which makes a run one space,
    # a "▁" more.
    import inspect

    from speedtronic_data import text as text_module

    tokenizer, encode = _encoder(kind, request.getfixturevalue(trained), tmp_path)
    text = inspect.getsource(inspect)[:40_000]  # real code: indented, blank lines
    (tmp_path / "code.py").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 1024)  # read in ~40 chunks, file and text
    result = prepare_shards(
        [tmp_path / "code.py"], tmp_path / "out", tokenizer, 0.0, texts=[text], progress=None
    )
    assert _tokens(result.train_paths) == encode(text) * 2


_PREPARE_UNDER_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from speedtronic_data import prepare_shards
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
try:
    prepare_shards([], sys.argv[1], texts=["word " * 100_000], progress=None)
except OSError as error:
    print(error)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs RLIMIT_FSIZE (POSIX)")
@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "earlier-shards"])
def test_a_shard_that_cannot_be_written_is_named_and_a_rerun_rebuilds(tmp_path, earlier):
    from speedtronic_data.tokenizer_record import is_unfinished

    script = tmp_path / "prepare.py"
    script.write_text(_PREPARE_UNDER_A_FILE_SIZE_LIMIT)
    out = tmp_path / "out"
    if earlier:  # a finished run's shards, which the failing run starts replacing
        prepare_shards([], out, texts=["word " * 1000], progress=None)
    done = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert (
        line.startswith(f"[Errno {errno.EFBIG}] cannot write token shard {out}/")
        and "\n" not in line
    )
    assert "then run prepare again" in line
    if earlier:  # the earlier shards stay marked, so training refuses them until a rerun
        assert is_unfinished(out) and list(out.glob("train_*.bin"))
    else:  # no shard landed: the folder it made goes, not left holding its unfinished mark
        assert not out.exists()
    result = prepare_shards([], out, texts=["word " * 100_000], progress=None)
    assert sorted(out.glob("*.bin")) == result.train_paths + result.val_paths
