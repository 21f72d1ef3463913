"""The export's README.md says how the model was trained and shows the loss curve."""

from __future__ import annotations

import json
import math

from interop_testkit import noisy_checkpoint, run_config

from speedtronic.artifacts import read_checkpoint
from speedtronic.model_card import final_val_loss, find_metrics, write_model_card
from speedtronic_config import OptimizerConfig, SpeedtronicConfig
from speedtronic_data.tokenizer_record import BYTES

SECRET = "hf_CARD_secret_token"


def test_card_from_a_trained_run(tmp_path, byte_shards):
    from speedtronic.runtime import train_from_config

    config = run_config(tmp_path / "run", byte_shards)
    config["distributed"] = {"token": SECRET}
    result = train_from_config(config)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_4.pt"
    state = read_checkpoint(checkpoint)
    (tmp_path / "out").mkdir()
    card = write_model_card(
        tmp_path / "out",
        SpeedtronicConfig.from_dict(state["config"]),
        state,
        checkpoint=checkpoint,
        tokenizer=BYTES,
        repo_id="me/tiny",
    )
    text = card.read_text()
    assert text.startswith("---\nlibrary_name: transformers\n")
    assert "| steps | 4 |" in text and f"| tokens | {result.tokens:,} |" in text
    val = result.metrics["val_loss"]
    assert f"| final validation loss | {val:.4f} nats/token (step 4) |" in text
    assert "the byte tokenizer (256 ids)" in text and "LlamaForCausalLM: 2 layers" in text
    assert '"me/tiny"' in text and "![training and validation loss](loss_curve.png)" in text
    assert (tmp_path / "out" / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "n_kv_head: 2" in text  # the full training config, as YAML
    assert SECRET not in text


def test_card_without_metrics(tmp_path, byte_shards):
    config = run_config(tmp_path / "run", byte_shards)
    checkpoint = noisy_checkpoint(config, step=7)
    state = read_checkpoint(checkpoint)
    loaded = SpeedtronicConfig.from_dict(state["config"])
    assert find_metrics(loaded, checkpoint) == tmp_path / "run" / "metrics.jsonl"  # no loss yet
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "loss_curve.png").write_bytes(b"stale")
    text = write_model_card(
        tmp_path / "out", loaded, state, checkpoint=checkpoint, tokenizer=BYTES
    ).read_text()
    assert "| final validation loss | not measured |" in text and "| steps | 7 |" in text
    assert "loss_curve.png" not in text and not (tmp_path / "out" / "loss_curve.png").exists()
    assert '"path/to/this/folder"' in text
    assert "| optimizer | adamw, lr 0.003, weight decay 0.1 |" in text
    loaded.optimizer = OptimizerConfig(name="muon", lr=0.004, adamw_lr=0.032, weight_decay=0.0)
    text = write_model_card(
        tmp_path / "out", loaded, state, checkpoint=checkpoint, tokenizer=BYTES
    ).read_text()
    assert "| optimizer | muon, lr 0.004 (its AdamW branch at 0.032), weight decay 0 |" in text
    (tmp_path / "run" / "metrics.jsonl").unlink()
    assert find_metrics(loaded, checkpoint) is None
    write_model_card(tmp_path / "out", loaded, state, checkpoint=checkpoint, tokenizer=BYTES)


def test_a_copied_run_folder_uses_its_own_metrics(tmp_path):
    from types import SimpleNamespace

    copied = tmp_path / "copy" / "checkpoints" / "step_4.pt"
    copied.parent.mkdir(parents=True)
    (tmp_path / "copy" / "metrics.jsonl").write_text("{}\n")
    elsewhere = tmp_path / "original.jsonl"  # what the run's config named, from another cwd
    elsewhere.write_text("{}\n")
    config = SimpleNamespace(
        logging=SimpleNamespace(json_file=str(elsewhere)),
        run=SimpleNamespace(output_dir=str(tmp_path / "gone")),
    )
    assert find_metrics(config, copied) == tmp_path / "copy" / "metrics.jsonl"
    (tmp_path / "copy" / "metrics.jsonl").unlink()
    assert find_metrics(config, copied) == elsewhere


def test_final_val_loss_is_the_last_at_or_before_the_checkpoint():
    records = [
        {"step": 2, "val_loss": 3.0},
        {"step": 3, "loss": 2.0},
        {"step": 4, "val_loss": 2.5},
        {"step": 6, "val_loss": 2.0},
    ]
    assert final_val_loss(records, 5) == (4, 2.5)
    assert final_val_loss(records, 1) is None
    assert json.dumps(final_val_loss(records, 99)) == "[6, 2.0]"


def test_the_curve_stops_at_the_checkpoint_step(tmp_path, byte_shards, monkeypatch):
    from matplotlib.figure import Figure

    checkpoint = noisy_checkpoint(run_config(tmp_path / "run", byte_shards), step=4)
    # the run was resumed from step 4 on to step 8: the step-4 card plots steps 1-4 only
    records = [{"event": "train_step", "step": s, "loss": 6.0 - s / 10} for s in range(1, 9)]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plotted = []
    monkeypatch.setattr(
        Figure, "savefig", lambda fig, *_, **__: plotted.append(fig.axes[0].lines[0].get_xdata())
    )
    state = read_checkpoint(checkpoint)
    (tmp_path / "out").mkdir()
    config = SpeedtronicConfig.from_dict(state["config"])
    write_model_card(tmp_path / "out", config, state, checkpoint=checkpoint, tokenizer=BYTES)
    assert [list(x) for x in plotted] == [[1, 2, 3, 4]]


def test_a_nonfinite_val_loss_reads_alike_as_nan_or_null(tmp_path):
    # Metrics files now write a non-finite value as null (strict JSON); older ones hold NaN. The
    # card reports that last evaluation either way, not an earlier finite one.
    from speedtronic.plotting import iter_metrics

    for literal in ("NaN", "null"):
        path = tmp_path / f"{literal}.jsonl"
        path.write_text(
            '{"event": "eval", "step": 2, "val_loss": 2.5}\n'
            f'{{"event": "eval", "step": 4, "val_loss": {literal}}}\n'
            f'{{"event": "nonfinite_skip", "step": 5, "loss": {literal}, "reason": "loss"}}\n'
        )
        step, value = final_val_loss(list(iter_metrics(path)), 5)
        assert step == 4 and math.isnan(value)
