from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest

from speedtronic_config import ConfigError, SpeedtronicConfig, loading
from speedtronic_config.loading import parse_text, read_source

REPO = Path(__file__).resolve().parents[2]


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: demo\nmax_steps: 10\noptimizer:\n  eps: 1e-6\n")
    config = SpeedtronicConfig.from_yaml(path)
    assert (config.run.name, config.run.max_steps, config.optimizer.eps) == ("demo", 10, 1e-6)
    assert SpeedtronicConfig.from_yaml(str(path)) == config == SpeedtronicConfig.load(path)


def test_json_file_and_inline_forms(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"max_steps": 3}))
    assert SpeedtronicConfig.load(path).run.max_steps == 3
    assert SpeedtronicConfig.load(str(path)).run.max_steps == 3
    assert SpeedtronicConfig.load("name: demo\nmax_steps: 10").run.max_steps == 10
    assert SpeedtronicConfig.load('{"max_steps": 4}').run.max_steps == 4
    assert SpeedtronicConfig.load("max_steps: 5").run.max_steps == 5
    assert SpeedtronicConfig.load({"max_steps": 6}).run.max_steps == 6


@pytest.mark.parametrize(
    "name, text", [("run.json", '{"max_steps": 3}'), ("run.yaml", "max_steps: 3")]
)
def test_a_file_opened_by_a_byte_order_mark_loads(tmp_path, name, text):
    # The JSON one was "invalid JSON at line 1, column 1: Unexpected UTF-8 BOM".
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert SpeedtronicConfig.load(path).run.max_steps == 3


def test_single_line_that_names_an_existing_file_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("x: 1").write_text("max_steps: 9\n")  # a file whose name also parses as YAML
    assert SpeedtronicConfig.load("x: 1").run.max_steps == 9


def test_a_single_line_longer_than_a_file_name_is_inline_text(tmp_path):
    # Past the OS's name limit (255 bytes), asking whether such a file exists raised OSError
    # (File name too long): the CLI exited 1 instead of reading the inline config.
    name = "x" * 300
    line = f"run: {{name: {name}}}"
    assert SpeedtronicConfig.load(line).run.name == name
    with pytest.raises(ConfigError, match=f"^{name}.yaml: config file not found"):
        SpeedtronicConfig.load(f"{name}.yaml")
    with pytest.raises(ConfigError, match="config file not found"):
        SpeedtronicConfig.from_yaml(tmp_path / f"{name}.yaml")


def test_a_config_the_os_refuses_to_look_up_is_unreadable_not_missing(tmp_path, monkeypatch):
    # In a folder this user may not search (mode 700, another owner), the look-up fails with
    # EACCES: taken for a name too long, it said "config file not found; check the path".
    path = tmp_path / "locked" / "run.yaml"
    stat, open_ = Path.stat, Path.open

    def refused(real):
        def call(self, *args, **kwargs):
            if self == path:  # as the OS answers this user, who cannot be root here
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        return call

    monkeypatch.setattr(Path, "stat", refused(stat))
    monkeypatch.setattr(Path, "open", refused(open_))
    for source in (path, str(path)):
        with pytest.raises(ConfigError, match="run.yaml: cannot be read: Permission denied$"):
            SpeedtronicConfig.load(source)


def test_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert SpeedtronicConfig.load(path) == SpeedtronicConfig()


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: config file not found"):
        SpeedtronicConfig.load(missing)
    with pytest.raises(ConfigError, match="^runs/none.yaml: config file not found"):
        SpeedtronicConfig.load("runs/none.yaml")
    # An unset shell variable (`train "$CONFIG"`): not the current folder, "is a directory"
    with pytest.raises(ConfigError, match="^CONFIG: empty path; name a config file"):
        SpeedtronicConfig.from_yaml("")


def test_directory_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match="is a directory, not a config file; pass a YAML or"):
        SpeedtronicConfig.from_yaml(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        SpeedtronicConfig.from_yaml(binary)


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("run:\n  name: demo\n  seed: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}: invalid YAML at line \d+, column \d+"):
        SpeedtronicConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="^<inline config>: invalid YAML at line 1, column"):
        SpeedtronicConfig.load("max_steps: [")
    path.write_text("run:\n  seed: 1\n---\nmodel:\n  n_layer: 2\n")
    with pytest.raises(ConfigError, match="another document; a config is one YAML document"):
        SpeedtronicConfig.from_yaml(path)


