from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import speedtronic_optim
from speedtronic_optim import (
    CautiousOptimizer,
    HybridOptimizer,
    build_optimizer,
)
from speedtronic_optim.adamw import DEFAULT_BETAS, DEFAULT_EPS, DEFAULT_LR, DEFAULT_WEIGHT_DECAY


@dataclass
class Section:
    name: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | None = None
    muon_plus: bool = False
    cautious: bool = False
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5
    muon_norm_eps: float = 1e-8
    adamw_lr: float | None = None


def test_adamw_default(make_lm) -> None:
    model = make_lm()
    optimizer = build_optimizer(model, Section(), torch.device("cpu"))
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["betas"] == (0.9, 0.95) and group["weight_decay"] == 0.1
    frozen = make_lm()
    frozen.wte.weight.requires_grad_(False)
    params = build_optimizer(frozen, Section(), "cpu").param_groups[0]["params"]
    assert all(p.requires_grad for p in params)


def test_muon_builds_hybrid_with_section_fields(make_lm) -> None:
    section = Section(
        name="muon", muon_plus=True, muon_momentum=0.9, muon_ns_steps=4, muon_norm_eps=1e-6
    )
    optimizer = build_optimizer(make_lm(), section, "cpu")
    assert isinstance(optimizer, HybridOptimizer)
    group = optimizer.muon.param_groups[0]
    assert (group["momentum"], group["ns_steps"], group["norm_eps"], group["muon_plus"]) == (
        0.9,
        4,
        1e-6,
        True,
    )
    assert group["adjust_lr"] == "match_rms_adamw"  # one lr for both branches
    assert optimizer.adamw.param_groups[0]["lr"] == group["lr"] == 1e-3
    assert optimizer.muon.distributed is None and optimizer.muon.process_group is None


def test_adamw_lr_sets_only_muons_adamw_branch_and_the_schedule_scales_both(make_lm) -> None:
    from speedtronic_optim import build_lr_scheduler

    optimizer = build_optimizer(make_lm(), Section(name="muon", lr=2e-3, adamw_lr=3e-2))
    assert optimizer.muon.param_groups[0]["lr"] == 2e-3
    assert optimizer.adamw.param_groups[0]["lr"] == 3e-2
    schedule = SimpleNamespace(name="cosine", warmup_steps=4, max_steps=8, min_lr_ratio=0.1)
    scheduler = build_lr_scheduler(optimizer, schedule)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([5e-4, 7.5e-3])
    optimizer.step()  # no gradients: nothing moves, the schedule advances in order
    scheduler.step()
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([1e-3, 1.5e-2])


def test_the_split_mode_reaches_muon(make_lm) -> None:
    group = torch.distributed.ProcessGroup(0, 1)  # passed through, not used without a step
    built = build_optimizer(
        make_lm(), Section(name="muon", cautious=True), distributed=True, process_group=group
    )
    assert (built.base.muon.distributed, built.base.muon.process_group) == (True, group)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_cautious_wraps_either(make_lm, lm_loss, name: str) -> None:
    model = make_lm()
    optimizer = build_optimizer(model, Section(name=name, cautious=True), "cpu")
    assert isinstance(optimizer, CautiousOptimizer)
    lm_loss(model).backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_fields_a_section_lacks_take_the_constructor_defaults(make_lm, name: str) -> None:
    class OnlyName:
        pass

    section = OnlyName()
    section.name = name
    optimizer = build_optimizer(make_lm(), section)
    adamw = optimizer.adamw if name == "muon" else optimizer
    group = adamw.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        DEFAULT_LR,
        DEFAULT_BETAS,
        DEFAULT_EPS,
        DEFAULT_WEIGHT_DECAY,
    )


def test_bad_sections(make_lm) -> None:
    with pytest.raises(ValueError, match="optimizer name 'lion' is not supported"):
        build_optimizer(make_lm(), Section(name="lion"), "cpu")
    model = make_lm().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, Section(), "cpu")


def test_a_mapping_with_a_key_no_section_has_is_refused_and_a_bare_name_builds(make_lm) -> None:
    # A misspelt key left the setting at its default, silently: lr 3e-4 here, not 0.02.
    with pytest.raises(ValueError, match=r"optimizer section: unknown key 'learning_rate'; the "):
        build_optimizer(make_lm(), {"name": "muon", "learning_rate": 0.02})
    with pytest.raises(ValueError, match=r"unknown key 'muon_lr'; the keys are adamw_lr, betas"):
        build_optimizer(make_lm(), {"name": "muon", "muon_lr": 0.02})
    # The YAML shorthand `optimizer: muon` names the optimizer alone (it read as name None).
    assert isinstance(build_optimizer(make_lm(), "muon"), HybridOptimizer)


def test_package_imports_only_torch() -> None:
    root = Path(speedtronic_optim.__file__).parent
    imported = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert (
        imported
        - {"__future__", "speedtronic_optim", "torch", "math", "typing", "dataclasses"}
        - {"collections", "functools", "numbers", "types", "warnings"}
        == set()
    )
