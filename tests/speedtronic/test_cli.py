"""Every CLI command, good and bad paths: runs in real subprocesses (`python -m speedtronic ...`);
refusals that stop before any work in this process (cli_testkit), where a spawn adds only an
interpreter and a torch import.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_SECRETtoken123"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "speedtronic", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def in_process(capfd, monkeypatch):
    """`speedtronic ARGS` in this process (cli_testkit), where the process boundary is not what
    is tested: each spawn costs an interpreter and a torch import (2-3 s on CI's two cores).
    """
    from cli_testkit import run_in_process

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        return run_in_process(list(args), capfd)

    return run


@pytest.fixture
def refused(in_process):
    """in_process, for commands refused before any work."""
    return in_process


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def tiny_config(tmp_path: Path, **extra: str) -> Path:
    """The smoke config, writing into tmp_path; each extra (YAML text) replaces its section."""
    config = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    config["output_dir"] = str(tmp_path / "run")
    config["logging"] = {"json_file": str(tmp_path / "run" / "metrics.jsonl")}
    config.update({key: yaml.safe_load(value) for key, value in extra.items()})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_validate_prints_the_normalized_redacted_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"max_steps: 7\ndistributed:\n  repo_id: me/run\n  token: {SECRET}\n")
    result = cli("validate", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "max_steps: 7" in result.stdout
    assert "block_size: 128" in result.stdout  # normalized from model.max_seq_len
    # the horizon is null in the file form (it follows the target): the output says what it is
    assert result.stdout.endswith("# scheduler.max_steps: null follows the step target, 7\n")


def test_validate_applies_set_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 7\n")
    result = cli(
        "validate", str(config), "--set", "model.n_layer=6", "--set", "optimizer=muon", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "n_layer: 6" in result.stdout and "name: muon" in result.stdout


@pytest.mark.parametrize(
    "content, fragments",
    [
        ("model:\n  n_layers: 3\n", ["model.n_layers", "n_layer"]),
        ("model:\n  n_head: 0\n", ["model.n_head"]),
        ("- just\n- a list\n", ["mapping"]),
        ("model: {n_layer: [\n", ["line"]),
        # passed validate, then train failed with a TypeError naming no setting, exit 1
        ("data:\n  dataset: 2024\n", ["data.dataset", "quote"]),
    ],
)
def test_bad_configs_exit_2_in_one_line(tmp_path, content, fragments):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    assert_one_line_error(cli("validate", str(config), cwd=tmp_path), 2, *fragments)


def test_missing_config_file_names_the_path(tmp_path):
    assert_one_line_error(
        cli("validate", str(tmp_path / "nope.yaml"), cwd=tmp_path), 2, "nope.yaml"
    )


def test_bad_override_exits_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 7\n")
    assert_one_line_error(
        cli("validate", str(config), "--set", "model.n_layr=3", cwd=tmp_path), 2, "n_layr"
    )


def test_usage_error_exits_2(tmp_path):
    result = cli("frobnicate", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_train_plot_sample_export_end_to_end(tmp_path, in_process):
    config = tiny_config(tmp_path, **{"distributed": f"{{token: {SECRET}}}"})
    overlay = tmp_path / "cuda.yaml"
    overlay.write_text("model.n_layer: 3\nrun.max_steps: 1\n")  # CUDA only: must not apply on CPU
    # A real process: the training run end to end. The later commands run in this one.
    result = cli(
        "train",
        str(config),
        "--max-steps",
        "6",
        "--device",
        "cpu",
        "--cuda-overlay",
        str(overlay),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "applying" not in result.stderr
    assert SECRET not in result.stdout + result.stderr
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 6 for r in records)
    checkpoint = run / "checkpoints" / "step_6.pt"
    assert checkpoint.exists()
    assert SECRET.encode() not in checkpoint.read_bytes()
    assert (run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    png = tmp_path / "plot.png"
    result = in_process("plot", str(run), "-o", str(png), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"

    result = in_process(
        "sample", str(checkpoint), "--prompt", "def ", "--max-new-tokens", "20", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def ")

    out = tmp_path / "export"
    result = in_process("export", str(checkpoint), str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json"}

    import torch

    from speedtronic.artifacts import load_checkpoint_model, load_exported

    original, _ = load_checkpoint_model(checkpoint)
    exported = load_exported(out)
    ids = torch.randint(0, 128, (1, 16))
    assert torch.equal(original(ids)["logits"], exported(ids)["logits"])

    # resuming at the target does nothing and says so; a further target continues from step 6
    result = in_process(
        "train", str(config), "--max-steps", "6", "--device", "cpu", "--resume", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\nnothing to train: already at step 6;" in result.stdout
    result = in_process(
        "train", str(config), "--max-steps", "8", "--device", "cpu", "--resume", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "checkpoints" / "step_8.pt").exists()
    # This run's own steps and tokens (2 steps of 8 x 32), not every token since step 0.
    assert "\ntrained 2 steps (resumed at step 6, now at 8), 512 tokens in " in result.stdout


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("- a\n- list\n", "mapping of dotted keys"),
        # A key or value the overlay got wrong named no file: it read as the config's mistake.
        ("model.n_layr: 3\n", "model.n_layr: unknown key; did you mean n_layer?"),
        ("model.d_model: -3\n", "model.d_model: must be positive"),
        # YAML's own types (a date-named run) were a TypeError from json.dumps, exit 1.
        ("run.name: 2024-01-01\n", "run.name: expected a string"),
        ("run.name: !!binary aGVsbG8=\n", "run.name: expected a string"),
    ],
)
def test_bad_cuda_overlay_exits_2_even_on_cpu(tmp_path, refused, content, fragment):
    overlay = tmp_path / "cuda.yaml"
    overlay.write_text(content)
    result = refused(
        "train",
        str(tiny_config(tmp_path)),
        "--device",
        "cpu",
        "--cuda-overlay",
        str(overlay),
        cwd=tmp_path,
    )
    assert_one_line_error(result, 2, fragment)
    assert f"--cuda-overlay {overlay}: " in result.stderr


@pytest.mark.parametrize("content, kind", [("- 1\n- 2\n", "a list"), ("text\n", "a single value")])
def test_a_config_that_is_not_a_mapping_names_the_file(tmp_path, refused, content, kind):
    # train said "cannot load a config from list; pass a mapping, a file path or YAML/JSON text",
    # and read a single value as the path of another config: "text: config file not found".
    config = tmp_path / "c.yaml"
    config.write_text(content)
    result = refused("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, f"train: {config}: must be a mapping, not {kind}; write")


@pytest.mark.parametrize("content", ["", "# every default\n"])
def test_train_reads_an_empty_config_as_every_default_as_validate_does(tmp_path, content):
    import argparse

    from speedtronic import SpeedtronicConfig, cli

    # train said "cannot load a config from NoneType; pass a mapping, a file path or YAML/JSON
    # text", while validate printed the defaults.
    config = tmp_path / "c.yaml"
    config.write_text(content)
    args = argparse.Namespace(
        config=str(config), overrides=["run.name=x"], device=None, max_steps=3, cuda_overlay=None
    )
    run, _ = cli._train_config(args, announce=False)
    assert (run.run.name, run.run.max_steps, run.model) == ("x", 3, SpeedtronicConfig().model)


def test_a_cuda_overlay_that_clashes_with_set_names_both(tmp_path):
    import argparse

    from speedtronic import cli

    # An overlay fine alone but not with a --set was blamed alone: "--cuda-overlay FILE: ...".
    overlay = tmp_path / "cuda.yaml"

    def refusal(content: str, config: Path | None = None) -> str:
        overlay.write_text(content)
        args = argparse.Namespace(
            config=str(config or tiny_config(tmp_path)),
            overrides=["model.d_model=30"],  # divisible by the file's 2 heads, not by 4
            device="cpu",
            max_steps=None,
            cuda_overlay=str(overlay),
        )
        with pytest.raises(cli.UsageError) as refused:
            cli._train_config(args, announce=False)
        return str(refused.value)

    clash = f"--cuda-overlay {overlay} with this command's --set/--max-steps/--device: model."
    assert refusal("model.n_head: 4\n").startswith(clash)
    alone = f"--cuda-overlay {overlay}: model.n_layr: unknown key"
    assert refusal("model.n_layr: 4\n").startswith(alone)
    # A file that loads only with the --set (31 is divisible by neither 2 nor 4 heads): the overlay
    # breaking the file alone says nothing, so both are named.
    config = tiny_config(tmp_path)
    config.write_text(config.read_text().replace("d_model: 32", "d_model: 31"))
    assert refusal("model.n_head: 4\n", config).startswith(clash)


def test_missing_cuda_overlay_names_the_path(tmp_path, refused):
    result = refused(
        "train",
        str(tiny_config(tmp_path)),
        "--cuda-overlay",
        str(tmp_path / "gone.yaml"),
        cwd=tmp_path,
    )
    assert_one_line_error(result, 2, f"--cuda-overlay {tmp_path / 'gone.yaml'}: config file not")


def test_a_cuda_overlay_keeps_its_own_output_metrics_and_horizon(tmp_path, monkeypatch):
    import argparse

    import torch

    from speedtronic import cli

    # The metrics file and the --max-steps horizon were chosen from the config without the
    # overlay: metrics went to the CPU run's folder, the overlay's json_file and horizon were lost.
    monkeypatch.setattr("speedtronic_systems.resolve_device", lambda _: torch.device("cuda"))
    config = tiny_config(tmp_path, logging="{}")
    overlay = tmp_path / "cuda.yaml"
    for text, output, metrics in [
        (f"run.output_dir: {tmp_path / 'gpu'}\n", tmp_path / "gpu", tmp_path / "gpu"),
        (f"logging.json_file: {tmp_path / 'gpu.jsonl'}\n", tmp_path / "run", None),
    ]:
        overlay.write_text(text + "scheduler.max_steps: 20\n")
        args = argparse.Namespace(
            config=str(config), overrides=[], device=None, max_steps=6, cuda_overlay=str(overlay)
        )
        run, chosen = cli._train_config(args, announce=False)
        assert Path(run.run.output_dir) == output
        assert chosen == (None if metrics is None else metrics / "metrics.jsonl")
        assert Path(run.logging.json_file) == (chosen or tmp_path / "gpu.jsonl")
        assert (run.run.max_steps, run.scheduler.max_steps) == (6, 20)


@pytest.mark.parametrize("device", ["0", "off", "cuda: 1"])
def test_a_bad_device_flag_is_named_as_given(tmp_path, capsys, device):
    from speedtronic.cli import main

    # The flag went in as YAML: `--device off` was "run.device: expected a string (got False);
    # quote the value in YAML", advice for a file the user never wrote.
    assert main(["train", str(tiny_config(tmp_path)), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"speedtronic train: device {device!r} is not a device name; use auto, cpu, cuda, "
        "cuda:N or mps\n"
    )


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_overlay_applies_on_a_gpu(tmp_path):
    overlay = tmp_path / "cuda.yaml"
    overlay.write_text("model.n_layer: 3\nprecision.mode: bf16\n")
    result = cli(
        "train",
        str(tiny_config(tmp_path)),
        "--max-steps",
        "2",
        "--device",
        "cuda",
        "--cuda-overlay",
        str(overlay),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "applying" in result.stderr
    import torch

    state = torch.load(tmp_path / "run" / "checkpoints" / "step_2.pt", weights_only=False)
    assert state["config"]["model"]["n_layer"] == 3


@pytest.mark.parametrize("command", [["sample"], ["export"], ["plot"]])
def test_commands_on_missing_paths_exit_2(tmp_path, refused, command):
    args = [*command, str(tmp_path / "missing.pt")] + (
        [str(tmp_path / "out")] if command == ["export"] else []
    )
    assert_one_line_error(refused(*args, cwd=tmp_path), 2, "missing.pt")


def test_sample_on_a_non_checkpoint_exits_2(tmp_path, refused):
    bogus = tmp_path / "bogus.pt"
    import torch

    torch.save({"weights": torch.zeros(2)}, bogus)
    assert_one_line_error(
        refused("sample", str(bogus), cwd=tmp_path), 2, "not a Speedtronic trainer checkpoint"
    )


# An installed package's model: touches a file on import, so a test sees when it was imported.
PLUGIN_MODULE = """\
from pathlib import Path

import torch

Path(__file__).with_name("imported").touch()


class TinyNet(torch.nn.Module):
    def __init__(self, vocab_size, d_model, **fields):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)

    def forward(self, input_ids, **_):
        return {"logits": self.head(self.embed(input_ids))}
