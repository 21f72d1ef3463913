"""Hypothesis fuzzing of whole configs and of `--set` overrides: every input ends as a ConfigError
or a valid config that round-trips through YAML unchanged, passes the memory check or is refused
by it, and holds no nonsense (a huge size, an empty, blank or NUL name or path).
"""

from __future__ import annotations

import random
from dataclasses import fields
from pathlib import Path
from typing import Any

from harness import Result, Timer
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from speedtronic_config import ConfigError, SpeedtronicConfig, apply_overrides
from speedtronic_config.normalize import ROOT_KEYS, SECTIONS, field_names

# Sanity an accepted config must have, stated independently of the sections' own rules.
HUGE = 10**12
NAMES_AND_PATHS = {
    ("run", "name"),
    ("run", "output_dir"),
    ("model", "name"),
    ("data", "shard_path"),
    ("data", "val_shard_path"),
    ("data", "text_path"),
    ("data", "val_text_path"),
    ("checkpoint", "directory"),
    ("logging", "file"),
    ("logging", "json_file"),
    ("distributed", "endpoint"),
    ("distributed", "cache_dir"),
    ("distributed", "state_dir"),
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 4, 8, 64, 128, 2**31, 10**20, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", " ", "\x00", "a\x00b", "auto", "cpu", "muon", "wsd", "1e-8", "../../x"]),
    st.text(max_size=12),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=5), scalars, max_size=2),
)


TYPED = {
    "int": st.one_of(st.integers(1, 64), st.integers(min_value=-4, max_value=2**40)),
    "float": st.one_of(st.floats(0.0, 0.99), st.floats(min_value=-10.0, max_value=1e9)),
    "bool": st.booleans(),
    "str": st.one_of(st.text(max_size=8), st.sampled_from(["auto", "cpu", "muon", "wsd", "x/y"])),
}


def typed(section: str, name: str) -> st.SearchStrategy:
    """Values of the field's own type (so that many configs are valid), else wild ones."""
    annotation = {f.name: str(f.type) for f in fields(SECTIONS[section])}.get(name, "")
    base = annotation.removesuffix(" | None")
    if base not in TYPED:
        return values
    # Mostly well-typed, so that many configs validate and the checks after validation run too.
    return st.integers(0, 4).flatmap(lambda pick: values if pick == 0 else TYPED[base])


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A partial config mapping: real section and field names (and a few typos) with values of
    the field's type or wild ones.
    """
    tree: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True)):
        names = field_names(SECTIONS[section]) * 8 + ["typo_field"]
        chosen = draw(st.lists(st.sampled_from(names), max_size=4, unique=True))
        tree[section] = {name: draw(typed(section, name)) for name in chosen}
    for key in draw(st.lists(st.sampled_from(sorted(set(ROOT_KEYS) - set(SECTIONS))), max_size=2)):
        tree[key] = draw(values)
    return tree


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    """`--set` texts: a real or mangled dotted key, then any text."""
    texts = []
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from(sorted(SECTIONS)))
        key = f"{section}.{draw(st.sampled_from(field_names(SECTIONS[section])))}"
        key = draw(st.sampled_from([key, key.upper(), key + ".x", key.replace(".", ".."), ""]))
        sep = draw(st.sampled_from(["=", "=", ":", ""]))
        texts.append(
            key
            + sep
            + draw(
                st.one_of(
                    st.text(max_size=16),
                    st.sampled_from(
                        [
                            "1e20",
                            "-1",
                            "[1,",
                            "{a: 1}",
                            "@x",
                            "'  '",
                            '"\\0"',
                            "null",
                            "1e-8",
                            "../../x",
                        ]
                    ),
                )
            )
        )
    return texts


def nonsense(config: SpeedtronicConfig) -> list[str]:
    """Return what an accepted config holds that no run can mean."""
    found = []
    for section in SECTIONS:
        for name, value in vars(getattr(config, section)).items():
            where = f"{section}.{name}"
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > HUGE:
                found.append(f"{where}={value}")
            if isinstance(value, str) and "\x00" in value:
                found.append(f"{where} holds NUL")
            if (section, name) in NAMES_AND_PATHS and isinstance(value, str) and not value.strip():
                found.append(f"{where} is blank")
    return found


class Tally:
    """What the examples came to."""

    def __init__(self) -> None:
        self.examples = self.valid = self.rejected = 0
        self.failures: list[str] = []

    def check(self, build: Any) -> None:
        """Build a config; count it; record anything but a ConfigError or a sound config."""
        from speedtronic_systems.memory import check_training_memory

        self.examples += 1
        try:
            config = build()
        except ConfigError as error:
            self.rejected += 1
            if "\n" in str(error):
                self.failures.append(f"multi-line ConfigError: {str(error)[:200]!r}")
            return
        except Exception as error:  # anything else is a bug the fuzzer found
            self.failures.append(f"{type(error).__name__}: {str(error)[:200]}")
            return
        self.valid += 1
        again = SpeedtronicConfig.load(config.to_yaml())
        if again.to_dict() != config.to_dict():
            self.failures.append(f"round trip changed {config.to_dict()}")
        self.failures += [f"accepted nonsense: {n}" for n in nonsense(config)]
        try:
            check_training_memory(config, "cpu")
        except ConfigError:
            pass
        except Exception as error:
            self.failures.append(f"memory check: {type(error).__name__}: {str(error)[:200]}")


def fuzz(examples: int, seed_value: int) -> Tally:
    """Run `examples` config trees and `examples` override lists; return the tally."""
    tally = Tally()
    options = settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )

    @seed(seed_value)
    @options
    @given(configs())
    def trees(tree: dict[str, Any]) -> None:
        tally.check(lambda: SpeedtronicConfig.from_dict(tree))

    @seed(seed_value)
    @options
    @given(overrides())
    def sets(texts: list[str]) -> None:
        tally.check(lambda: SpeedtronicConfig.from_dict(apply_overrides({}, texts)))

    trees()
    sets()
    return tally


def run(work: Path, quick: bool, rng: random.Random) -> Result:
    """Fuzz 100 (quick) or 1,000 (full) configs and as many override lists."""
    result = Result("config fuzzing", "only ConfigError or a sound config that round-trips")
    timer = Timer()
    examples = 100 if quick else 1000
    tally = fuzz(examples, rng.randrange(2**32))
    for failure in tally.failures[:50]:
        result.case(False, failure=failure)
    result.passed = not tally.failures
    result.figures = {
        "examples": tally.examples,
        "valid": tally.valid,
        "config_errors": tally.rejected,
        "failures": len(tally.failures),
    }
    result.seconds = timer.seconds
    return result