@pytest.mark.parametrize(
    "text, where", [("model:\n\tn_layer: 2\n", "line 2, column 1"), ("a:\t1\n", "line 1, column 3")]
)
def test_a_tab_in_yaml_names_the_fix(text, where):
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == (
        f"run.yaml: invalid YAML at {where}: found character '\\t' that cannot start any token; "
        "use spaces: YAML does not allow a tab there"
    )


@pytest.mark.parametrize(
    "text, tag",
    [("a: !ENV ${TOKEN}\n", "'!ENV'"), ("a: =\n", "'tag:yaml.org,2002:value'")],
)
def test_a_yaml_tag_names_the_fix(text, tag):
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == (
        f"run.yaml: invalid YAML at line 1, column 4: could not determine a constructor for the "
        f"tag {tag}; quote the value if it is text; a config takes no custom tags"
    )


def test_a_utf16_file_names_the_fix(tmp_path):
    # What Windows PowerShell 5 writes for `speedtronic validate run.yaml > out.yaml`.
    path = tmp_path / "out.yaml"
    path.write_text("max_steps: 3\n", encoding="utf-16")
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.load(path)
    assert str(caught.value) == (
        f"{path}: is not UTF-8 text (invalid start byte at byte 0); a config is YAML or JSON text "
        "saved as UTF-8"
    )


def test_malformed_json_gives_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "max_steps": ,\n}')
    with pytest.raises(ConfigError, match=r"invalid JSON at line 2, column 16"):
        SpeedtronicConfig.load(path)


@pytest.mark.parametrize(
    "text, kind", [("- 1\n- 2\n", "a list"), ("just text\nmore\n", "a single value")]
)
def test_non_mapping_root_says_so(tmp_path, text, kind):
    # The error named neither the file nor the fix: "the configuration root must be a mapping
    # (got 'just text more')".
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.load(path)
    assert str(caught.value) == (
        f"{path}: must be a mapping, not {kind}; write `key: value` lines at the "
        "top level, e.g. 'model: {n_layer: 6}'"
    )
    with pytest.raises(ConfigError, match=f"^<inline config>: must be a mapping, not {kind}"):
        SpeedtronicConfig.load(text)


def test_a_file_too_large_for_a_config_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    # A text corpus named as the config (train corpus.txt) was parsed whole: minutes for a large
    # one (6 MB took 4 s), to end in "root must be a mapping".
    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 100)  # the real limit is 1 MiB; same code
    path = tmp_path / "corpus.txt"
    path.write_text("max_steps: 3\n" + "#" * 87 + "\n")  # 101 bytes
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.load(path)
    assert str(caught.value) == (
        f"{path}: is larger than a config file (over 100 bytes); a data file is named in the "
        "config, e.g. data.text_path or data.shard_path"
    )
    path.write_text("max_steps: 3\n" + "#" * 86 + "\n")  # 100 bytes
    assert SpeedtronicConfig.load(path).run.max_steps == 3
    # UTF-8 text (or any bytes) past the limit is too large, whatever the byte the read cuts:
    # here it cuts an "é" in two, once read as "is not UTF-8 text (unexpected end of data)".
    path.write_bytes(b"a" * 100 + "é".encode() * 10)
    with pytest.raises(ConfigError, match="is larger than a config file"):
        SpeedtronicConfig.load(path)
    path.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="is larger than a config file"):
        SpeedtronicConfig.load(path)


@pytest.mark.parametrize(
    "text, where",
    [
        ("max_steps: 0500\n", "line 1, column 12"),  # 320 in YAML 1.1, 500 in YAML 1.2
        ("run: {seed: -017}\n", "line 1, column 13"),
        ("checkpoint:\n  every_steps: 0_100\n", "line 2, column 16"),
    ],
)
def test_an_integer_with_a_leading_zero_is_refused_not_read_as_octal(text, where):
    # 0500 became 320 while 0900 (not octal, so text) became 900 in an integer field.
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == (
        f"run.yaml: invalid YAML at {where}: an integer with a leading 0 is octal in YAML 1.1 "
        "(010 is 8); write it without the leading zeros, or quote it if it is text"
    )


@pytest.mark.parametrize(
    "text, where",
    [
        ("max_steps: 1:30\n", "line 1, column 12"),  # 90 in YAML 1.1, text in YAML 1.2
        ("run: {name: 12:30}\n", "line 1, column 13"),  # refused as 750, "expected a string"
        ("optimizer:\n  lr: -1:30.5\n", "line 2, column 7"),  # -90.5
    ],
)
def test_a_base_60_number_is_refused_not_read_silently(text, where):
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == (
        f"run.yaml: invalid YAML at {where}: a number with a colon is base 60 in YAML 1.1 "
        "(1:30 is 90); write it in base 10, or quote it if it is text"
    )
    # Text with a colon that is no base-60 number, or quoted, reads as it did.
    assert parse_text("a: '1:30'\nb: cuda:0\nc: 1:70\n", "run.yaml") == {
        "a": "1:30",
        "b": "cuda:0",
        "c": "1:70",
    }