"""


def test_a_model_from_an_installed_package_works_in_every_command(tmp_path):
    site = tmp_path / "site"  # a real installed distribution declaring speedtronic.models
    info = site / "tinyplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[speedtronic.models]\ntinynet = tinyplug_models:TinyNet\nbrokennet = tinyplug_gone:build\n"
    )
    (site / "tinyplug_models.py").write_text(PLUGIN_MODULE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    config = tiny_config(tmp_path)
    values = yaml.safe_load(config.read_text())
    values["model"]["name"] = "tinynet"
    config.write_text(yaml.safe_dump(values))

    result = cli("validate", str(config), cwd=tmp_path, env=env)
    assert result.returncode == 0 and "name: tinynet" in result.stdout, result.stderr
    assert not (site / "imported").exists()  # validate builds no model: the plugin stays unread

    result = cli("train", str(config), "--max-steps", "2", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (site / "imported").exists()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2.pt"

    out = tmp_path / "export"
    result = cli("export", str(checkpoint), str(out), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["name"] == "tinynet"
    result = cli(
        "export", str(checkpoint), str(tmp_path / "hf"), "--format", "hf", cwd=tmp_path, env=env
    )
    assert_one_line_error(result, 2, "model.name: TinyNet does not map onto transformers' ")
    result = cli("sample", str(checkpoint), cwd=tmp_path, env=env)
    assert_one_line_error(result, 2, "model 'tinynet' has no generate(); sample needs one taking ")

    result = cli("train", str(config), "--set", "model.name=brokennet", cwd=tmp_path, env=env)
    assert_one_line_error(
        result,
        2,
        "speedtronic train: model.name: model 'brokennet' comes from entry point brokennet = "
        "tinyplug_gone:build of distribution tinyplug 0.1, which fails: ModuleNotFoundError: ",
    )


def test_distributed_without_repo_is_a_config_error(tmp_path, refused):
    config = tiny_config(tmp_path, **{"distributed": "{enabled: true}"})
    assert_one_line_error(refused("train", str(config), cwd=tmp_path), 2, "repo_id")


def test_prepare_train_export_hf_and_sample_agree_with_transformers(tmp_path, refused, in_process):
    transformers = pytest.importorskip("transformers")
    result = in_process("prepare", str(tmp_path / "data"), "--stdlib-bytes", "60000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stdout.splitlines()[-1]
    shards = tmp_path / "data" / "train_*.bin"
    data = f"{{shard_path: {shards}, micro_batch_size: 4, target_batch_size: 4}}"
    config = tiny_config(tmp_path, data=data, optimizer="{name: adamw, lr: 0.01}")
    config.write_text(config.read_text().replace("vocab_size: 128", "vocab_size: 256"))
    # A real process for the training run; the other commands run in this one.
    result = cli("train", str(config), "--max-steps", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "step_8.pt"
    result = in_process(
        "export", str(checkpoint), str(tmp_path / "hf"), "--format", "hf", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "hf")
    result = in_process(
        "sample",
        str(checkpoint),
        "--prompt",
        "def ",
        "--max-new-tokens",
        "20",
        "--temperature",
        "0",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tokenizer("def ", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=20, do_sample=False)[0]
    assert tokenizer.decode(generated) + "\n" == result.stdout

    # export's usage mistakes: one line, exit 2
    for args, fragment in [
        (["--private"], "--private applies to --push-to-hub"),
        (["--tokenizer", "bytes"], "--tokenizer needs --format hf"),
        (["--format", "hf", "--tokenizer", "gone.json"], "gone.json: no such file"),
    ]:
        result = refused("export", str(checkpoint), str(tmp_path / "x"), *args, cwd=tmp_path)
        assert_one_line_error(result, 2, fragment)
    result = refused(
        "export", str(checkpoint), "x", "--format", "hf", "--max-shard-size", "lots", cwd=tmp_path
    )
    assert result.returncode == 2 and "is not a size" in result.stderr
    # The default is the "5GB" the help names (transformers' own), not 5 GiB.
    from speedtronic.cli import _byte_size
    from speedtronic_model.hf_llama import DEFAULT_MAX_SHARD_BYTES

    assert _byte_size("5GB") == DEFAULT_MAX_SHARD_BYTES


def test_vocabulary_smaller_than_the_tokenizer_and_bad_init_from(tmp_path, refused):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(400)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "words.txt").write_text(" ".join(f"w{i % 400}" for i in range(5000)))
    result = cli(
        "prepare",
        str(tmp_path / "data"),
        str(tmp_path / "words.txt"),
        "--tokenizer",
        str(tmp_path / "tokenizer.json"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    config = tiny_config(tmp_path, **{"data": f"{{shard_path: {tmp_path / 'data'}/train_*.bin}}"})
    assert_one_line_error(  # a data setting unusable before training: a usage error
        refused("train", str(config), cwd=tmp_path),
        2,
        "tokenizer.json (400 ids)",
        "is 128",
        "set model.vocab_size (and data.vocab_size, if set) to at least 400",
    )
    assert not (tmp_path / "run").exists()  # refused: no empty run folder left behind
    assert_one_line_error(
        refused(
            "train",
            str(config),
            "--set",
            "model.vocab_size=400",
            "--set",
            f"model.init_from=hf:{tmp_path}",
            cwd=tmp_path,
        ),
        2,
        "model.init_from",
        "has no config.json",
    )
    assert not (tmp_path / "run").exists()
    batch = ["--set", "data.micro_batch_size=4096", "--set", "data.target_batch_size=4096"]
    assert_one_line_error(  # one process, data short of one batch: refused before the first step
        refused("train", str(config), "--set", "model.vocab_size=400", *batch, cwd=tmp_path),
        2,
        "too few for one batch of 4096 x",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["sample", "c.pt", "--max-new-tokens", "-5"], "--max-new-tokens: must be >= 0"),
        (["sample", "c.pt", "--temperature", "nan"], "--temperature: must be >= 0"),
        (["sample", "c.pt", "--top-k", "0"], "--top-k: must be >= 1"),
        (["prepare", "out", "--stdlib-bytes", "-1"], "--stdlib-bytes: must be > 0"),
        # named as the user typed it, not as prepare_shards' val_fraction
        (["prepare", "out", "--val-fraction", "1"], "--val-fraction: must be >= 0 and < 1, got 1"),
        (["prepare", "out", "--val-fraction", "nan"], "--val-fraction: must be >= 0 and < 1"),
        (["sample", "c.pt", "--seed", "x"], "--seed: expected a number"),
        (["frobnicate"], "invalid choice: 'frobnicate' (choose from "),  # no name is near
        # A near miss gets the closest name, as a config key does.
        (["trian"], "speedtronic: argument COMMAND: invalid choice: 'trian'; did you mean train?"),
        (["export", "c.pt", "--format", "hff"], "invalid choice: 'hff'; did you mean hf? (see"),
        (
            ["train", "c.yaml", "--max_steps", "3"],
            "speedtronic train: unrecognized arguments: --max_steps 3; did you mean --max-steps?",
        ),
        (["sample", "c.pt", "--top_k=3"], "arguments: --top_k=3; did you mean --top-k? (see"),
        # No suggestion where none fits: the dashes every flag shares made `--lr` "close" to
        # `--help`, and a whole flag left over after `--` was "corrected" to itself.
        (["train", "c.yaml", "--lr", "3"], "train: unrecognized arguments: --lr 3 (see"),
        (["train", "c.yaml", "--", "--max-steps", "3"], " --max-steps 3 (see"),
        # INPUT is optional: argparse listed it as missing too (`required: out_dir, texts`)
        (["prepare"], "the following arguments are required: OUT_DIR (see"),
        # An empty path was the current folder: `prepare ''` wrote its shards there.
        (["prepare", ""], "prepare: argument OUT_DIR: empty path; name a file or folder (see"),
        (["prepare", "out", ""], "argument INPUT: empty path"),
        (["prepare", "out", "--tokenizer="], "argument --tokenizer: empty path"),
        (["export", "c.pt", ""], "export: argument OUT_DIR: empty path"),
        (["sample", ""], "sample: argument CHECKPOINT: empty path"),
        (["plot", ""], "plot: argument RUN_DIR_OR_JSONL: empty path"),
        (["plot", "run", "-o", ""], "argument -o/--output: empty path"),
        (["train", "c.yaml", "--cuda-overlay", ""], "argument --cuda-overlay: empty path"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path, monkeypatch, capsys, args, fragment):
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and fragment in err, err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err
    assert not list(tmp_path.iterdir())  # nothing written where it ran


@pytest.mark.parametrize(
    "args, fragment",
    [
        # An empty REPO read as no --push-to-hub: hf exported and pushed nothing, exit 0, and
        # speedtronic ignored it; with --private it was told to add the flag it had.
        (["--format", "hf"], "--push-to-hub '': not a repository id"),
        ([], "--push-to-hub needs --format hf"),
        (["--private"], "--push-to-hub needs --format hf"),
        (["--format", "hf", "--private"], "--push-to-hub '': not a repository id"),
    ],
)
def test_an_empty_push_to_hub_repo_is_refused(tmp_path, monkeypatch, capsys, args, fragment):
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["export", "c.pt", "out", "--push-to-hub", "", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # refused before the checkpoint is read


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["missing.txt"], "missing.txt: no such file or folder; check the path"),
        (["--tokenizer", "gone.json"], "--tokenizer gone.json: no such file"),
        # was exit 1 with a bare UnicodeDecodeError
        (["--tokenizer", "binary.txt"], "binary.txt is not a tokenizers tokenizer.json (not UTF-8"),
        (["empty.txt"], "'empty.txt' is empty"),
        (["binary.txt"], "not valid UTF-8"),
        # 5% of 12 bytes is no byte: train shards alone, which `train` then could not validate on
        (["short.txt"], "no validation tokens from ['short.txt'] (val_fraction 0.05"),
    ],
)
def test_prepare_refuses_before_creating_its_folder(tmp_path, monkeypatch, capsys, args, fragment):
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe not UTF-8")
    (tmp_path / "short.txt").write_text("hello world\n")
    assert main(["prepare", "data/out", *args, "--stdlib-bytes", "2000"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "data").exists()


def test_prepare_warns_in_one_line_of_an_input_given_twice(tmp_path, monkeypatch, capsys):
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("some text\n" * 10)
    assert main(["prepare", "out", "a.txt", "./a.txt", "--val-fraction", "0"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        "speedtronic prepare: warning: inputs given more than once are tokenized each time, so "
        "their text weighs that many times in the shards: 'a.txt' (2 times); leave out the "
        "repeats unless that is meant\n"
    )
    assert "prepared 200 train + 0 val tokens" in out


@pytest.mark.parametrize(
    "args",
    [
        ["prepare", "in-the-way", "a.txt"],
        ["prepare", "in-the-way/out", "a.txt"],
        ["export", "no-such-run", "in-the-way"],
        ["plot", "metrics.jsonl", "-o", "in-the-way/curve.png"],
    ],
)
def test_a_file_where_an_output_folder_goes_is_named(tmp_path, monkeypatch, capsys, args):
    # mkdir's own words, `File exists` or `Not a directory`, named neither the file nor a fix.
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in-the-way").write_text("a file")
    (tmp_path / "a.txt").write_text("some text\n")
    (tmp_path / "metrics.jsonl").write_text('{"event": "train_step", "step": 1, "loss": 4.0}\n')
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "(in-the-way is a file, not a folder); choose a writable folder" in err, err
    assert len(err.strip().splitlines()) == 1 and (tmp_path / "in-the-way").read_text() == "a file"


def test_ctrl_c_outside_the_training_loop_exits_130_in_one_line(monkeypatch, capsys):
    from speedtronic.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("speedtronic.corpus.prepare_corpus", interrupted)
    assert main(["prepare", "data/out"]) == 130  # 128 + SIGINT, as a shell (and 2.0) reported
    assert capsys.readouterr().err == "speedtronic prepare: interrupted\n"


@pytest.mark.parametrize(
    "args",
    [
        ["prepare", "out", "a.txt"],
        ["train", "tiny.yaml"],
        ["sample", "run"],
        ["export", "run", "out"],
    ],
)
def test_ctrl_c_while_torch_loads_is_not_lost(tmp_path, monkeypatch, capsys, args):
    # torch's C init imports numpy and clears any error that raises, a KeyboardInterrupt too: a
    # Ctrl-C in that second was lost, and `prepare` wrote its shards and exited 0. A module that
    # does the same stands in for torch (already imported in this process).
    module = f"swallows_ctrl_c_{args[0]}"
    (tmp_path / f"{module}.py").write_text(
        "import os, signal\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    for _ in range(100_000):\n"
        "        pass  # Python's handler runs at the next bytecode, unless held\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ beside it
    monkeypatch.setattr("speedtronic.cli._TORCH", module, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("some text to tokenize\n" * 20)
    tiny_config(tmp_path)
    from speedtronic.cli import main

    assert main(args) == 130
    assert capsys.readouterr().err == f"speedtronic {args[0]}: interrupted\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "a.txt",
        f"{module}.py",
        "tiny.yaml",
    ]


def test_version_names_the_meta_package_and_every_part(capsys):
    import importlib.metadata

    from speedtronic.cli import PARTS, main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert out.startswith(f"speedtronic {importlib.metadata.version('speedtronic')} (parts: ")
    for part in PARTS:
        assert f"{part} {importlib.metadata.version(part)}" in out


def test_metrics_follow_the_run_folder_when_no_file_is_set(tmp_path, capsys):
    from speedtronic.cli import main

    smoke = str(ROOT / "configs" / "smoke.yaml")  # sets no logging.json_file
    for name in ("a", "b"):
        run = tmp_path / name
        argv = ["train", smoke, "--max-steps", "2", "--device", "cpu"]
        assert main([*argv, "--set", f"run.output_dir={run}"]) == 0
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["event"] == "train_step"] == [1, 2]  # its own
        assert f"metrics:    {run / 'metrics.jsonl'}" in capsys.readouterr().out
        assert (run / "loss_curve.png").exists()


def test_metrics_follow_a_run_folder_named_with_characters_outside_the_bmp(tmp_path, capsys):
    from speedtronic.cli import main

    # The metrics path went through json.dumps (an emoji as a \ud83d\ude00 pair) into a --set
    # override, which PyYAML read back as two lone surrogates: UnicodeEncodeError, exit 1.
    run = tmp_path / "run-\N{GRINNING FACE}"
    argv = ["train", str(ROOT / "configs" / "smoke.yaml"), "--max-steps", "2", "--device", "cpu"]
    assert main([*argv, "--set", f"run.output_dir={run}"]) == 0
    assert f"metrics:    {run / 'metrics.jsonl'}" in capsys.readouterr().out
    assert (run / "metrics.jsonl").stat().st_size > 0


def test_a_fresh_run_sets_an_earlier_runs_metrics_aside_and_a_resume_logs_each_step_once(
    tmp_path, capsys, monkeypatch
):

    from speedtronic.cli import main

    run = tmp_path / "run"
    argv = ["train", str(ROOT / "configs" / "smoke.yaml"), "--device", "cpu"]
    argv += ["--set", f"run.output_dir={run}", "--set", "checkpoint.every_steps=2"]

    def steps(path: Path, event: str = "train_step") -> list[int]:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return [r["step"] for r in records if r["event"] == event]

    assert main([*argv, "--max-steps", "2"]) == 0
    assert "held an earlier run" not in capsys.readouterr().err
    # A crash: steps 3 and 4 are logged, then their checkpoint finds the disk full (no emergency
    # checkpoint after a failed save), so the run resumes at step 2 and logs 3 and 4 again.
    assert _with_step_4_checkpoint_on_a_full_disk(monkeypatch, main, argv) == 1
    assert steps(run / "metrics.jsonl") == [1, 2, 3, 4]
    capsys.readouterr()
    assert main([*argv, "--max-steps", "5", "--resume"]) == 0  # continues: the same file
    err = capsys.readouterr().err
    assert "held an earlier run" not in err
    assert steps(run / "metrics.jsonl") == [1, 2, 3, 4, 5]  # each step once, in order
    assert steps(run / "metrics.jsonl", "checkpoint") == [2, 4, 5]
    (superseded,) = run.glob("metrics-superseded-*.jsonl")  # nothing of the crashed run is lost
    assert f"resumed at step 2; {run / 'metrics.jsonl'} held 2 records" in err
    assert f"moved to {superseded.name}" in err
    assert steps(superseded) == [3, 4]
    superseded.unlink()
    missing = ["--set", f"data.shard_path={tmp_path / 'none_*.bin'}"]
    assert main([*argv, "--max-steps", "2", *missing]) == 2  # a fresh run that never started
    assert steps(run / "metrics.jsonl") == [1, 2, 3, 4, 5] and not list(run.glob("metrics-*"))
    capsys.readouterr()
    assert main([*argv, "--max-steps", "2"]) == 0  # a fresh run in the same folder
    err = capsys.readouterr().err
    (kept,) = run.glob("metrics-*.jsonl")
    assert (
        f"{run / 'metrics.jsonl'} held an earlier run's metrics; kept as {kept.name} (pass "
        "--resume to continue that run instead)\n"
    ) in err
    assert steps(kept) == [1, 2, 3, 4, 5]
    assert steps(run / "metrics.jsonl") == [1, 2]  # this run alone
    # Last written in the same second as the kept file: a kept file is never overwritten.
    stamp = time.mktime(time.strptime(kept.stem.removeprefix("metrics-"), "%Y%m%d-%H%M%S"))
    os.utime(run / "metrics.jsonl", (stamp, stamp))
    assert main([*argv, "--max-steps", "1"]) == 0
    assert steps(kept) == [1, 2, 3, 4, 5]
    assert steps(kept.with_name(f"{kept.stem}-1.jsonl")) == [1, 2]

    # A file the config names is the user's: appended to, as in 2.0.
    named = tmp_path / "named.jsonl"
    for _ in range(2):
        assert main([*argv, "--max-steps", "1", "--set", f"logging.json_file={named}"]) == 0
    assert steps(named) == [1, 1]
    assert len(list(run.glob("metrics-*.jsonl"))) == 2


def test_setting_metrics_aside_offers_resume_only_where_a_checkpoint_would_continue(
    tmp_path, capsys
):
    from speedtronic.cli import main

    run = tmp_path / "run"
    argv = ["train", str(ROOT / "configs" / "smoke.yaml"), "--device", "cpu", "--max-steps", "1"]
    argv += ["--set", f"run.output_dir={run}", "--set", "checkpoint.enabled=false"]
    assert main(argv) == 0
    # No checkpoint: --resume would start afresh too, and with --resume given it found none.
    for resume in ([], ["--resume"]):
        capsys.readouterr()
        assert main([*argv, *resume]) == 0
        line = next(
            line for line in capsys.readouterr().err.splitlines() if "earlier run's" in line
        )
        assert line.endswith(".jsonl"), line


def test_a_resume_that_cannot_set_superseded_records_aside_says_so_and_trains_on(
    tmp_path, capsys, monkeypatch
):
    import errno
    from types import SimpleNamespace

    import speedtronic_trainer.metric_logger as metric_logger
    from speedtronic.cli import _set_aside_superseded_metrics

    metrics = tmp_path / "metrics.jsonl"
    records = "".join(json.dumps({"event": "train_step", "step": s}) + "\n" for s in (1, 2, 3))
    metrics.write_text(records)
    logger = metric_logger.MetricLogger(stream=io.StringIO(), json_file=str(metrics))

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metric_logger, "atomic_write_bytes", disk_full)
    _set_aside_superseded_metrics(SimpleNamespace(logger=logger, step=2), metrics)
    err = capsys.readouterr().err
    assert f"warning: the records of the steps after 2 stay in {metrics} ([Errno 28]" in err
    logger.emit("train_step", {"step": 3})
    logger.close()
    assert metrics.read_text().startswith(records) and list(tmp_path.iterdir()) == [metrics]


def test_every_option_has_help_and_sample_states_what_the_docs_say():
    import argparse

    from speedtronic.cli import MAX_NEW_TOKENS, _parser

    commands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    missing = [
        f"{name} {action.dest}"
        for name, command in commands.items()
        for action in command._actions
        if not action.help
    ]
    assert missing == []
    docs = (ROOT / "docs" / "cli.md").read_text()
    sample = {a.dest: a for a in commands["sample"]._actions}
    for dest in ("max_new_tokens", "temperature", "seed"):
        flag = sample[dest].option_strings[0]
        assert f"`{flag} {sample[dest].default}`" in docs  # the defaults the code uses
    assert (
        f"0 to {MAX_NEW_TOKENS:,}" in docs
        and f"0 to {MAX_NEW_TOKENS:,}" in sample["max_new_tokens"].help
    )
    val_fraction = {a.dest: a for a in commands["prepare"]._actions}["val_fraction"]
    assert f"`--val-fraction` (0 <= F < 1) defaults to {val_fraction.default}" in docs


def test_the_usage_lines_match_the_commands_table():
    # --help said `config`, `--max-steps MAX_STEPS`, `--text-column TEXT_COLUMN` where the table
    # in docs/cli.md says `CONFIG`, `--max-steps N`, `--text-column NAME`.
    import argparse

    from speedtronic.cli import _parser

    commands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    docs = (ROOT / "docs" / "cli.md").read_text().replace("\\|", "|")
    for name, command in commands.items():
        row = next(line for line in docs.splitlines() if line.startswith(f"| `{name} "))
        launch = [  # train's launch flags have a section of their own in the docs
            action.dest
            for group in command._action_groups
            if group.title.startswith("data-parallel")
            for action in group._group_actions
        ]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:
                shown = action.metavar
            elif action.nargs == 0:
                shown = action.option_strings[0]
            else:
                shown = f"{action.option_strings[0]} {action.metavar or '|'.join(action.choices)}"
            assert shown in (docs if action.dest in launch else row), (name, shown, row)


def test_the_help_names_what_the_commands_take(capsys):
    from speedtronic.cli import main

    # `sample runs/quickstart` and `export runs/quickstart OUT` take the run's folder (docs/cli.md)
    for command in ("sample", "export"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "a run's folder" in text and "a tokenizer.json or a folder holding one" in text
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tokenizer.json, or a folder holding one" in text  # as docs/cli.md says
    assert "(default: text)" in text and "at least 1 (default: 8000000)" in text
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert "a folder for loss_curve.png" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["--help"])
    # A custom model with generate() samples too.
    assert "sample    generate text from a checkpoint\n" in capsys.readouterr().out


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    # `speedtronic validate CONFIG | head -8`: the pipe closes before the output is all written.
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "speedtronic", "validate", "configs/quickstart.yaml"],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["[1, 2]"], "speedtronic validate: <inline config>: must be a mapping, not a list"),
        (["c.yaml", "--max-steps", "5"], "speedtronic validate: unrecognized arguments: --max-"),
        (
            ["c.yaml", "--set", "data.shard_path="],
            "validate: data.shard_path: empty value; write data.shard_path=null to unset it",
        ),
        (["c.yaml", "--set", "run.name= "], "validate: run.name: empty value"),
        # Read as data.text_path=corpus and max_steps=320 before.
        (["c.yaml", "--set", "data.text_path=corpus #2.txt"], "text_path: the # starts a YAML"),
        (["c.yaml", "--set", "max_steps=0500"], "with a leading 0 is octal in YAML 1.1"),
        (["c.yaml", "--set", "max_steps=1:30"], "with a colon is base 60 in YAML 1.1"),  # was 90
        (["model: [n_layer: 2]"], "model: expected a mapping (got [{'n_layer': 2}]); write its"),
    ],
)
def test_validate_input_errors_name_the_command(tmp_path, monkeypatch, capsys, args, fragment):
    from speedtronic.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("max_steps: 7\n")
    try:
        code = main(["validate", *args])
    except SystemExit as exited:
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_synthetic_training_data_beside_real_validation_data_is_warned_of(tmp_path, capsys):
    from speedtronic.cli import main

    config = tiny_config(tmp_path)
    missing = tmp_path / "val_*.bin"  # fails the run right after the warning, before training
    assert main(["train", str(config), "--set", f"data.val_shard_path={missing}"]) == 2
    assert (
        "speedtronic train: warning: training on synthetic random tokens although "
        "data.val_shard_path is set; set data.shard_path" in capsys.readouterr().err
    )


def test_an_evaluation_interval_without_validation_data_is_warned_of(tmp_path, capsys):
    # It evaluated nothing, silently: the run ended with no validation loss.
    from speedtronic.cli import main

    config = tiny_config(tmp_path)
    missing = tmp_path / "train_*.bin"  # fails the run right after the warning, before training
    args = ["train", str(config), "--set", f"data.shard_path={missing}"]
    assert main([*args, "--set", "data.eval_every=2"]) == 2
    assert (
        "speedtronic train: warning: data.eval_every is 2 but no validation data is set, so "
        "nothing is evaluated; set data.val_shard_path" in capsys.readouterr().err
    )
    with_data = [*args, "--set", "data.eval_every=2", "--set", f"data.val_shard_path={missing}"]
    assert main(with_data) == 2
    assert "warning" not in capsys.readouterr().err


def test_training_sources_set_beside_the_one_used_are_warned_of(tmp_path, capsys):
    # The loader takes shard_path, then text_path, then dataset: the others were ignored silently.
    from speedtronic.cli import main

    config = tiny_config(tmp_path)
    missing = tmp_path / "train_*.bin"  # fails the run right after the warning, before training
    (tmp_path / "corpus.txt").write_text("text\n")
    args = ["--set", f"data.shard_path={missing}", "--set", f"data.text_path={tmp_path}/corpus.txt"]
    assert main(["train", str(config), *args]) == 2
    assert (
        "speedtronic train: warning: training on data.shard_path alone; data.text_path is set too, "
        "and ignored" in capsys.readouterr().err
    )


def test_a_finished_run_prints_its_summary_to_a_stdout_without_its_characters(
    tmp_path, monkeypatch
):
    # A byte-level sample holds any character: under PYTHONIOENCODING=ascii (or a Windows code
    # page, redirected) printing the summary raised UnicodeEncodeError, exit 1 after the run.
    from speedtronic.cli import main

    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    model = "{vocab_size: 256, max_seq_len: 8, n_layer: 1, n_head: 1, d_model: 8}"
    config = tiny_config(tmp_path, model=model)
    assert main(["train", str(config), "--max-steps", "1"]) == 0
    sample = stdout.buffer.getvalue().decode("ascii").split("\nsample:\n", 1)[1]
    assert sample.startswith("    def ") and "\\u" in sample  # a character ASCII lacks, escaped
    assert stdout.errors == "strict"  # the caller's stream as it was


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[Path, Path]:
    """A 4-step smoke run (vocabulary 128, Muon) with a checkpoint at step 4: (config, run)."""
    tmp_path = tmp_path_factory.mktemp("smoke")
    config = tiny_config(tmp_path)
    result = cli("train", str(config), "--max-steps", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return config, tmp_path / "run"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.n_layer=3", "(model.n_layer: checkpoint 2, this run 3)"),
        ("optimizer.name=adamw", "resume with --set optimizer.name=muon"),
    ],
)
def test_resuming_with_other_settings_is_a_usage_error(smoke_run, refused, override, fragment):
    config, run = smoke_run
    resume = ["--resume", "--max-steps", "5", "--set", override]
    result = refused("train", str(config), *resume, cwd=run)
    assert_one_line_error(result, 2, "speedtronic train: checkpoint ", fragment)
    assert "SPEEDTRONIC_DEBUG" not in result.stderr


@pytest.mark.parametrize("format_", ["speedtronic", "hf"])
def test_a_refused_export_leaves_no_folder_it_created(smoke_run, capsys, format_):
    from speedtronic.cli import main

    _, run = smoke_run
    missing = str(run / "checkpoints" / "step_3.pt")
    out = run / f"export-{format_}" / "nested"
    assert main(["export", missing, str(out), "--format", format_]) == 2
    assert "step_3.pt: no such checkpoint" in capsys.readouterr().err
    assert not out.parent.exists()
    out.mkdir(parents=True)  # a folder that was there before stays
    assert main(["export", missing, str(out), "--format", format_]) == 2
    assert out.is_dir()


def test_sample_shows_its_text_as_it_is_generated_and_ctrl_c_keeps_it(smoke_run):
    # sample printed nothing until every token was generated: Ctrl-C lost all of it.
    import threading

    _, run = smoke_run
    sample = [sys.executable, "-m", "speedtronic", "sample", str(run), "--prompt", "ab"]
    proc = subprocess.Popen(
        [*sample, "--max-new-tokens", "10000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    watchdog = threading.Timer(120, proc.kill)  # a sample that never streams fails, not hangs
    watchdog.start()
    try:
        shown = b""
        while len(shown) < 40:  # the prompt and some generated text, long before the end
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, proc.stderr.read().decode()
            shown += chunk
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
    assert proc.returncode == 130, err
    assert err.decode().splitlines() == ["speedtronic sample: interrupted"]
    out = shown + rest
    assert out.startswith(b"ab") and out.endswith(b"\n") and len(out) > 40


def test_sample_names_what_the_checkpoint_cannot_take(smoke_run, refused):
    _, run = smoke_run
    result = refused("sample", str(run / "checkpoints" / "step_3.pt"), cwd=run)
    assert_one_line_error(result, 2, "step_3.pt: no such checkpoint; ", "checkpoints has step_4.pt")
    result = refused("sample", str(run / "checkpoints"), "--prompt", "é", cwd=run)
    assert_one_line_error(result, 2, "--prompt: token id 195 is past the model's 128 ids")


def test_an_hf_export_pairs_no_tokenizer_with_ids_past_the_model(smoke_run, refused, tmp_path):
    _, run = smoke_run
    checkpoint = run / "checkpoints" / "step_4.pt"
    out = tmp_path / "hf"
    result = refused("export", str(checkpoint), str(out), "--format", "hf", cwd=run)
    assert_one_line_error(
        result,
        2,
        "speedtronic export: the byte tokenizer has 256 ids but the model only 128 "
        "(model.vocab_size), so transformers would look bytes from 128 up past its embedding; "
        "train with model.vocab_size of at least 256, or export the weights alone (--format "
        "speedtronic)",
    )
    assert not out.exists()
    # Why: the pair it wrote before, loaded in transformers, fails on any text beyond ASCII.
    transformers = pytest.importorskip("transformers")
    from speedtronic.artifacts import load_checkpoint_model
    from speedtronic_data import CharTokenizer, write_hf_tokenizer
    from speedtronic_model import save_llama

    model, config = load_checkpoint_model(checkpoint)
    write_hf_tokenizer(out, CharTokenizer(), model_max_length=config.model.max_seq_len)
    save_llama(model, out)
    ids = transformers.AutoTokenizer.from_pretrained(out)("é", return_tensors="pt").input_ids
    assert ids.tolist() == [[195, 169]]
    with pytest.raises(IndexError):
        transformers.AutoModelForCausalLM.from_pretrained(out)(ids)


def test_train_export_and_sample_keep_to_the_checkpoints_tokenizer(tmp_path, capsys, bpe_json):
    from interop_testkit import prepare

    from speedtronic.cli import main

    bpe, byte = prepare(tmp_path / "bpe", bpe_json), prepare(tmp_path / "bytes", None)
    run = tmp_path / "run"
    argv = ["train", str(ROOT / "configs" / "smoke.yaml"), "--device", "cpu", "--max-steps", "2"]
    argv += ["--set", f"run.output_dir={run}", "--set", "checkpoint.every_steps=2"]
    argv += ["--set", "model.vocab_size=300", "--set", f"data.shard_path={bpe}/train_*.bin"]
    assert main(argv) == 0
    capsys.readouterr()
    checkpoint = str(run / "checkpoints")
    assert main(["export", checkpoint, str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    resume = [*argv, "--resume", "--set", f"data.shard_path={byte}/train_*.bin"]
    assert main(resume) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("speedtronic train: checkpoint ")
    assert "tokens of tokenizer.json (288 ids), but this run's data holds tokens of the byte" in err
    prepare(bpe, None)  # the run's folder prepared again, with another tokenizer
    assert main(["export", checkpoint, str(tmp_path / "hf2"), "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "is the byte tokenizer (256 ids), but the checkpoint" in err
    )
    assert not (tmp_path / "hf2").exists()
    assert main(["sample", checkpoint, "--max-new-tokens", "2", "--tokenizer", "bytes"]) == 2
    assert "--tokenizer bytes is the byte tokenizer" in capsys.readouterr().err


def test_a_stop_in_the_last_evaluation_saves_the_last_step_with_nothing_to_resume(tmp_path):
    from speedtronic_data import write_shard

    shard = tmp_path / "val_000000.bin"
    write_shard(shard, [i % 128 for i in range(3_000_000)])  # about 20,000 batches: many seconds
    write_shard(tmp_path / "train_000000.bin", [i % 128 for i in range(2_000)])
    config = tiny_config(
        tmp_path,
        data=f"{{shard_path: {tmp_path / 'train_*.bin'}, micro_batch_size: 4, target_batch_size: "
        f"8, val_shard_path: {shard}, eval_every: 100, eval_steps: null}}",
        logging=f"{{every_steps: 1, json_file: {tmp_path / 'run' / 'metrics.jsonl'}}}",
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "speedtronic", "train", str(config), "--max-steps", "3"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The last evaluation follows step 3's line (the step target: eval_every is 100).
        assert any(" train_step step=3 " in line for line in run.stdout), run.stderr.read()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_3.pt"
    assert run.returncode == 130, err
    assert err.splitlines() == [
        f"speedtronic train: stopped by SIGINT at step 3; checkpoint {checkpoint}; that is the "
        "step target: nothing is left to resume"
    ]
    assert checkpoint.is_file()


def test_the_resume_command_runs_from_the_shell_that_started_hatch_run(monkeypatch):
    import argparse

    from speedtronic.train_end import resume_command

    args = argparse.Namespace(
        config="configs/quickstart.yaml", overrides=[], max_steps=600, device=None,
        cuda_overlay="configs/quickstart-cuda.yaml",
    )  # fmt: skip
    tail = "configs/quickstart.yaml --max-steps 600 --cuda-overlay configs/quickstart-cuda.yaml"
    assert resume_command(args) == f"speedtronic train {tail} --resume"
    # `hatch run train`: the console script is on the hatch environment's PATH alone.
    monkeypatch.setenv("HATCH_ENV_ACTIVE", "default")
    assert resume_command(args) == f"hatch run speedtronic train {tail} --resume"
    monkeypatch.setenv("HATCH_ENV_ACTIVE", "bench")
    assert resume_command(args) == f"hatch run bench:speedtronic train {tail} --resume"


def test_a_stop_without_checkpoints_does_not_offer_a_resume(capsys):
    import argparse

    from speedtronic.train_end import report_signal_stop
    from speedtronic_trainer import TrainResult

    args = argparse.Namespace(
        config="run.yaml",
        overrides=["checkpoint.enabled=false"],
        max_steps=None,
        device=None,
        cuda_overlay=None,
    )
    # No checkpoint: what fit() returns with checkpoint.enabled false.
    stopped = TrainResult(372, 0, 0, final_loss=None, elapsed_s=1.0, stopped_by="SIGTERM")
    assert report_signal_stop(stopped, args, target=1000) == 143
    # --resume would start again at step 0: the line must not send the user there.
    assert capsys.readouterr().err.splitlines() == [
        "speedtronic train: stopped by SIGTERM at step 372; no checkpoint written "
        "(checkpoint.enabled is false); this stop left nothing to resume"
    ]
    # Resumed from a checkpoint it cannot replace: --resume goes back there.
    assert report_signal_stop(stopped, args, target=1000, resumed=Path("out/step_200.pt")) == 143
    assert capsys.readouterr().err.splitlines() == [
        "speedtronic train: stopped by SIGTERM at step 372; no checkpoint written "
        "(checkpoint.enabled is false); resume with: speedtronic train run.yaml --set "
        "checkpoint.enabled=false --resume (from step_200.pt, where this run began)"
    ]


def test_a_fresh_run_that_fails_does_not_send_the_user_to_an_earlier_runs_checkpoint(
    tmp_path, capsys, monkeypatch
):
    import errno

    import speedtronic_trainer.checkpoint as checkpoint
    from speedtronic.cli import main

    config = str(tiny_config(tmp_path))
    assert main(["train", config]) == 0  # the earlier run: step_8.pt
    capsys.readouterr()
    diverging = ["--set", "optimizer=adamw", "--set", "optimizer.lr=1e38"]
    diverging += ["--set", "run.nonfinite_loss=stop", "--set", "checkpoint.every_steps=100"]
    assert main(["train", config, *diverging]) == 1  # fresh: it fails before its first save
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("speedtronic train: NonFiniteLossError: "), line
    # Not "latest checkpoint: .../step_8.pt; ... resume with ... --resume": that is the other run.
    earlier = tmp_path / "run" / "checkpoints" / "step_8.pt"
    assert f"; no checkpoint of this run was written ({earlier} is an earlier run's)" in line
    assert "--resume" not in line
    # Its first save finds the disk full: step_8.pt is not "the previous checkpoint" of this run.
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint, "atomic_torch_save", lambda state, path: _raise(full))
    assert main(["train", config, "--set", "checkpoint.every_steps=2"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"speedtronic train: CheckpointError: no space left on {earlier.parent} while writing "
        "step 2; no checkpoint of this run was written (step_8.pt is an earlier run's); fix the "
        "cause, then start it again (set SPEEDTRONIC_DEBUG=1 for the traceback)"
    )


def test_speedtronic_debug_0_keeps_the_one_line_and_1_raises(tmp_path, capsys, monkeypatch):
    from speedtronic.cli import main

    config = str(tiny_config(tmp_path))
    diverging = ["--set", "optimizer=adamw", "--set", "optimizer.lr=1e38", "--max-steps", "3"]
    for off in ("0", "false", ""):  # documented as =1: a 0 is "off", not a traceback
        monkeypatch.setenv("SPEEDTRONIC_DEBUG", off)
        assert (
            main(["train", config, *diverging, "--set", f"run.output_dir={tmp_path}/{off}x"]) == 1
        )
        assert "NonFiniteLossError" in capsys.readouterr().err
    monkeypatch.setenv("SPEEDTRONIC_DEBUG", "1")
    with pytest.raises(Exception, match="non-finite|diverged"):
        main(["train", config, *diverging, "--set", f"run.output_dir={tmp_path}/on"])


def test_the_summary_names_the_checkpoint_a_resume_fell_back_to(tmp_path, capsys):
    from speedtronic.cli import main

    config = str(tiny_config(tmp_path, checkpoint="{every_steps: 4, keep_last: null}"))
    assert main(["train", config]) == 0  # step_4.pt, step_8.pt
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "step_8.pt").write_bytes(b"garbage")  # `latest` names it
    capsys.readouterr()
    assert main(["train", config, "--resume", "--max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "\nnothing to train: already at step 4;" in out
    # The state this run holds, not the corrupt file `latest` still names.
    assert f"\ncheckpoint: {checkpoints / 'step_4.pt'}\n" in out, out


def test_a_hook_whose_package_is_missing_is_a_usage_error(tmp_path, capsys, monkeypatch):
    from speedtronic.cli import main

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails: not there
    config = tiny_config(tmp_path, logging="{hooks: [tensorboard]}", max_steps="1")
    # It was exit 1, "ImportError: ... (set SPEEDTRONIC_DEBUG=1 for the traceback)".
    assert main(["train", str(config)]) == 2
    assert capsys.readouterr().err.endswith(
        "speedtronic train: tensorboard is not installed; install it with `pip install "
        "speedtronic-trainer[tensorboard]` or remove it from logging.hooks\n"
    )
    assert not (tmp_path / "run").exists()  # refused before training: nothing left behind


def test_wandb_without_an_api_key_is_a_usage_error(tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    from speedtronic.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: never logged in
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # no terminal: wandb cannot prompt (capsys)
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(tmp_path, logging="{hooks: [wandb]}", max_steps="1")
    # It was exit 1, "UsageError: No API key configured. Use `wandb login` to log in. (set
    # SPEEDTRONIC_DEBUG=1 for the traceback)", naming neither WANDB_API_KEY nor offline mode.
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedtronic train: logging.hooks: wandb could not start a run (No"), err
    assert err.endswith(
        "; run `wandb login` or set WANDB_API_KEY, set WANDB_MODE=offline to log without an "
        "account, or remove wandb from logging.hooks\n"
    )
    assert not (tmp_path / "run").exists()  # refused before training: nothing left behind


def test_an_unreachable_wandb_server_is_a_usage_error_in_one_line(tmp_path, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from speedtronic.cli import main

    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")  # how long wandb retries (its default: 90 s)
    # wandb's login first asks the server who the key belongs to, for its "Logged in as" line, and
    # asks again for the account's settings: 5 s each against a refused port (10 of this test's
    # 12.5 s), and never fatal. The run's own start, which is what fails, is unchanged.
    monkeypatch.setenv("WANDB__DISABLE_VIEWER", "true")
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(tmp_path, logging="{hooks: [wandb]}", max_steps="1")
    wandb.teardown()  # wandb reads its environment once per process, at setup
    try:
        # It was exit 1, "CommError: Timed out while retrying: ..." after 90 s of wandb's retries.
        assert main(["train", str(config)]) == 2
    finally:
        wandb.teardown()
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(
        "speedtronic train: logging.hooks: wandb could not start a run on its server ("
    )
    assert f"127.0.0.1:{port}" in line and "connection refused" in line, line
    # wandb's own last line ("Find logs at: ...") points at its logs of the attempt: they are
    # kept, and the line says where; nothing else of the refused run is left.
    (attempt,) = (tmp_path / "run" / "wandb").glob("run-*")
    assert line.endswith(
        f"; wandb kept its logs in {attempt / 'logs'}); check WANDB_BASE_URL and the network, set "
        "WANDB_MODE=offline to log locally (upload later with `wandb sync`), or remove wandb "
        "from logging.hooks"
    ), line
    assert (attempt / "logs" / "debug.log").is_file()
    assert [path.name for path in (tmp_path / "run").iterdir()] == ["wandb"]


def test_a_resumed_run_continues_its_tensorboard_curve_and_wandb_run(
    tmp_path, capsys, monkeypatch, wandb_offline
):
    # A crash after steps 3 and 4 were logged, then --resume from step 2: TensorBoard drew steps
    # 3 and 4 twice (the crashed attempt's and the resumed run's) and W&B started a second run.
    pytest.importorskip("tensorboard")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from speedtronic.cli import main

    run = tmp_path / "run"
    argv = ["train", str(ROOT / "configs" / "smoke.yaml"), "--device", "cpu"]
    argv += ["--set", f"run.output_dir={run}", "--set", "checkpoint.every_steps=2"]
    argv += ["--set", "logging.hooks=[tensorboard, wandb]"]
    assert main([*argv, "--max-steps", "2"]) == 0
    assert _with_step_4_checkpoint_on_a_full_disk(monkeypatch, main, argv) == 1
    assert main([*argv, "--max-steps", "5", "--resume"]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if r["event"] == "train_step"}
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("train_step/loss")}
    assert [e.step for e in events.Scalars("train_step/loss")] == [1, 2, 3, 4, 5]
    assert logged == pytest.approx(losses)  # the values metrics.jsonl holds, step for step
    # Three attempts, one W&B run: `wandb sync` uploads the offline folders to the same run.
    assert len(list((run / "wandb").glob("offline-run-*"))) == 3
    assert len({path.name for path in (run / "wandb").glob("offline-run-*/run-*.wandb")}) == 1


def _raise(error: BaseException) -> None:
    raise error


def _with_step_4_checkpoint_on_a_full_disk(monkeypatch, main, argv) -> int:
    """Return the exit code of `train ARGV --max-steps 5 --resume` whose checkpoints from step 4
    on find the disk full (a crash after steps 3 and 4 were logged).
    """
    import errno

    import speedtronic_trainer.checkpoint as checkpoint

    full = OSError(errno.ENOSPC, "No space left on device")
    save = checkpoint.atomic_torch_save
    with monkeypatch.context() as patch:
        patch.setattr(
            checkpoint,
            "atomic_torch_save",
            lambda state, path: save(state, path) if state["step"] < 4 else _raise(full),
        )
        return main([*argv, "--max-steps", "5", "--resume"])


def test_a_node_refused_under_a_used_node_id_is_told_the_one_fix_that_applies(
    smoke_run, refused, tmp_path
):
    # A node started without its checkpoint under a node id another process claimed is refused.
    # The refusal said both "--resume" and "where it wrote none, give a new node_id": the
    # coordinator could not tell a checkpoint not given from none there.
    from speedtronic_config import SpeedtronicConfig
    from speedtronic_diloco import build_hub_client
    from speedtronic_diloco.testing.hub_server import HubServer

    with HubServer() as server:
        node = yaml.safe_dump(
            {
                "enabled": True,
                "role": "master",
                "node_id": "m",
                "repo_id": "org/run",
                "endpoint": server.url,
            }
        )
        config = tiny_config(tmp_path, distributed=node)
        hub = build_hub_client(SpeedtronicConfig.load(config).distributed)
        hub.create_repo()
        # m's claim, by a process on another machine: never taken over
        hub.write_json("nodes/m.json", {"session": "other", "host": "elsewhere", "pid": 1})
        refusal = "speedtronic train: HubError: node 'm' already ran in org/run or runs there now"
        checkpoints = tmp_path / "run" / "checkpoints"
        for args in ([], ["--resume"]):  # a folder without a checkpoint: resuming cannot help
            assert_one_line_error(
                refused("train", str(config), *args, cwd=tmp_path),
                1,
                refusal,
                f"; {checkpoints} holds no checkpoint of this node to resume from, so give it a "
                "new distributed.node_id (deleting nodes/m.json would let them collide)",
            )
        shutil.copytree(smoke_run[1] / "checkpoints", checkpoints, dirs_exist_ok=True)
        result = refused("train", str(config), cwd=tmp_path)  # its checkpoint, not resumed
        assert_one_line_error(
            result,
            1,
            refusal,
            f"; resume it from its checkpoint {checkpoints / 'step_4.pt'} (--resume) (deleting",
        )
        assert "node_id" not in result.stderr.split("; resume it")[1]
