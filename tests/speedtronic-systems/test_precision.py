from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch

from speedtronic_config import ConfigError
from speedtronic_systems import precision
from speedtronic_systems.parallel import SINGLE, ParallelContext
from speedtronic_systems.precision import (
    DeviceError,
    PrecisionError,
    agree_precision,
    autocast_context,
    datasheet_peak_flops,
    device_peak_flops,
    make_grad_scaler,
    parameter_count,
    resolve_device,
    resolve_precision,
    supports_fused_adamw,
)

LOGGER = "speedtronic_systems.precision"


@dataclass
class Section:
    mode: str = "auto"
    dtype: str | None = None


def fallbacks(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]


# ----------------------------------------------------------------------------------- resolve_device


def test_auto_device_prefers_cuda_then_mps_then_cpu(fake_cuda, monkeypatch):
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(precision, "_cuda_available", lambda: False)
    monkeypatch.setattr(precision, "_mps_available", lambda: True)
    assert resolve_device() == torch.device("mps")
    monkeypatch.setattr(precision, "_mps_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu")


def test_explicit_devices_resolve_when_present(fake_cuda):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CUDA ") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)


def test_missing_cuda_names_what_is_available(bare_cpu):
    with pytest.raises(DeviceError, match=r"'cuda'.*CUDA is not available; available: cpu$"):
        resolve_device("cuda")


def test_cuda_index_past_the_device_count_is_rejected(fake_cuda):
    with pytest.raises(
        DeviceError, match=r"only 2 CUDA device\(s\).*available: cpu, cuda:0, cuda:1"
    ):
        resolve_device("cuda:2")


def test_missing_mps_is_rejected(bare_cpu):
    with pytest.raises(DeviceError, match="MPS is not available"):
        resolve_device("mps")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "", "meta"])
def test_unknown_device_names_are_rejected_with_the_accepted_forms(bad, bare_cpu):
    with pytest.raises(DeviceError, match="use auto, cpu, cuda, cuda:N or mps"):
        resolve_device(bad)


# --------------------------------------------------------------------------------- precision rules


def test_auto_on_cuda_with_bf16_is_bf16_without_scaler(fake_cuda, caplog):
    plan = resolve_precision(Section(), "cuda")
    assert (plan.mode, plan.dtype, plan.autocast_enabled, plan.use_scaler) == (
        "bf16",
        torch.bfloat16,
        True,
        False,
    )
    assert plan.is_mixed_precision() and fallbacks(caplog) == []


def test_auto_on_cuda_without_bf16_is_fp16_with_scaler_and_says_why(fake_cuda, caplog):
    fake_cuda["bf16"] = False
    plan = resolve_precision(Section(), "cuda")
    assert (plan.mode, plan.dtype, plan.use_scaler) == ("fp16", torch.float16, True)
    assert fallbacks(caplog) == [
        "precision auto (bf16) on cuda falls back to fp16: this CUDA device does not support BF16"
    ]


def test_cuda_bf16_means_bf16_in_hardware_of_the_runs_own_gpu(monkeypatch):
    # A node with an A100 (8.0) as cuda:0, the current device, and a T4 (7.5) as cuda:1, as
    # torch >= 2.3 sees them: a BF16 tensor can be made on the T4 (emulated BF16), so
    # torch.cuda.is_bf16_supported() is true there too, and it only asks the current device.
    capabilities = {0: (8, 0), 1: (7, 5)}

    def index(device=None) -> int:
        if isinstance(device, int):
            return device
        found = None if device is None else torch.device(device).index
        return 0 if found is None else found

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capabilities[index(d)])
    props = {i: type("Props", (), {"major": c[0], "minor": c[1]}) for i, c in capabilities.items()}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props[index(d)])
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    for device in ("cuda", "cuda:0"):
        plan = resolve_precision(Section(), device)
        assert (plan.mode, plan.use_scaler) == ("bf16", False)
        assert resolve_precision("bf16", device).mode == "bf16"
    plan = resolve_precision(Section(), "cuda:1")  # the T4: FP16 with a GradScaler
    assert (plan.mode, plan.use_scaler) == ("fp16", True)
    assert resolve_precision("bf16", "cuda:1").mode == "fp32"


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_auto_on_cpu_and_mps_is_fp32(device, caplog):
    plan = resolve_precision(Section(), device)
    assert (plan.mode, plan.autocast_enabled, plan.use_scaler, plan.device_type) == (
        "fp32",
        False,
        False,
        device,
    )
    assert fallbacks(caplog) == []