def test_integers_without_a_leading_zero_still_load():
    text = "a: 0\nb: -0\nc: 00\nd: 0x1F\ne: 0b101\nf: 1_000\ng: '0500'\nh: 0.5\n"
    assert parse_text(text, "run.yaml") == {
        "a": 0,
        "b": 0,
        "c": 0,
        "d": 31,
        "e": 5,
        "f": 1000,
        "g": "0500",
        "h": 0.5,
    }


def test_unsupported_source_type():
    with pytest.raises(ConfigError, match="cannot load a config from int"):
        read_source(3)  # type: ignore[arg-type]


def test_parse_text_yaml_and_json():
    assert parse_text("a: 1", "s") == {"a": 1}
    assert parse_text('{"a": 1}', "s", as_json=True) == {"a": 1}


@pytest.mark.parametrize("name", ["quickstart.yaml", "smoke.yaml", "v2_smoke.yaml"])
def test_shipped_configs_load(name):
    path = REPO / "configs" / name
    if not path.exists():
        pytest.skip("shipped configs live in the monorepo, not in the wheel")
    config = SpeedtronicConfig.from_yaml(path)
    assert SpeedtronicConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "text, where",
    [
        ("model:\n  n_layer: 2\nmodel:\n  n_layer: 3\n", "line 3, column 1: duplicate key 'model'"),
        ("run:\n  max_steps: 5\n  max_steps: 50\n", "line 3, column 3: duplicate key 'max_steps'"),
    ],
)
def test_a_key_given_twice_is_refused_not_overwritten(text, where):
    # PyYAML keeps the last one: an edit further down silently replaced the setting above it.
    with pytest.raises(ConfigError, match=f"^run.yaml: invalid YAML at {where}"):
        parse_text(text, "run.yaml")


def test_merge_keys_may_still_repeat_a_merged_key():
    text = "base: &base {lr: 0.1, name: muon}\noptimizer: {<<: *base, lr: 0.2}\n"
    assert parse_text(text, "run.yaml")["optimizer"] == {"lr": 0.2, "name": "muon"}


def test_inline_yaml_that_is_a_list_is_named_as_such_not_as_a_missing_file():
    with pytest.raises(ConfigError, match=r"^<inline config>: must be a mapping, not a list"):
        read_source("[1, 2]")


@pytest.mark.parametrize("depth", [33, 900, 5000])
@pytest.mark.parametrize("as_json", [False, True])
def test_data_nested_too_deeply_is_one_config_error(depth, as_json):
    # 5000 levels exhaust the parsers' recursion; 900 parse, but deepcopy could not copy them.
    text = '{"a": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(ConfigError, match=r"^deep: is nested more than 32 levels deep"):
        parse_text(text, "deep", as_json=as_json)
    ok = '{"a": ' + "[" * 31 + "]" * 31 + "}"
    assert parse_text(ok, "ok", as_json=as_json)["a"]


def test_yaml_aliases_are_walked_once_per_depth():
    laughs = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for name, below in zip("bcdefghi", "abcdefgh", strict=True):
        laughs += f"{name}: &{name} [{', '.join(['*' + below] * 9)}]\n"
    assert len(parse_text(laughs, "laughs")["i"]) == 9  # 9**9 leaves, walked in no time
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        parse_text("a: &a [*a]\n", "itself")


@pytest.mark.parametrize(
    "text, where",
    [
        # A value YAML's resolver types but Python's constructor refuses was a bare ValueError
        # (exit 1 in the CLI, no line, no key): a date-like name, an explicit tag, a long integer.
        ("run:\n  name: 2024-06-31\n", "line 2, column 9: not a valid timestamp; quote it"),
        ("run: {max_steps: !!int abc}\n", "line 1, column 18: not a valid int"),
        ("model: {n_layer: " + "9" * 5000 + "}\n", "line 1, column 18: an integer longer than"),
    ],
)
def test_a_value_its_yaml_type_refuses_is_a_located_config_error(text, where):
    with pytest.raises(ConfigError, match=f"^run.yaml: invalid YAML at {where}"):
        parse_text(text, "run.yaml")


