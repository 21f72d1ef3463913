from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from speedtronic_config.coerce import coerce, coerce_fields
from speedtronic_config.errors import ConfigError


@pytest.mark.parametrize(
    "raw, expected",
    [
        (True, True),
        (False, False),
        ("true", True),
        ("false", False),
        ("FALSE", False),
        (" True ", True),
    ],
)
def test_bool_accepts_booleans_and_quoted_booleans(raw, expected):
    assert coerce(raw, "bool", "x") is expected


@pytest.mark.parametrize("raw", ["yes", "no", "0", "", 1, 0, 1.0, [], None])
def test_bool_rejects_everything_else(raw):
    with pytest.raises(ConfigError, match="^flag: "):
        coerce(raw, "bool", "flag")


@pytest.mark.parametrize(
    "raw, expected", [(3, 3), (4.0, 4), ("12", 12), (-1, -1), ("1e5", 100000), (" 2E3 ", 2000)]
)
def test_int_accepts_integers_and_integral_text(raw, expected):
    # PyYAML reads `max_steps: 1e5` as the string "1e5" (but `1.0e5` as a float): both load.
    assert coerce(raw, "int", "n") == expected


@pytest.mark.parametrize("raw", [True, 2.5, "two", "1.5", "1e-3", "1e400", "nan", [1], {}])
def test_int_rejects_non_integers(raw):
    with pytest.raises(ConfigError, match="^n: expected an integer"):
        coerce(raw, "int", "n")


@pytest.mark.parametrize("raw, expected", [(1, 1.0), (0.5, 0.5), ("1e-8", 1e-8), (" 3 ", 3.0)])
def test_float_accepts_numbers_and_numeric_text(raw, expected):
    # PyYAML reads `1e-8` as a string: it must still load as a number.
    assert coerce(raw, "float", "lr") == expected


@pytest.mark.parametrize(
    "raw",
    [False, "fast", float("nan"), float("inf"), "inf", [0.1], 10**400],  # 10**400: Overflow
)
def test_float_rejects_non_finite_and_non_numbers(raw):
    with pytest.raises(ConfigError, match="^lr: "):
        coerce(raw, "float", "lr")


def test_optional_allows_null_and_required_does_not():
    assert coerce(None, "int | None", "x") is None
    with pytest.raises(ConfigError) as caught:
        coerce(None, "int", "x")  # `x:` left without a value
    assert str(caught.value) == "x: must not be null (got None); give it a value, or remove the key"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # `name: no` showed "(got False)", a value the user never wrote, and no reason why.
        (
            "no",
            "run.name: expected a string, not a boolean (got False); quote it: YAML 1.1 reads a "
            "bare yes, no, on, off, true or false as a boolean",
        ),
        (
            "2024-01-01",
            "run.name: expected a string, not a date (got datetime.date(2024, 1, 1)); quote it: "
            "YAML reads a bare 2024-01-01 as a date",
        ),
    ],
)
def test_a_string_field_names_what_yaml_read_instead(text, message):
    with pytest.raises(ConfigError) as caught:
        coerce(yaml.safe_load(text), "str", "run.name")
    assert str(caught.value) == message


def test_strings_lists_and_pairs():
    assert coerce("a", "str", "s") == "a"
    with pytest.raises(ConfigError, match="s: expected a string, not a number.*quote the value"):
        coerce(12, "str", "s")
    with pytest.raises(
        ConfigError, match=r"s: expected one string, not a list \(got \['a/\*'"
    ) as caught:
        coerce(["a/*", "b/*"], "str", "s")  # quoting would not help: no advice to quote
    assert "quote" not in str(caught.value)
    assert coerce(("a", "b"), "list[str]", "l") == ["a", "b"]
    with pytest.raises(ConfigError, match=r"l\[1\]: expected a string"):
        coerce(["a", 2], "list[str]", "l")
    with pytest.raises(ConfigError, match="expected a list"):
        coerce("a", "list[str]", "l")
    assert coerce([0.9, "0.99"], "tuple[float, float]", "b") == (0.9, 0.99)
    for bad in ([0.9], [0.9, 0.9, 0.9], 0.9):
        with pytest.raises(ConfigError, match="exactly two numbers"):
            coerce(bad, "tuple[float, float]", "b")


def test_int_or_str_and_any():
    assert coerce("auto", "int | str", "a") == "auto"
    assert coerce(8, "int | str", "a") == 8
    marker = object()
    assert coerce(marker, "Any", "d") is marker


def test_coerce_fields_converts_in_place_with_dotted_paths():
    @dataclass
    class Section:
        flag: bool = False
        count: int = 1

    section = Section(flag="TRUE", count="3")  # type: ignore[arg-type]
    coerce_fields(section, "sec")
    assert (section.flag, section.count) == (True, 3)
    with pytest.raises(ConfigError, match="^sec.count: "):
        coerce_fields(Section(count="x"), "sec")  # type: ignore[arg-type]


def test_strings_refuse_a_nul_character():
    # The OS refuses NUL in paths; found at the first checkpoint it cost a whole interval (#19).
    with pytest.raises(ConfigError, match="run.output_dir: must not contain a NUL"):
        coerce("runs/\x00x", "str", "run.output_dir")
    assert coerce("runs/x", "str | None", "run.output_dir") == "runs/x"


def test_a_string_for_a_list_names_the_list_form():
    with pytest.raises(ConfigError) as caught:
        coerce("tensorboard", "list[str]", "logging.hooks")
    assert str(caught.value) == (
        "logging.hooks: expected a list of strings (got 'tensorboard'); e.g. [a, b], or [] for none"
    )


@pytest.mark.parametrize(
    "raw, annotation, message",
    [
        # PyYAML reads these (no dot) as text: 1e-400 was "must be positive (got 0.0)" and 1e30
        # "must be at most 65,536 (got 1000000000000000019884624838656)" in the section.
        (
            "1e-400",
            "float",
            "x: below the smallest float (about 5e-324), reads as 0 (got '1e-400'); write 0 or a "
            "larger number",
        ),
        (
            "1e30",
            "int",
            "x: is past the range of an integer setting (got '1e30'); every integer setting is "
            "below 2**53",
        ),
        (
            -1e30,
            "int",
            "x: is past the range of an integer setting (got -1e+30); every integer setting is "
            "below 2**53",
        ),
    ],
)
def test_a_number_past_its_range_is_shown_as_written(raw, annotation, message):
    with pytest.raises(ConfigError) as caught:
        coerce(raw, annotation, "x")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "raw, expected", [("32", 32), (" 32 ", 32), ("1e1", 10), ("32.0", 32), ("auto", "auto")]
)
def test_int_or_str_reads_integral_text_as_the_integer(raw, expected):
    assert coerce(raw, "int | str", "a") == expected