def _mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.Linear(4 * width, width),
        torch.nn.Linear(width, 7),
    )


def test_matmul_width_is_the_median_narrow_side_of_the_linear_layers():
    assert precision.matmul_width(_mlp(256)) == 256  # sides 256, 256, 7
    assert precision.matmul_width(torch.nn.Linear(5, 9)) == 5
    assert precision.matmul_width(torch.nn.Conv1d(4, 4, 3)) == 0


@pytest.mark.parametrize(
    "width, native, mode",
    [
        (precision.CPU_BF16_MIN_WIDTH, True, "bf16"),
        (precision.CPU_BF16_MIN_WIDTH - 1, True, "fp32"),
        (precision.CPU_BF16_MIN_WIDTH, False, "fp32"),
    ],
)
def test_auto_on_cpu_picks_bf16_for_wide_models_on_native_bf16(monkeypatch, width, native, mode):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: native)
    plan = resolve_precision(Section(), "cpu", model=_mlp(width))
    assert (plan.mode, plan.autocast_enabled, plan.use_scaler) == (mode, mode == "bf16", False)
    assert plan.reason and (("native BF16 and matmuls" in plan.reason) is (mode == "bf16"))


def test_auto_on_cpu_keeps_fp32_without_a_model_or_with_a_dtype_hint(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: True)
    wide = _mlp(precision.CPU_BF16_MIN_WIDTH)
    assert resolve_precision(Section(), "cpu").mode == "fp32"
    assert resolve_precision(Section(dtype="fp32"), "cpu", model=wide).mode == "fp32"
    assert resolve_precision(Section(), "mps", model=wide).mode == "fp32"
    assert resolve_precision(Section(mode="fp32"), "cpu", model=wide).reason == ""


def test_auto_dtype_steers_cuda_only(fake_cuda, caplog):
    assert resolve_precision(Section(dtype="fp16"), "cuda").mode == "fp16"
    assert resolve_precision(Section(dtype="fp32"), "cuda").mode == "fp32"
    assert resolve_precision(Section(dtype="bf16"), "cpu").mode == "fp32"
    assert resolve_precision(Section(dtype="bf16"), "mps").mode == "fp32"
    # Each hint names what would give BF16 there: an explicit mode on CPU, nothing on MPS.
    assert fallbacks(caplog) == [
        "precision auto (dtype bf16) on cpu falls back to fp32: auto precision is FP32 on CPU "
        "without a model to size; set precision.mode: bf16 to request BF16",
        "precision auto (dtype bf16) on mps falls back to fp32: mixed precision is not "
        "supported on MPS",
    ]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("native", [True, False])
def test_a_half_dtype_hint_leaves_auto_on_cpu_to_the_hardware_and_model(
    monkeypatch, caplog, dtype, native
):
    # The hint steers CUDA only: on CPU, auto with a CUDA hint decides as auto without one.
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: native)
    for model in (_mlp(precision.CPU_BF16_MIN_WIDTH), _mlp(precision.CPU_BF16_MIN_WIDTH - 1)):
        hinted = resolve_precision(Section(dtype=dtype), "cpu", model=model)
        assert hinted == resolve_precision(Section(), "cpu", model=model)
        assert hinted.reason == resolve_precision(Section(), "cpu", model=model).reason
    assert fallbacks(caplog) == []