@pytest.mark.parametrize(
    "text, where, code",
    [
        ("run:\n  name: a\x1b[0mb\n", "line 2, column 10", "#x001b"),
        ("\x0c\n", "line 1, column 1", "#x000c"),
    ],
)
def test_a_control_character_is_located(text, where, code):
    # Pasted terminal colours or a form feed: PyYAML named no line, so the invisible character
    # had to be hunted for.
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == (
        f"run.yaml: invalid YAML at {where}: unacceptable character {code}: special characters "
        "are not allowed"
    )


def test_a_json_integer_past_the_digit_limit_is_a_config_error():
    with pytest.raises(ConfigError, match="^run.json: invalid JSON: an integer longer than"):
        parse_text('{"max_steps": ' + "9" * 5000 + "}", "run.json", as_json=True)


def test_a_json_key_given_twice_is_refused_as_a_yaml_one_is(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"run": {"max_steps": 3}, "run": {"max_steps": 4}}')
    with pytest.raises(ConfigError, match=r"dup.json: invalid JSON: duplicate key 'run': keep one"):
        read_source(path)
    with pytest.raises(ConfigError, match="duplicate key 'max_steps'"):
        parse_text('{"run": {"max_steps": 3, "max_steps": 4}}', "inline", as_json=True)


@pytest.mark.parametrize(
    "text, field, value",
    [
        # PyYAML reads 1e1 and 1.0e1 (no sign) as text, which the field took for "auto" or not.
        ("shape_validation:\n  alignment: 1e1\n", "alignment", 10),
        ("shape_validation:\n  alignment: 1.0e1\n", "alignment", 10),
        ("shape_validation:\n  alignment: '32.0'\n", "alignment", 32),
        ("shape_validation:\n  alignment: 32.0\n", "alignment", 32),
    ],
)
def test_alignment_takes_an_integral_number_as_other_integer_fields_do(text, field, value):
    # model.n_layer: 1e1 loaded as 10; alignment refused it ("unsupported value (got '1e1')").
    config = SpeedtronicConfig.from_dict(parse_text(text, "run.yaml"))
    assert getattr(config.shape_validation, field) == value


@pytest.mark.parametrize(
    "text, message",
    [
        # Was "optimizer.lr: must be positive (got 0.0)".
        (
            "optimizer:\n  lr: 1.0e-400\n",
            "run.yaml: invalid YAML at line 2, column 7: a number below the smallest float (about "
            "5e-324), reads as 0; write 0 or a larger number, or quote it if it is text",
        ),
        # Was "optimizer.lr: expected a finite number (got inf)".
        (
            "optimizer:\n  lr: -1.0e+400\n",
            "run.yaml: invalid YAML at line 2, column 7: a number past the float range (about "
            "1.8e308), reads as infinity; write a smaller number, or quote it if it is text",
        ),
    ],
)
def test_a_float_past_the_float_range_is_refused_where_written(text, message):
    with pytest.raises(ConfigError) as caught:
        parse_text(text, "run.yaml")
    assert str(caught.value) == message
    # A written infinity, a zero and the smallest subnormal read as they did.
    assert parse_text("a: .inf\nb: 0.0e-400\nc: 5.0e-324\n", "run.yaml") == {
        "a": float("inf"),
        "b": 0.0,
        "c": 5e-324,
    }


def test_an_underflowing_weight_decay_is_no_longer_read_as_0(tmp_path):
    # `weight_decay: 1.0e-400` loaded as 0.0, silently.
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  weight_decay: 1.0e-400\n")
    with pytest.raises(ConfigError, match="at line 2, column 17: a number below the smallest"):
        SpeedtronicConfig.load(path)


@pytest.mark.parametrize(
    "number, problem",
    [
        ("1e-400", "a number below the smallest float (about 5e-324), reads as 0; write 0 or"),
        ("-1.5E+400", "a number past the float range (about 1.8e308), reads as infinity; write"),
    ],
)
def test_a_json_float_past_the_float_range_is_refused_as_a_yaml_one_is(number, problem):
    # json.loads read them as 0.0 and -inf: weight_decay took 0, and lr said "(got -inf)".
    text = '{"optimizer": {"weight_decay": ' + number + "}}"
    with pytest.raises(ConfigError, match=f"^run.json: invalid JSON: {re.escape(problem)}"):
        parse_text(text, "run.json", as_json=True)
    assert parse_text('{"a": 0.0, "b": 1e-300, "c": 0e5}', "ok", as_json=True) == {
        "a": 0.0,
        "b": 1e-300,
        "c": 0.0,
    }
