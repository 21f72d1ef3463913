from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from speedtronic_config import ConfigError
from speedtronic_systems.parallel import check_batch_split
from speedtronic_systems.precision import PrecisionPlan
from speedtronic_systems.shapes import (
    ShapeProfile,
    ShapeReport,
    resolve_shape_profile,
    validate_startup_shapes,
)

BF16_CUDA = PrecisionPlan("bf16", torch.bfloat16, False, True, "cuda")
FP16_CUDA = PrecisionPlan("fp16", torch.float16, True, True, "cuda")
FP32_CUDA = PrecisionPlan("fp32", torch.float32, False, False, "cuda")
FP32_CPU = PrecisionPlan("fp32", torch.float32, False, False, "cpu")


@dataclass
class ShapeSection:
    enabled: bool = True
    alignment: int | str = "auto"
    check_batch: bool = True
    check_sequence: bool = True
    check_model: bool = True
    check_vocab: bool = False
    warn_on_cpu: bool = False


@dataclass
class Config:
    shape_validation: ShapeSection = field(default_factory=ShapeSection)
    data: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(
            micro_batch_size=8, target_batch_size=64, block_size=1024
        )
    )
    model: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(
            d_model=768, d_ff=3072, n_head=12, n_kv_head=4, vocab_size=50304
        )
    )