def test_explicit_mode_wins_over_dtype(fake_cuda):
    assert resolve_precision(Section(mode="fp32", dtype="bf16"), "cuda").mode == "fp32"
    assert resolve_precision(Section(mode="fp16", dtype="bf16"), "cuda").mode == "fp16"


def test_explicit_bf16_on_cuda(fake_cuda, caplog):
    assert resolve_precision("bf16", "cuda").dtype == torch.bfloat16
    fake_cuda["bf16"] = False
    plan = resolve_precision("bf16", "cuda:0")
    assert (plan.mode, plan.autocast_enabled) == ("fp32", False)
    assert fallbacks(caplog) == [
        "precision bf16 on cuda falls back to fp32: this CUDA device does not support BF16"
    ]


def test_explicit_fp16_on_cuda_uses_a_scaler(fake_cuda):
    plan = resolve_precision({"mode": "fp16"}, "cuda")
    assert (plan.mode, plan.dtype, plan.use_scaler, plan.autocast_enabled) == (
        "fp16",
        torch.float16,
        True,
        True,
    )


def test_explicit_fp16_on_cpu_falls_back_to_fp32(caplog):
    plan = resolve_precision("fp16", "cpu")
    assert (plan.mode, plan.use_scaler, plan.autocast_enabled) == ("fp32", False, False)
    assert len(fallbacks(caplog)) == 1 and "fp16 on cpu falls back to fp32" in fallbacks(caplog)[0]


def test_explicit_bf16_on_cpu_is_used_when_the_cpu_supports_it(monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: True)
    plan = resolve_precision("bf16", "cpu")
    assert (plan.mode, plan.dtype, plan.autocast_enabled, plan.use_scaler) == (
        "bf16",
        torch.bfloat16,
        True,
        False,
    )
    assert fallbacks(caplog) == []


def test_explicit_bf16_on_cpu_without_support_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: False)
    plan = resolve_precision("bf16", "cpu")
    assert (plan.mode, plan.autocast_enabled) == ("fp32", False)
    assert fallbacks(caplog) == [
        "precision bf16 on cpu falls back to fp32: PyTorch reports no native BF16 support "
        "on this CPU (needs AVX512-BF16/AMX); BF16 would be emulated and slower"
    ]


def test_cpu_bf16_capability_follows_what_pytorch_reports(monkeypatch):
    monkeypatch.setattr(precision, "_x86_bf16_instructions", lambda: None)  # not an x86 CPU
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert precision.cpu_bf16_supported() is torch.backends.mkldnn.is_available()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    assert precision.cpu_bf16_supported() is False

    def broken() -> bool:
        raise RuntimeError("no such op")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", broken, raising=False)
    assert precision.cpu_bf16_supported() is False


@pytest.mark.parametrize(
    "avx512_bf16, amx, native", [(False, False, False), (True, False, True), (False, True, True)]
)
def test_an_x86_cpu_needs_bf16_instructions_not_only_onednns_avx512_probe(
    monkeypatch, avx512_bf16, amx, native
):
    # oneDNN says yes on any AVX512 CPU (Skylake to Ice Lake servers), where BF16 is emulated.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert precision.cpu_bf16_supported() is native
    wide = _mlp(precision.CPU_BF16_MIN_WIDTH)
    assert resolve_precision(Section(), "cpu", model=wide).mode == ("bf16" if native else "fp32")
    assert resolve_precision("bf16", "cpu").mode == ("bf16" if native else "fp32")


