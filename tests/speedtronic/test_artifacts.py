"""export_hf and sample_text against the real transformers: same logits, same greedy tokens, same
text; and export -> model.init_from -> export round trips byte for byte.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from interop_testkit import noisy_checkpoint, prepare, run_config

from speedtronic.artifacts import (
    export_checkpoint,
    export_hf,
    load_checkpoint_model,
    load_exported,
    resolve_tokenizer,
    sample_text,
)
from speedtronic.errors import UsageError
from speedtronic_config import ConfigError

MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors"}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, byte_shards) -> Path:
    run = tmp_path_factory.mktemp("run")
    return noisy_checkpoint(run_config(run, byte_shards, tie_weights=False), step=4)


def test_export_is_a_folder_transformers_loads_with_equal_logits(tmp_path, checkpoint):
    transformers = pytest.importorskip("transformers")
    out = export_hf(checkpoint, tmp_path / "hf")
    assert {p.name for p in out.iterdir()} == MODEL_FILES | TOKENIZER_FILES | {"README.md"}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ours, _ = load_checkpoint_model(checkpoint)
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (ours(ids)["logits"] - theirs(ids).logits).abs().max().item()
    assert difference <= 1e-5, difference


def test_greedy_generate_equals_sample_at_temperature_0(tmp_path, checkpoint):
    transformers = pytest.importorskip("transformers")
    out = export_hf(checkpoint, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = "def f(é):"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == list(prompt.encode())
    new = 32 - ids.size(1)  # within the context: past it sample slides its window, Llama does not
    generated = model.generate(ids, max_new_tokens=new, do_sample=False)[0].tolist()
    ours, _ = load_checkpoint_model(checkpoint)
    assert generated == ours.generate(ids, new, temperature=0)[0].tolist()
    # the noisy weights emit ids past 255 and invalid UTF-8: both sides decode them alike
    assert max(generated) >= 256 and tokenizer.decode(generated) == sample_text(
        checkpoint, prompt, max_new_tokens=new, temperature=0
    )


def test_sample_stops_at_the_tokenizers_eos_as_transformers_generate_does(tmp_path, bpe_json):
    # sample ran on past <|endoftext|>, which the export's generation_config names: greedy text
    # differed from transformers' generate, which stops there.
    transformers = pytest.importorskip("transformers")
    shards = prepare(tmp_path / "shards", bpe_json)
    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", shards, tie_weights=False), step=4)
    out = export_hf(checkpoint, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert model.generation_config.eos_token_id == 0  # <|endoftext|>
    ours, _ = load_checkpoint_model(checkpoint)

    def encode(text):
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids

    def emits_eos(token):  # its text encodes back to that one token, and greedy emits eos
        ids = encode(tokenizer.decode([token]))
        return ids.tolist() == [[token]] and 0 in ours.generate(ids, 24, temperature=0)[0, 1:]

    prompt = tokenizer.decode([next(filter(emits_eos, range(1, 300)))])
    theirs = model.generate(encode(prompt), max_new_tokens=24, do_sample=False)[0].tolist()
    assert theirs[-1] == 0 and len(theirs) < 25  # transformers stops at eos
    text = sample_text(checkpoint, prompt, max_new_tokens=24, temperature=0)
    assert text == tokenizer.decode(theirs) and text.endswith("<|endoftext|>")


def test_export_import_export_is_byte_identical(tmp_path, checkpoint, byte_shards):
    first = export_hf(checkpoint, tmp_path / "first")
    config = run_config(tmp_path / "run2", byte_shards, tie_weights=False)
    config["model"]["init_from"] = f"hf:{first}"
    again = noisy_checkpoint(config, step=0, noise=0.0)  # the imported weights, saved unchanged
    second = export_hf(again, tmp_path / "second")
    for name in MODEL_FILES | TOKENIZER_FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_bpe_run_exports_its_tokenizer(tmp_path, bpe_json):
    transformers = pytest.importorskip("transformers")
    from speedtronic_data import JsonTokenizer, prepare_shards

    text = "def add(a, b):\n    return a + b\n" * 300
    shards = tmp_path / "shards"
    prepare_shards([], shards, JsonTokenizer.from_file(bpe_json), texts=[text], progress=None)
    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", shards))
    out = export_hf(checkpoint, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert (model.config.bos_token_id, model.config.eos_token_id) == (0, 0)
    assert tokenizer.eos_token == "<|endoftext|>"
    ids = tokenizer("return a", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert tokenizer.decode(generated[0]) == sample_text(
        checkpoint, "return a", max_new_tokens=8, temperature=0
    )


def test_a_recorded_tokenizer_whose_shards_moved_is_asked_for_by_name(tmp_path, bpe_json):
    prepare(tmp_path / "shards", bpe_json)
    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", tmp_path / "shards"))
    # The run's tokenizer.json saved again (as transformers' save_pretrained does): other bytes,
    # the same ids. It passes while the shards' copy is there to compare it with.
    saved_again = tmp_path / "saved-again" / "tokenizer.json"
    saved_again.parent.mkdir()
    saved_again.write_text(json.dumps(json.loads(bpe_json.read_text(encoding="utf-8"))))
    greedy = sample_text(checkpoint, "def ", max_new_tokens=4, temperature=0.0)
    assert (
        sample_text(checkpoint, "def ", max_new_tokens=4, temperature=0.0, tokenizer=saved_again)
        == greedy
    )
    shutil.rmtree(tmp_path / "shards")
    with pytest.raises(UsageError, match=r"another file.*sha256") as error:
        sample_text(checkpoint, "def ", tokenizer=saved_again)
    given, recorded = re.findall(r"sha256 ([0-9a-f]{12})\)", str(error.value))
    assert given != recorded, str(error.value)  # each file named by its own sha256
    with pytest.raises(UsageError, match="cannot tell which tokenizer") as error:
        export_hf(checkpoint, tmp_path / "hf")
    # --tokenizer bytes would be refused for this checkpoint: the hint names the one it records
    assert "--tokenizer bytes" not in str(error.value)
    assert re.search(r"pass \S+ \([\d,]+ ids\), which the checkpoint records", str(error.value))


def test_a_custom_registered_model_does_not_map(tmp_path, byte_shards):
    from speedtronic_model import register_model

    class Bigram(torch.nn.Module):
        def __init__(self, vocab_size, **_):
            super().__init__()
            self.table = torch.nn.Embedding(vocab_size, vocab_size)

        def forward(self, input_ids, labels=None, **_):
            logits = self.table(input_ids)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return {"logits": logits, "loss": loss}

    register_model("hf_test_bigram", Bigram)
    config = run_config(tmp_path / "run", byte_shards)
    config["model"]["name"] = "hf_test_bigram"
    checkpoint = noisy_checkpoint(config)
    with pytest.raises(ConfigError, match="Bigram does not map onto transformers' Llama.*table"):
        export_hf(checkpoint, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_custom_generate_sample_cannot_call_is_a_usage_error(tmp_path):
    # Its TypeError ("unexpected keyword argument 'temperature'") was a runtime failure, exit 1.
    from speedtronic_model import register_model

    class Echo(torch.nn.Module):
        def __init__(self, vocab_size, **_):
            super().__init__()
            self.table = torch.nn.Embedding(vocab_size, vocab_size)

        def forward(self, input_ids, **_):
            return {"logits": self.table(input_ids)}

        def generate(self, input_ids, max_new_tokens, do_sample=True):  # transformers' keywords
            return input_ids

    register_model("sample_test_echo", Echo)
    model = {"name": "sample_test_echo", "vocab_size": 256, "max_seq_len": 8}
    config = {"run": {"device": "cpu", "output_dir": str(tmp_path)}, "model": model}
    checkpoint = noisy_checkpoint(config | {"data": {"num_tokens": 8}})
    with pytest.raises(UsageError) as error:
        sample_text(checkpoint, "x", tokenizer="bytes")
    assert str(error.value) == (
        f"{checkpoint}: model 'sample_test_echo' has a generate(input_ids, max_new_tokens, "
        "do_sample=True) that sample cannot call; sample needs one taking (input_ids, "
        "max_new_tokens, temperature=, top_k=), as the reference model has"
    )


def test_the_tokenizer_must_be_known(tmp_path, checkpoint, byte_shards, bpe_json):
    _, config = load_checkpoint_model(checkpoint)
    config.data.shard_path = str(tmp_path / "moved" / "train_*.bin")
    with pytest.raises(UsageError, match="cannot tell which tokenizer.*--tokenizer bytes"):
        resolve_tokenizer(config)
    assert type(resolve_tokenizer(config, strict=False)).__name__ == "CharTokenizer"
    assert resolve_tokenizer(config, bpe_json).vocab_size > 256
    with pytest.raises(UsageError, match="no such file"):
        resolve_tokenizer(config, tmp_path / "missing.json")
    from tokenizers import Tokenizer, models

    big = tmp_path / "big.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(400)}, unk_token="w0")).save(str(big))
    with pytest.raises(UsageError, match="big.json \\(400 ids\\), but the checkpoint was trained"):
        export_hf(checkpoint, tmp_path / "hf", tokenizer=big)
    legacy = without_tokenizer_record(checkpoint, tmp_path / "legacy")  # vocabulary still checked
    with pytest.raises(UsageError, match="tokenizer has 400 ids but the model only 300"):
        export_hf(legacy, tmp_path / "hf", tokenizer=big)


def test_a_byte_level_tokenizer_json_passes_for_a_byte_level_checkpoint(tmp_path, checkpoint):
    # What export writes for a byte-level run maps every byte to itself: the same ids (interop.md).
    pytest.importorskip("tokenizers")  # reading a tokenizer.json needs it (an optional extra)
    first = export_hf(checkpoint, tmp_path / "hf")
    greedy = sample_text(checkpoint, "def ", max_new_tokens=4, temperature=0.0)
    assert (
        sample_text(checkpoint, "def ", max_new_tokens=4, temperature=0.0, tokenizer=first)
        == greedy
    )
    again = export_hf(checkpoint, tmp_path / "again", tokenizer=first / "tokenizer.json")
    assert (again / "tokenizer.json").is_file()


def test_exports_get_the_usual_permissions(tmp_path, checkpoint):
    # #19: safetensors (and mkstemp) created exports 0600, unreadable to the group they are
    # shared with.
    import os

    from speedtronic.artifacts import export_checkpoint

    umask = os.umask(0o022)
    os.umask(umask)
    out = export_checkpoint(checkpoint, tmp_path / "plain")
    hf = export_hf(checkpoint, tmp_path / "hf")
    files = [p for folder in (out, hf) for p in folder.iterdir()]
    assert files and not [p for p in files if p.name.startswith(".")]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o666 & ~umask}


def test_a_malicious_checkpoint_is_refused_in_one_line_for_sample_and_export(tmp_path):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model": Evil(), "config": {}}, tmp_path / "evil.pt")
    with pytest.raises(UsageError) as caught:
        load_checkpoint_model(tmp_path / "evil.pt")
    message = str(caught.value)
    assert "\n" not in message and "weights_only" not in message
    assert "never contains" in message


def test_sample_leaves_the_global_rng_alone_and_keeps_each_seeds_text(checkpoint):
    # sample_text called torch.manual_seed(seed): a caller's global RNG stream was reset.
    from speedtronic_data import CharTokenizer

    model, _ = load_checkpoint_model(checkpoint)
    prompt = torch.tensor([list(b"def ")])
    args = {"max_new_tokens": 40, "temperature": 1.0}  # past max_seq_len 32: the window slides
    for seed in (0, 3):
        torch.manual_seed(seed)  # what a seed gave before: the global generator, reseeded
        before = CharTokenizer().decode(model.generate(prompt, **args)[0].tolist())
        torch.manual_seed(1234)
        state = torch.get_rng_state()
        assert sample_text(checkpoint, "def ", seed=seed, tokenizer="bytes", **args) == before
        assert torch.equal(torch.get_rng_state(), state)


def test_a_generate_without_a_generator_samples_in_a_forked_rng():
    from speedtronic.artifacts import _seeded_generate

    class Custom:  # a user's model: generate(ids, n, temperature=, top_k=) on the global RNG
        def generate(self, ids, n, temperature=1.0, top_k=None):
            return torch.randint(0, 256, (1, n))

    torch.manual_seed(3)
    expected = torch.randint(0, 256, (1, 5))
    state = torch.get_rng_state()
    assert torch.equal(_seeded_generate(Custom(), 3, None, 5, temperature=1.0), expected)
    assert torch.equal(torch.get_rng_state(), state)


def test_sample_escapes_control_characters_only_on_a_terminal(checkpoint, capsys, monkeypatch):
    from speedtronic.cli import main

    args = ["sample", str(checkpoint), "--max-new-tokens", "64", "--temperature", "2"]
    raw = sample_text(checkpoint, "\n", max_new_tokens=64, temperature=2.0)
    controls = [c for c in raw if (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0) and c not in "\n\t"]
    assert controls  # the noisy weights emit raw bytes, control characters among them
    assert main(args) == 0
    assert capsys.readouterr().out == raw + "\n"  # to a file or pipe: as generated
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert not [c for c in shown if c in controls] and f"\\x{ord(controls[0]):02x}" in shown


def ascii_stdout(monkeypatch) -> io.TextIOWrapper:
    """An ASCII stdout, as PYTHONIOENCODING=ascii leaves it (a Windows code page, redirected to a
    file, lacks most characters too).
    """
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii", write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    return stream


def test_sample_writes_what_stdouts_encoding_lacks_as_escapes(checkpoint, monkeypatch):
    # Printing the text raised UnicodeEncodeError: exit 1 after the whole generation.
    from speedtronic.cli import main

    raw = sample_text(checkpoint, "é", max_new_tokens=8)
    stream = ascii_stdout(monkeypatch)
    assert main(["sample", str(checkpoint), "--prompt", "é", "--max-new-tokens", "8"]) == 0
    shown = stream.buffer.getvalue().decode("ascii")
    assert shown == raw.encode("ascii", "backslashreplace").decode() + "\n"
    assert shown.startswith("\\xe9") and stream.errors == "strict"  # the caller's stream kept


@pytest.mark.parametrize("given", ["latest", ".", "run folder"])
def test_sample_and_export_follow_the_latest_pointer_or_the_folder(tmp_path, checkpoint, given):
    from speedtronic.cli import main

    assert checkpoint.parent.name == "checkpoints"
    # `latest` names step_4.pt, the fixture's save; the run folder holds checkpoints/
    pointer_or_folder = (
        checkpoint.parent.parent if given == "run folder" else checkpoint.parent / given
    )
    args = {"max_new_tokens": 8, "temperature": 0.0}
    assert sample_text(pointer_or_folder, "x", **args) == sample_text(checkpoint, "x", **args)
    assert main(["export", str(pointer_or_folder), str(tmp_path / "out")]) == 0
    assert load_exported(tmp_path / "out").state_dict().keys()


def test_a_folder_without_checkpoints_names_what_to_pass(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(UsageError) as caught:
        sample_text(tmp_path / "checkpoints", "x")
    assert str(caught.value) == (
        f"{tmp_path / 'checkpoints'}: no step_<n>.pt or step_<n>.dcp checkpoint in "
        f"{tmp_path / 'checkpoints'}; pass a run's checkpoints folder, its latest file or one of "
        "its step checkpoints"
    )


def test_a_bad_hub_repository_id_is_refused_before_anything_is_exported(
    tmp_path, checkpoint, capsys
):
    from speedtronic.cli import main

    out = tmp_path / "hf"
    args = ["export", str(checkpoint), str(out), "--format", "hf", "--push-to-hub", "not a repo!!"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedtronic export: --push-to-hub 'not a repo!!': not a repository id")
    assert err.count("\n") == 1 and not out.exists()


def test_the_run_summary_sample_is_escaped_and_indented():
    from speedtronic.report import _sample

    def generated(*_, **__) -> str:
        return "x\x1b[2Jy\r\nz\tw"

    assert _sample(generated, Path("unused"), 256) == "\n    x\\x1b[2Jy\\x0d\n    z\tw"


def test_the_run_summary_samples_a_vocabulary_too_small_for_its_prompt(tmp_path, capsys):
    # "def " is bytes 100-102: past a 100-id vocabulary, the summary was "sample: skipped
    # (--prompt: token id 102 is past ...)", naming a --prompt no one passed.
    from types import SimpleNamespace

    from speedtronic.report import print_run_summary

    model = {"vocab_size": 100, "max_seq_len": 32, "n_layer": 1, "n_head": 2, "d_model": 16}
    config = {
        "run": {"device": "cpu", "output_dir": str(tmp_path / "run")},
        "model": model,
        "data": {"synthetic": True, "num_tokens": 8, "block_size": 32},
    }
    checkpoint = noisy_checkpoint(config)
    _, saved = load_checkpoint_model(checkpoint)
    result = SimpleNamespace(steps=1, steps_run=1, final_loss=4.6, elapsed_s=1.0, metrics={})
    print_run_summary(saved, result, checkpoint)
    out = capsys.readouterr().out
    assert "\nsample:\n    " in out and "skipped" not in out, out
    saved.model.vocab_size = 10  # below every byte of both prompts: skipped, saying why
    print_run_summary(saved, result, checkpoint)
    assert capsys.readouterr().out.endswith(
        "\nsample: skipped (model.vocab_size 10 holds no byte of text to prompt with)\n"
    )


def test_public_functions_take_str_paths(tmp_path, checkpoint, monkeypatch):
    from speedtronic.artifacts import export_checkpoint

    monkeypatch.chdir(tmp_path)
    assert export_checkpoint(str(checkpoint), "exported") == Path("exported")
    assert type(load_exported("exported")).__name__ == "ReferenceTransformer"
    assert export_hf(str(checkpoint), "hf") == Path("hf") and Path("hf/README.md").is_file()


def test_a_missing_step_names_the_steps_its_folder_holds(tmp_path):
    from speedtronic.artifacts import read_checkpoint

    for name in ("step_10.pt", "step_2.pt", "latest"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(
        UsageError, match=r"step_4.pt: no such checkpoint; .* has step_2.pt, step_10.pt$"
    ):
        read_checkpoint(tmp_path / "step_4.pt")


def test_sample_refuses_a_tokenizer_larger_than_the_model(tmp_path, checkpoint):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models

    big = tmp_path / "big.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(400)}, unk_token="w0")).save(str(big))
    legacy = without_tokenizer_record(checkpoint, tmp_path / "legacy")  # nothing to compare
    with pytest.raises(
        UsageError, match="only 300 .*use the tokenizer the run trained with \\(omit --tokenizer\\)"
    ):
        sample_text(legacy, "w1", tokenizer=str(big))


def without_tokenizer_record(checkpoint: Path, folder: Path) -> Path:
    """A copy of checkpoint as 2.0 and earlier wrote it: no record of its tokenizer."""
    state = torch.load(checkpoint, weights_only=True)
    assert state.pop("tokenizer")["kind"] in {"bytes", "tokenizers"}
    folder.mkdir(parents=True)
    torch.save(state, folder / checkpoint.name)
    return folder / checkpoint.name


def test_data_prepared_again_with_another_tokenizer_is_refused(tmp_path, bpe_json, capsys):
    shards = prepare(tmp_path / "shards", bpe_json)
    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", shards))
    prepare(shards, None)  # the run's folder now holds byte-level tokens
    both = "is the byte tokenizer (256 ids), but the checkpoint was trained with tokenizer.json"
    with pytest.raises(UsageError, match=re.escape(f"{both} (288 ids); pass that one with --tok")):
        export_hf(checkpoint, tmp_path / "hf")
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    text = sample_text(checkpoint, "return a", max_new_tokens=4, temperature=0)
    assert both in capsys.readouterr().err  # a note, as when the shards cannot be found
    assert text.startswith("return a")
    with pytest.raises(UsageError, match="--tokenizer bytes is the byte tokenizer .* trained with"):
        export_hf(checkpoint, tmp_path / "hf", tokenizer="bytes")
    with pytest.raises(UsageError, match="--tokenizer bytes is the byte tokenizer .* trained with"):
        sample_text(checkpoint, "a", max_new_tokens=1, tokenizer="bytes")
    out = export_hf(checkpoint, tmp_path / "hf", tokenizer=bpe_json)  # the run's own: accepted
    assert (out / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    legacy = without_tokenizer_record(checkpoint, tmp_path / "legacy")
    export_hf(legacy, tmp_path / "hf-legacy")  # nothing recorded: the data's tokenizer, as in 2.0
    assert '"merges": []' in (tmp_path / "hf-legacy" / "tokenizer.json").read_text()  # bytes


def test_a_byte_level_checkpoint_ships_bytes_whatever_its_folder_holds_now(tmp_path, bpe_json):
    shards = prepare(tmp_path / "shards", None)
    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", shards))
    before = export_hf(checkpoint, tmp_path / "before")
    greedy = sample_text(checkpoint, "def", max_new_tokens=8, temperature=0)
    prepare(shards, bpe_json)
    after = export_hf(checkpoint, tmp_path / "after")  # the recorded bytes, not the new BPE
    assert (after / "tokenizer.json").read_bytes() == (before / "tokenizer.json").read_bytes()
    assert sample_text(checkpoint, "def", max_new_tokens=8, temperature=0) == greedy


def test_a_data_dataset_shard_glob_is_read_for_its_tokenizer(tmp_path, bpe_json):
    from speedtronic_data import run_tokenizer

    shards = prepare(tmp_path / "shards", bpe_json)
    config = run_config(tmp_path / "run", shards)
    config["data"]["dataset"] = config["data"].pop("shard_path")
    assert run_tokenizer(config["data"]).kind == "tokenizers"
    checkpoint = noisy_checkpoint(config)
    out = export_hf(checkpoint, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    bpe = sample_text(checkpoint, "return a", max_new_tokens=8, temperature=0, tokenizer=bpe_json)
    assert sample_text(checkpoint, "return a", max_new_tokens=8, temperature=0) == bpe


def test_a_run_with_relative_paths_is_sampled_and_exported_from_another_folder(
    tmp_path, bpe_json, monkeypatch, capsys
):
    prepare(tmp_path / "shards", bpe_json)
    monkeypatch.chdir(tmp_path)  # the run names its shards relative to where it started
    config = run_config(Path("run"), Path("shards"))
    assert config["data"]["shard_path"] == "shards/train_*.bin"
    checkpoint = (tmp_path / noisy_checkpoint(config)).resolve()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    bpe = sample_text(checkpoint, "return a", max_new_tokens=8, temperature=0, tokenizer=bpe_json)
    assert sample_text(checkpoint, "return a", max_new_tokens=8, temperature=0) == bpe
    assert "note:" not in capsys.readouterr().err  # found above the checkpoint, and verified
    out = export_hf(checkpoint, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    # Only a recorded identity makes a shard folder found that way safe to use.
    legacy = without_tokenizer_record(checkpoint, tmp_path / "legacy")
    with pytest.raises(UsageError, match="cannot tell which tokenizer the run used"):
        export_hf(legacy, tmp_path / "hf-legacy")


def test_init_from_refuses_weights_trained_with_another_tokenizer(tmp_path, bpe_json, byte_shards):
    transformers = pytest.importorskip("transformers")
    from speedtronic import runtime
    from speedtronic_config import SpeedtronicConfig
    from speedtronic_data import JsonTokenizer, prepare_shards
    from speedtronic_model import build_model, save_llama

    bpe_shards = tmp_path / "bpe-shards"
    text = "def add(a, b):\n    return a + b\n" * 300
    prepare_shards([], bpe_shards, JsonTokenizer.from_file(bpe_json), texts=[text], progress=None)
    config = run_config(tmp_path / "run", bpe_shards)
    hf = tmp_path / "hf"
    save_llama(build_model(SpeedtronicConfig.from_dict(config).model), hf)
    # Saved by transformers: another tokenizer.json byte for byte, the same tokenizer.
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(bpe_json)).save_pretrained(hf)
    assert (hf / "tokenizer.json").read_bytes() != bpe_json.read_bytes()
    config["model"]["init_from"] = f"hf:{hf}"
    trainer, _ = runtime.build_runtime(config)
    trainer.close()
    on_bytes = run_config(tmp_path / "bytes-run", byte_shards)
    on_bytes["model"]["init_from"] = f"hf:{hf}"
    with pytest.raises(ConfigError) as refused:
        runtime.build_runtime(on_bytes)
    assert str(refused.value) == (
        f"model.init_from: {hf} was trained with {hf / 'tokenizer.json'} (288 ids), but the "
        f"run's training data ({byte_shards}) holds tokens of the byte tokenizer (256 ids), so the "
        "weights would learn from ids that mean other text; prepare the data with its tokenizer: "
        f"speedtronic prepare OUT --tokenizer {hf}"
    )
    assert not (tmp_path / "bytes-run").exists()


def test_a_prompt_the_tokenizer_cannot_take_is_a_usage_error(checkpoint, monkeypatch):
    # Bytes a shell passes that are not UTF-8 arrive as lone surrogates (os.fsdecode).
    with pytest.raises(UsageError, match=r"^--prompt: not UTF-8 text \(position 1 of "):
        sample_text(checkpoint, "a\udcff", max_new_tokens=2)

    class Dropping:  # a tokenizer without byte fallback drops characters it has no token for
        vocab_size = 8

        def encode(self, text):
            return []

        def decode(self, ids):
            return ""

    monkeypatch.setattr("speedtronic.artifacts.resolve_tokenizer", lambda *a, **k: Dropping())
    with pytest.raises(UsageError, match=r"maps it to no tokens"):
        sample_text(checkpoint, "\u20ac", max_new_tokens=2)


def test_a_damaged_metrics_file_costs_the_card_its_curve_not_the_export(tmp_path, checkpoint):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    copy = shutil.copy(checkpoint, run / "checkpoints" / "step_4.pt")
    (run / "metrics.jsonl").write_text(
        '{"event": "train_step", "step": 1, "loss": 3.0}\ngarbage{\n{}\n'
    )
    out = export_hf(copy, tmp_path / "out")
    names = {p.name for p in out.iterdir()}
    assert MODEL_FILES | TOKENIZER_FILES | {"README.md"} <= names and "loss_curve.png" not in names
    assert "| steps | 4 |" in (out / "README.md").read_text()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("fmt", ["hf", "plain"])
def test_an_export_failing_on_the_way_leaves_the_earlier_one_whole(
    tmp_path, checkpoint, byte_shards, monkeypatch, fmt
):
    import safetensors.torch

    import speedtronic.model_card
    from speedtronic.artifacts import export_checkpoint

    export = export_hf if fmt == "hf" else export_checkpoint
    out = export(checkpoint, tmp_path / "out")
    (out / "notes.txt").write_text("the user's own file\n")
    earlier = _files(out)
    other = noisy_checkpoint(run_config(tmp_path / "run", byte_shards, tie_weights=False), 4, 0.6)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if fmt == "hf":  # the last file written: the new weights and tokenizer are on disk by then
        monkeypatch.setattr(speedtronic.model_card, "write_model_card", disk_full)
    else:
        real = safetensors.torch.save_model

        def half_written(model, filename, **kwargs):
            real(model, filename, **kwargs)
            Path(filename).write_bytes(Path(filename).read_bytes()[:100])
            disk_full()

        monkeypatch.setattr(safetensors.torch, "save_model", half_written)
    with pytest.raises(OSError, match="No space left"):
        export(other, out)
    assert _files(out) == earlier  # nothing new, nothing half-written, no staging folder left
    monkeypatch.undo()
    export(other, out)
    now = _files(out)
    assert now["notes.txt"] == earlier["notes.txt"] and set(now) == set(earlier)
    assert now["model.safetensors"] != earlier["model.safetensors"]


def test_an_export_replaces_the_files_an_earlier_one_wrote_and_no_others(tmp_path, checkpoint):
    from speedtronic_config.atomic import STAGING, temp_glob

    out = export_hf(checkpoint, tmp_path / "out", max_shard_bytes=50_000)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    (out / "loss_curve.png").write_bytes(b"an earlier export's curve")
    killed = out / temp_glob(STAGING).replace("*", "killed")  # left by a kill -9 while staging
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    export_hf(checkpoint, out)  # one file; this checkpoint has no metrics, so no curve
    assert {p.name for p in out.iterdir()} == MODEL_FILES | TOKENIZER_FILES | {"README.md"}


def test_an_export_over_another_tokenizers_files_removes_those_that_change_its_ids(
    tmp_path, checkpoint
):
    # Left by a Hub download (the init_from folder, say): transformers reads them with the
    # exported tokenizer.json, adding tokens and setting another eos and pad.
    out = tmp_path / "out"
    out.mkdir()
    (out / "special_tokens_map.json").write_text('{"eos_token": "</s>", "pad_token": "<pad>"}')
    (out / "added_tokens.json").write_text('{"<extra>": 256}')
    (out / "notes.txt").write_text("mine")
    export_hf(checkpoint, out)
    assert {p.name for p in out.iterdir()} == MODEL_FILES | TOKENIZER_FILES | {
        "README.md",
        "notes.txt",
    }
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "é </s> <extra>"
    assert tokenizer(text).input_ids == list(text.encode())
    assert (len(tokenizer), tokenizer.eos_token, tokenizer.pad_token) == (256, None, None)


def test_an_export_over_another_models_chat_templates_removes_them(tmp_path, checkpoint):
    # Left by a Hub download: transformers gave the exported tokenizer that model's chat template,
    # and pipeline() formatted chats in special tokens this vocabulary lacks.
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "out"
    (out / "additional_chat_templates").mkdir(parents=True)
    (out / "chat_template.jinja").write_text("{% for m in messages %}<|im_start|>{% endfor %}")
    (out / "additional_chat_templates" / "tool_use.jinja").write_text("<|tool|>")
    export_hf(checkpoint, out)
    assert not list(out.rglob("*.jinja"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template is None
    with pytest.raises(ValueError, match="chat_template is not set"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_a_plain_export_over_a_sharded_hf_one_removes_its_shards(tmp_path, checkpoint):
    from speedtronic.artifacts import export_checkpoint

    out = export_hf(checkpoint, tmp_path / "out", max_shard_bytes=50_000)
    (out / "notes.txt").write_text("mine")
    export_checkpoint(checkpoint, out)
    weights = {p.name for p in out.iterdir() if p.name.startswith("model")}
    assert weights == {"model.safetensors"} and (out / "notes.txt").read_text() == "mine"
    assert load_exported(out).state_dict().keys()


def test_a_sharded_checkpoint_with_damaged_shards_is_a_one_line_usage_error(tmp_path, checkpoint):
    import warnings

    import torch.distributed.checkpoint as dcp

    from speedtronic.cli import main
    from speedtronic_trainer import CheckpointManager

    state = torch.load(checkpoint, weights_only=True)
    manager = CheckpointManager(tmp_path / "checkpoints")
    staging = manager.sharded_staging_for(4)
    staging.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": state.pop("model")}, checkpoint_id=str(staging), no_dist=True)
    state.pop("optimizer")
    sharded = manager.publish_sharded(staging, state)
    args = {"max_new_tokens": 8, "temperature": 0.0}
    assert sample_text(sharded, "x", **args) == sample_text(checkpoint, "x", **args)
    shard = next(sharded.glob("*.distcp"))
    shard.write_bytes(b"\xff" * shard.stat().st_size)  # the size still matches its metadata
    with pytest.raises(UsageError, match=f"sharded checkpoint {sharded} could not be loaded"):
        sample_text(sharded, "x", **args)
    assert main(["export", str(sharded), str(tmp_path / "out"), "--format", "hf"]) == 2


def test_load_exported_names_what_loads_an_hf_export(tmp_path, checkpoint):
    out = export_hf(checkpoint, tmp_path / "hf")
    with pytest.raises(UsageError, match=r"is a transformers export \(--format hf\): load it with"):
        load_exported(out)  # was TypeError: unexpected keyword argument 'architectures'


def test_a_checkpoint_without_a_config_or_of_another_model_is_one_usage_line(tmp_path, checkpoint):
    from speedtronic.cli import main
    from speedtronic_model import build_model
    from speedtronic_trainer import CheckpointManager, Trainer

    # A Trainer built from the Python API without config= records none: the default model was
    # rebuilt and torch's many-line "Error(s) in loading state_dict" ended it, exit 1.
    model = build_model({"vocab_size": 300, "max_seq_len": 32, "n_layer": 2, "d_model": 32})
    batch = {"input_ids": torch.zeros(1, 32, dtype=torch.long)}
    batch["labels"] = batch["input_ids"]
    manager = CheckpointManager(tmp_path / "checkpoints", every_steps=1)
    optimizer = torch.optim.AdamW(model.parameters())
    Trainer(model, optimizer, [batch], device="cpu", checkpoint_manager=manager).fit(1)
    with pytest.raises(UsageError, match=r"records no config \(its Trainer was built without"):
        sample_text(tmp_path / "checkpoints", "x")
    state = torch.load(checkpoint, weights_only=True)
    state["config"]["model"]["d_model"] = 64
    torch.save(state, tmp_path / "edited.pt")
    with pytest.raises(UsageError, match="do not fit the model its config describes"):
        export_hf(tmp_path / "edited.pt", tmp_path / "hf")
    assert main(["export", str(tmp_path / "checkpoints"), str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("with_config", [True, False], ids=["config", "no-config"])
def test_a_checkpoint_of_a_model_of_ones_own_is_refused_in_one_line_that_says_so(
    tmp_path, capsys, with_config
):
    """A transformers model trained through Trainer(model=...) leaves a checkpoint that sample
    and export cannot rebuild (they build model.name): the line blamed a size mismatch for
    lm_head.weight, or advised passing config=, as if another setting would fit it. The
    checkpoint names the model's class (its config's model.name is the default's); a sharded
    .dcp of it got "could not be loaded (RuntimeError: Missing key ...); move it out of the
    checkpoints folder", as if it were damaged. A checkpoint without the class (2.0) is told by
    its weights' names.
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    transformers = pytest.importorskip("transformers")
    from speedtronic.cli import main
    from speedtronic_trainer import CheckpointManager, Trainer
    from speedtronic_trainer.sharded import load_sharded

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 32, (1, 8))
    batch = {"input_ids": ids, "labels": ids.roll(-1, 1)}
    manager = CheckpointManager(tmp_path / "checkpoints", every_steps=1)
    sections = {"data": {"micro_batch_size": 1, "target_batch_size": 1}} if with_config else None
    optimizer = torch.optim.AdamW(model.parameters())
    Trainer(
        model, optimizer, [batch], device="cpu", config=sections, checkpoint_manager=manager
    ).fit(1)
    state = torch.load(tmp_path / "checkpoints" / "step_1.pt", weights_only=True)
    held = "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    assert state["model_class"] == held
    # The same weights as a sharded folder, and both as 2.0 wrote them (no class recorded).
    sharded = CheckpointManager(tmp_path / "sharded")
    staging = sharded.sharded_staging_for(1)
    staging.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process"
        dcp.save({"model": state["model"]}, checkpoint_id=str(staging), no_dist=True)
    rest = {key: value for key, value in state.items() if key not in ("model", "optimizer")}
    folder = sharded.publish_sharded(staging, rest)
    old = {key: value for key, value in state.items() if key != "model_class"}
    torch.save(old, tmp_path / "old.pt")
    shutil.copytree(folder, tmp_path / "old.dcp")
    torch.save(rest | {"model_class": None}, tmp_path / "old.dcp" / "trainer_state.pt")
    paths = [tmp_path / "checkpoints", folder, tmp_path / "old.pt", tmp_path / "old.dcp"]
    capsys.readouterr()
    for path in paths:
        assert main(["sample", str(path), "--max-new-tokens", "1"]) == 2
        assert main(["export", str(path), str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 * len(paths)
    for index, line in enumerate(lines):
        other = f"a {held}" if index < 4 else "another model"
        assert f"holds the weights of {other}, not of model.name reference_transformer" in line
        assert "model.embed_tokens.weight" in line and "size mismatch" not in line
        dense = "load_state_dict(checkpoint['model'])"
        assert (dense if index // 2 % 2 == 0 else "sharded.load_sharded(Path(PATH)") in line
    # The advice for a sharded one works: the weights load into a model of their class.
    reloaded = transformers.LlamaForCausalLM(config)
    load_sharded(folder, reloaded, None)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in state["model"].items())


def test_a_damaged_latest_checkpoint_names_the_older_ones_to_use(tmp_path, checkpoint):
    # `sample RUN` reached a damaged newest checkpoint and said only "pass a step_<n>.pt a
    # Speedtronic run wrote", though the run's older one beside it was whole.
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    shutil.copy(checkpoint, folder / "step_4.pt")
    (folder / "step_8.pt").write_bytes(checkpoint.read_bytes()[:5000])  # cut short
    (folder / "latest").write_text("step_8.pt\n")
    for given in (tmp_path, folder / "latest", folder / "step_8.pt"):
        with pytest.raises(UsageError) as caught:
            sample_text(given, "x", max_new_tokens=1)
        message = str(caught.value)
        assert "step_8.pt is truncated or corrupt" in message and "\n" not in message
        assert message.endswith(f"; {folder} also has step_4.pt, which you can pass instead")
    (folder / "step_4.pt").unlink()
    with pytest.raises(UsageError, match=r"corrupt \(.*\); pass a step_<n>.pt a Speedtronic run"):
        sample_text(tmp_path, "x", max_new_tokens=1)  # nothing else to offer


def test_an_export_over_one_of_the_other_format_removes_only_that_exports_files(
    tmp_path, checkpoint
):
    # --format speedtronic over an hf export left its card, tokenizer and generation config beside
    # the new config.json, and transformers failed on the mixed folder.
    out = tmp_path / "out"
    export_hf(checkpoint, out)
    (out / "notes.txt").write_text("mine\n")
    hf_files = {p.name for p in out.iterdir()}
    assert {"README.md", *TOKENIZER_FILES, *MODEL_FILES} <= hf_files
    export_checkpoint(checkpoint, out)
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "notes.txt"}
    assert load_exported(out) is not None
    export_hf(checkpoint, out)  # and back: the hf set, the user's file kept
    assert {p.name for p in out.iterdir()} == hf_files


def test_a_speedtronic_export_keeps_a_readme_and_tokenizer_the_user_put_there(tmp_path, checkpoint):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# my notes\n")
    (out / "tokenizer.json").write_text("{}\n")
    export_checkpoint(checkpoint, out)
    export_checkpoint(checkpoint, out)
    assert (out / "README.md").read_text() == "# my notes\n"
    assert (out / "tokenizer.json").read_text() == "{}\n"


def test_an_hf_export_refuses_a_readme_that_is_not_its_model_card(tmp_path, checkpoint, capsys):
    # It was replaced by the model card: the user's own README.md (a cloned Hub repository's card,
    # another model's) was lost without a word.
    from speedtronic.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# my model\n\nlicense: mine\n")
    with pytest.raises(UsageError, match=r"README.md is not a model card an export wrote"):
        export_hf(checkpoint, out)
    assert main(["export", str(checkpoint), str(out), "--format", "hf"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert {p.name for p in out.iterdir()} == {"README.md"}
    assert (out / "README.md").read_text() == "# my model\n\nlicense: mine\n"
    (out / "README.md").unlink()
    export_hf(checkpoint, out)
    card = (out / "README.md").read_text()
    (out / "README.md").write_text(card + "\nNotes added by hand.\n")  # an edited card is ours
    export_hf(checkpoint, out)
    assert (out / "README.md").read_text() == card


def test_sample_hands_on_its_text_as_it_is_generated(checkpoint, bpe_json, tmp_path):
    # sample_text returned the text only once every token was generated: nothing to show sooner.
    args = {"max_new_tokens": 48, "temperature": 2.0, "seed": 5}
    pieces: list[str] = []
    text = sample_text(checkpoint, "é", on_text=pieces.append, **args)
    assert text == sample_text(checkpoint, "é", **args)  # the same string as without on_text
    assert "".join(pieces) == text and pieces[0] == "é" and len(pieces) > 10
    # A multi-byte character comes whole; U+FFFD only where the model emitted invalid UTF-8.
    assert all(not piece.endswith("\ufffd") or "\ufffd" in text for piece in pieces)
    bpe = noisy_checkpoint(run_config(tmp_path / "bpe", prepare(tmp_path, bpe_json)), step=2)
    pieces.clear()
    text = sample_text(bpe, "def ", on_text=pieces.append, **args)
    assert "".join(pieces) == text and len(pieces) > 10


def stream_pieces(codec, prompt: list[int], ids: list[int]) -> list[str]:
    """The pieces a TextStream hands on for prompt, then ids put one at a time, then closed."""
    from speedtronic.text_stream import TextStream

    pieces: list[str] = []
    stream = TextStream(codec, prompt, pieces.append)
    stream.put(torch.tensor([prompt]))
    for token in ids:
        stream.put(torch.tensor([token]))
    stream.close(codec.decode(prompt + ids))
    return pieces


def test_text_stream_pieces_join_to_the_decoded_text(bpe_json):
    import random

    from speedtronic_data import CharTokenizer, JsonTokenizer

    tokenizers = pytest.importorskip("tokenizers")
    words = {"▁a": 0, "▁b": 1, "c": 2}  # SentencePiece style: no space before the first word
    metaspace = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="c"))
    metaspace.decoder = tokenizers.decoders.Metaspace()
    assert stream_pieces(JsonTokenizer(metaspace.to_str(), "t"), [0], [1, 2, 0]) == [
        "a",
        " b",
        "c",
        " a",
    ]
    rng = random.Random(0)
    for codec, vocab in ((CharTokenizer(), 300), (JsonTokenizer.from_file(bpe_json), 1000)):
        ids = [rng.randrange(vocab) for _ in range(2000)]  # invalid UTF-8 and ids past 255 too
        assert "".join(stream_pieces(codec, [65], ids)) == codec.decode([65, *ids])


def test_text_stream_holds_a_character_until_its_last_byte():
    from speedtronic_data import CharTokenizer

    text = "aé€😀\n"
    assert stream_pieces(CharTokenizer(), [], list(text.encode())) == ["a", "é", "€", "😀", "\n"]


def test_text_stream_follows_a_decoder_that_rewrites_across_tokens():
    class Cleanup:  # as WordPiece's clean-up decodes "do n't" as "don't"
        def decode(self, ids):
            return " ".join(map(str, ids)).replace(" 9", "9")

    assert stream_pieces(Cleanup(), [1], [2, 9, 3]) == ["1", " 2", "9", " 3"]


def test_a_model_without_a_streamer_hands_on_its_text_at_the_end(tmp_path):
    from speedtronic_model import register_model

    class Hi(torch.nn.Module):  # a user's model: generate(ids, n, temperature=, top_k=) only
        def __init__(self, vocab_size, **_):
            super().__init__()
            self.table = torch.nn.Embedding(vocab_size, vocab_size)

        def forward(self, input_ids, **_):
            return {"logits": self.table(input_ids)}

        def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None):
            return torch.cat((input_ids, torch.tensor([[104, 105]])), dim=1)

    register_model("sample_test_hi", Hi)
    model = {"name": "sample_test_hi", "vocab_size": 256, "max_seq_len": 8}
    config = {"run": {"device": "cpu", "output_dir": str(tmp_path)}, "model": model}
    checkpoint = noisy_checkpoint(config | {"data": {"num_tokens": 8}})
    pieces: list[str] = []
    assert sample_text(checkpoint, "x", tokenizer="bytes", on_text=pieces.append) == "xhi"
    assert pieces == ["xhi"]