class RecordingLogger:
    """A project-style logger: only has warning(msg, *args)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args) -> None:
        self.lines.append(message % args if args else message)


MODEL = torch.nn.Linear(64, 64)


def check(config, device="cuda", plan=BF16_CUDA, logger=None) -> ShapeReport:
    return validate_startup_shapes(config, MODEL, device, plan, logger=logger or RecordingLogger())


# --------------------------------------------------------------------------------------- profiles


@pytest.mark.parametrize(("plan", "alignment"), [(BF16_CUDA, 64), (FP16_CUDA, 64), (FP32_CUDA, 8)])
def test_cuda_auto_alignment_depends_on_dtype(plan, alignment):
    assert resolve_shape_profile("cuda:0", plan) == ShapeProfile(
        "cuda", plan.mode, alignment, "auto"
    )


def test_cpu_auto_profile_is_quiet_and_mps_auto_is_eight():
    assert resolve_shape_profile("cpu", FP32_CPU) == ShapeProfile("cpu", "fp32", 1, "cpu-auto")
    assert resolve_shape_profile("mps", FP32_CPU, requested_alignment=None).alignment == 8


def test_explicit_alignment_overrides_auto():
    assert resolve_shape_profile("cpu", FP32_CPU, requested_alignment=16) == ShapeProfile(
        "cpu", "fp32", 16, "explicit"
    )
    assert resolve_shape_profile("cuda", BF16_CUDA, requested_alignment="32").alignment == 32


@pytest.mark.parametrize("bad", [0, -8, 2.5, "eight", True, "08"])
def test_bad_alignment_is_rejected_with_its_value(bad):
    with pytest.raises(ConfigError, match=r"shape_validation.alignment"):
        resolve_shape_profile("cuda", BF16_CUDA, requested_alignment=bad)


# ----------------------------------------------------------------------------------------- checks


def test_aligned_gpt2_shapes_are_quiet_on_cuda():
    report = check(Config())
    assert report.warning_count() == 0 and report.profile.alignment == 64


def test_each_misaligned_dimension_warns_with_value_alignment_and_suggestion():
    config = Config()
    config.data.block_size = 1000
    config.model.d_model, config.model.d_ff, config.model.n_head, config.model.n_kv_head = (
        520,
        2000,
        8,
        2,
    )
    logger = RecordingLogger()
    report = check(config, logger=logger)
    got = {(w.code, w.field, w.value, w.suggested, w.alignment) for w in report.warnings}
    assert got == {
        ("sequence", "data.block_size", 1000, 1024, 64),
        ("model", "model.d_model", 520, 512, 64),
        ("model", "model.d_ff", 2000, 1984, 64),
        ("model", "model.head_dim", 65, 64, 64),
        ("model", "model.kv_width (n_kv_head * head_dim)", 130, 128, 64),
    }
    assert "shape: data.block_size=1000 is not a multiple of 64; suggested 1024" in logger.lines[0]
    assert len(logger.lines) == report.warning_count() == 5


def test_batch_suggestion_keeps_target_divisible():
    config = Config()
    config.data.micro_batch_size, config.data.target_batch_size = 10, 48
    (warning,) = check(config).warnings
    assert (warning.field, warning.value, warning.alignment, warning.suggested) == (
        "data.micro_batch_size",
        10,
        8,
        8,
    )
    config.data.micro_batch_size, config.data.target_batch_size = 20, 48  # 16 and 24 both divide 48
    assert check(config).warnings[0].suggested == 24  # the tie goes to the larger batch
    config.data.micro_batch_size, config.data.target_batch_size = 30, 40  # 32 would not divide 40
    assert check(config).warnings[0].suggested == 40


def test_batch_without_any_aligned_divisor_suggests_nothing_and_says_why():
    config = Config()
    config.data.micro_batch_size, config.data.target_batch_size = 3, 9
    (warning,) = check(config).warnings
    assert warning.suggested is None
    assert "no multiple of 8 divides data.target_batch_size=9" in warning.message
    assert "suggested" not in warning.message


def test_batch_suggestion_divides_each_ranks_share_under_data_parallelism():
    # Found: 2 ranks with a target of 48 were told to use micro batches of 16, which divide 48
    # but not a rank's 24, so check_batch_split refused the advice.
    config = Config()
    config.data.micro_batch_size, config.data.target_batch_size = 14, 48
    assert check(config).warnings[0].suggested == 16  # one process: 16 divides its 48
    (warning,) = validate_startup_shapes(
        config, MODEL, "cuda", BF16_CUDA, logger=RecordingLogger(), world_size=2
    ).warnings
    assert warning.suggested == 8
    check_batch_split(48, warning.suggested, 2)  # the advice is a batch the ranks accept
    config.data.micro_batch_size, config.data.target_batch_size = 3, 12  # 6 per rank
    (warning,) = validate_startup_shapes(
        config, MODEL, "cuda", BF16_CUDA, logger=RecordingLogger(), world_size=2
    ).warnings
    assert warning.suggested is None
    assert "no multiple of 8 divides data.target_batch_size=12 / 2 ranks" in warning.message


@given(micro=st.integers(1, 64), factor=st.integers(1, 16))
def test_batch_suggestion_always_divides_the_target(micro, factor):
    config = Config()
    config.data.micro_batch_size, config.data.target_batch_size = micro, micro * factor
    for warning in check(config).warnings:
        if warning.suggested is not None:
            assert warning.suggested % 8 == 0 and (micro * factor) % warning.suggested == 0


def test_vocab_is_checked_only_when_enabled():
    config = Config()
    config.model.vocab_size = 50257
    assert check(config).warning_count() == 0
    config.shape_validation.check_vocab = True
    (warning,) = check(config).warnings
    # Rounded up (nanoGPT's 50304): a vocabulary cut to 50240 would not hold GPT-2's token ids.
    assert (warning.code, warning.value, warning.suggested) == ("vocab", 50257, 50304)


def test_check_switches_turn_each_family_off():
    config = Config()
    config.data.micro_batch_size, config.data.block_size, config.model.d_model = 3, 1000, 520
    assert {w.code for w in check(config).warnings} == {"batch", "sequence", "model"}
    config.shape_validation.check_batch = False
    config.shape_validation.check_sequence = False
    config.shape_validation.check_model = False
    assert check(config).warning_count() == 0
    config.shape_validation = ShapeSection(enabled=False, check_vocab=True)
    assert check(config).warning_count() == 0


def test_duplicate_dimensions_warn_once():
    config = Config()
    config.model.d_model, config.model.d_ff, config.model.n_head, config.model.n_kv_head = (
        100,
        100,
        1,
        1,
    )
    # d_model, d_ff, head_dim and kv width are all 100: one warning, not four.
    assert [w.field for w in check(config).warnings] == ["model.d_model"]


def test_model_modules_are_inspected_when_the_config_has_no_model_section():
    config = Config()
    config.model = None  # type: ignore[assignment]
    model = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.Linear(100, 64))
    report = validate_startup_shapes(config, model, "cuda", BF16_CUDA, logger=RecordingLogger())
    assert [(w.field, w.value) for w in report.warnings] == [("0.out_features", 100)]
    report = validate_startup_shapes(
        config, torch.nn.Linear(64, 10), "cuda", BF16_CUDA, logger=RecordingLogger()
    )
    assert [(w.field, w.value) for w in report.warnings] == [("model.out_features", 10)]


# ------------------------------------------------------------------------------------------- CPU


def test_cpu_auto_is_quiet_even_with_warn_on_cpu():
    config = Config()
    config.data.block_size, config.shape_validation.warn_on_cpu = 1000, True
    assert check(config, "cpu", FP32_CPU).warning_count() == 0


def test_cpu_explicit_alignment_warns_only_with_warn_on_cpu():
    config = Config()
    config.data.block_size, config.shape_validation.alignment = 1000, 64
    report = check(config, "cpu", FP32_CPU)
    assert report.warning_count() == 0 and report.profile.source == "explicit"
    config.shape_validation.warn_on_cpu = True
    assert [w.value for w in check(config, "cpu", FP32_CPU).warnings] == [1000]


# ------------------------------------------------------------------------------ inputs and output


def test_stdlib_logger_and_default_logger_both_receive_warnings(caplog):
    config = Config()
    config.data.block_size = 1000
    caplog.set_level(logging.WARNING)
    validate_startup_shapes(config, MODEL, "cuda", BF16_CUDA, logger=logging.getLogger("my.run"))
    validate_startup_shapes(config, MODEL, "cuda", BF16_CUDA)
    assert [r.name for r in caplog.records] == ["my.run", "speedtronic_systems.shapes"]
    assert all("data.block_size=1000" in r.getMessage() for r in caplog.records)


def test_sections_may_be_mappings_bools_or_missing():
    config = SimpleNamespace(
        data=SimpleNamespace(micro_batch_size=8, target_batch_size=8, block_size=1000),
        model=None,
        shape_validation={"alignment": 16, "check_model": False},
    )
    (warning,) = check(config).warnings
    assert (warning.alignment, warning.suggested) == (16, 1008)  # a tie rounds up
    config.shape_validation = False
    assert check(config).warning_count() == 0
    del config.shape_validation
    assert check(config).profile.source == "auto" and check(config).warning_count() == 1


def test_data_and_model_sections_and_the_whole_config_may_be_mappings():
    # Mapping sections used to be read with getattr: nothing was checked, silently.
    data = {"micro_batch_size": 8, "target_batch_size": 8, "block_size": 1000}
    model = {"d_model": 520, "n_head": 8, "vocab_size": 50304}
    expected = {"data.block_size", "model.d_model", "model.head_dim"}
    config = SimpleNamespace(data=data, model=model, shape_validation=None)
    assert {w.field for w in check(config).warnings} == expected
    whole = {"data": data, "model": model, "shape_validation": {"check_model": False}}
    assert {w.field for w in check(whole).warnings} == {"data.block_size"}


def test_report_as_dict_is_plain_data():
    config = Config()
    config.data.block_size = 1000
    data = check(config).as_dict()
    assert data["warning_count"] == 1
    assert data["profile"] == {
        "device_type": "cuda",
        "precision": "bf16",
        "alignment": 64,
        "source": "auto",
    }
    assert data["warnings"][0]["suggested"] == 1024
    assert data["warnings"][0]["message"].startswith("shape: data.block_size=1000")