def test_other_cpus_and_a_torch_without_the_x86_probes_keep_onednns_answer(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    assert precision._x86_bf16_instructions() is None
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert precision._x86_bf16_instructions() is None


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_on_mps_falls_back_to_fp32(mode, caplog):
    plan = resolve_precision(mode, "mps")
    assert (plan.mode, plan.device_type) == ("fp32", "mps")
    assert fallbacks(caplog) == [
        f"precision {mode} on mps falls back to fp32: mixed precision is not supported on MPS"
    ]


def test_each_fallback_is_logged_once(caplog):
    for _ in range(3):
        resolve_precision("fp16", "cpu")
    resolve_precision("fp16", "mps")  # a different reason is a new line
    assert len(fallbacks(caplog)) == 2


def test_fp32_is_fp32_everywhere(fake_cuda):
    for device in ("cpu", "cuda", "mps"):
        plan = resolve_precision(Section(mode="FP32"), device)
        assert (plan.mode, plan.dtype, plan.autocast_enabled, plan.use_scaler) == (
            "fp32",
            torch.float32,
            False,
            False,
        )


def test_missing_section_means_auto(fake_cuda):
    assert resolve_precision(None, "cuda").mode == "bf16"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("fp8", r"precision.mode: unsupported value \(got 'fp8'\); choose one of auto, bf16"),
        (Section(mode="half"), r"precision.mode: .* \(got 'half'\)"),
        (Section(mode=None), r"precision.mode: must not be null"),
        (Section(dtype="float64"), r"precision.dtype: unsupported value \(got 'float64'\)"),
    ],
)
def test_bad_sections_name_the_field_and_value(section, message):
    # PrecisionConfig owns these rules: the same ConfigError as in a config file.
    with pytest.raises(ConfigError, match=message):
        resolve_precision(section, "cpu")


# ----------------------------------------------------------------------------- agreement over ranks


@dataclass(frozen=True)
class Ranks(ParallelContext):
    """Rank 0 of a group whose ranks resolved `modes`, as all_gather_object returns them.
    (A real gloo group disagreeing is in tests/speedtronic/parallel_worker.py.)
    """

    modes: tuple[str, ...] = ()

    def all_gather_object(self, value: str) -> list[str]:
        assert value == self.modes[0], "this process is rank 0"
        return list(self.modes)


def test_a_group_that_agrees_keeps_its_plan(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: True)
    plan = resolve_precision("bf16", "cpu")
    assert agree_precision(plan, Ranks(modes=("bf16", "bf16", "bf16"))) is plan
    assert agree_precision(plan, SINGLE) is plan


@pytest.mark.parametrize(
    ("modes", "device", "split"),
    [
        (["bf16", "fp32", "bf16", "fp32"], "cpu", "bf16 on rank 0, 2; fp32 on rank 1, 3"),
        (["fp16", "bf16"], "cuda", "fp16 on rank 0; bf16 on rank 1"),
    ],
)
def test_a_group_that_disagrees_trains_in_fp32_and_says_which_rank_chose_what(
    fake_cuda, monkeypatch, modes, device, split
):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: True)
    plan = resolve_precision(modes[0], device)
    agreed = agree_precision(plan, Ranks(modes=tuple(modes)))
    assert (agreed.mode, agreed.autocast_enabled, agreed.use_scaler, agreed.device_type) == (
        "fp32",
        False,
        False,
        device,
    )
    assert agreed.reason == (
        f"the ranks resolved different precisions ({split}); every rank trains in fp32"
    )


# -------------------------------------------------------------------------------- autocast & scaler


def test_autocast_context_is_a_noop_for_fp32():
    plan = resolve_precision("fp32", "cpu")
    with autocast_context(plan, "cpu"):
        assert not torch.is_autocast_enabled("cpu")
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.float32


def test_autocast_context_runs_cpu_matmuls_in_bf16_when_planned(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_supported", lambda: True)
    plan = resolve_precision("bf16", "cpu")
    with autocast_context(plan):  # the plan's device type is the default
        out = torch.ones(4, 4) @ torch.ones(4, 4)
    assert out.dtype == torch.bfloat16
    assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.float32


@pytest.mark.filterwarnings(
    "ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available"
)
def test_grad_scaler_only_for_cuda_fp16(fake_cuda):
    assert make_grad_scaler(resolve_precision("bf16", "cuda")) is None
    assert make_grad_scaler(resolve_precision("fp32", "cpu")) is None
    scaler = make_grad_scaler(resolve_precision("fp16", "cuda"))
    assert isinstance(scaler, torch.amp.GradScaler)


# ------------------------------------------------------------------------------------ capabilities


def test_fused_adamw_probe_matches_a_real_fused_step_and_degrades(monkeypatch):
    precision._fused_adamw_probe.cache_clear()
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones(3)
    try:
        torch.optim.AdamW([param], fused=True).step()
        works = True
    except Exception:
        works = False
    assert supports_fused_adamw("cpu") is works

    def no_fused(*args, **kwargs):
        raise RuntimeError("fused=True requires CUDA")

    precision._fused_adamw_probe.cache_clear()
    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    assert supports_fused_adamw(torch.device("cpu")) is False
    precision._fused_adamw_probe.cache_clear()


def test_parameter_count_counts_shared_weights_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=True)
    head.weight = emb.weight  # tied
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert parameter_count(model) == 10 * 4 + 10
    head.bias.requires_grad_(False)
    assert parameter_count(model, trainable_only=True) == 40


# ------------------------------------------------------------------------------------- peak FLOPs


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H200", torch.bfloat16, 989e12),
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", torch.float16, 756e12),
        ("NVIDIA H100 PCIe", "fp32", 51e12),
        # Not the SXM part's 989e12: NVIDIA's datasheet gives the NVL 1,671 TFLOP/s with sparsity.
        ("NVIDIA H100 NVL", torch.bfloat16, 835e12),
        ("NVIDIA H100 NVL", torch.float32, 60e12),
        ("NVIDIA A100-SXM4-40GB", torch.float32, 19.5e12),
        ("NVIDIA L4", "fp16", 121e12),
    ],
)
def test_known_gpus_use_their_datasheet_peak(fake_cuda, name, dtype, expected):
    fake_cuda["name"] = name
    assert device_peak_flops("cuda", dtype) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Cards whose names contain a known card's name: not that card, so no datasheet peak.
        ("NVIDIA L40", None),
        ("NVIDIA RTX A1000", None),
        ("NVIDIA RTX A1000 6GB Laptop GPU", None),
        # The cards in the table keep their numbers, however the driver spells the variant.
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("nvidia h100 pcie", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("NVIDIA A10G", 70e12),
        ("Tesla T4", 65e12),
    ],
)
def test_datasheet_peaks_match_whole_card_names(fake_cuda, name, expected):
    fake_cuda["name"] = name
    assert datasheet_peak_flops("cuda", torch.float16) == expected


def test_unknown_gpus_and_missing_dtypes_are_measured(fake_cuda, monkeypatch):
    calls = []
    monkeypatch.setattr(
        precision,
        "measured_matmul_flops",
        lambda device, dtype: calls.append((device, dtype)) or 1e12,
    )
    fake_cuda["name"] = "Some Future GPU"
    assert device_peak_flops("cuda:0", torch.bfloat16) == 1e12
    fake_cuda["name"] = "Tesla V100-SXM2-16GB"  # no BF16 in hardware: the table has no number
    assert device_peak_flops("cuda:0", "bf16") == 1e12
    assert calls == [("cuda:0", torch.bfloat16)] * 2


def test_cpu_peak_is_a_measured_positive_rate():
    precision.measured_matmul_flops.cache_clear()
    peak = device_peak_flops("cpu", torch.float32)
    assert peak is not None and peak > 0
    assert device_peak_flops("cpu") == peak  # measured once per process, then cached


def test_the_peak_probe_leaves_the_global_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    precision.measured_matmul_flops("cpu", torch.float32, size=32, repeats=1)
    assert torch.equal(torch.rand(3), expected)


def test_a_failing_probe_reports_no_peak(monkeypatch, caplog):
    def broken(device, dtype):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(precision, "measured_matmul_flops", broken)
    assert device_peak_flops("cpu", torch.float32) is None
    assert "MFU will not be reported" in caplog.text


def test_bad_peak_dtype_is_rejected():
    with pytest.raises(
        PrecisionError, match="dtype must be one of bf16, fp16, fp32 or a torch.dtype; got 'int8'"
    ):
        device_peak_flops("cpu", "int8")
