"""Read a configuration mapping from a YAML/JSON file or inline text, with located parse errors."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from speedtronic_config.coerce import past_float_range
from speedtronic_config.errors import ConfigError


def _too_long_int() -> str:
    """Name what both parsers refuse past Python's digit limit (settable: read when it happens)."""
    return f"an integer longer than {sys.get_int_max_str_digits()} digits"


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last one,
    so an edit further down a long config silently replaced the setting above it.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Construct one node; a value its type refuses (a date-like `2024-06-31`, `!!int abc`,
        an integer past Python's digit limit) is a located YAML error, not a bare ValueError.
        """
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as error:
            # The value itself is never quoted: it may be a secret.
            kind = node.tag.rsplit(":", 1)[-1]
            problem = (
                _too_long_int()
                if "digits" in str(error)
                else f"not a valid {kind}; quote it if it is meant as text"
            )
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[str] = set()
    for key_node, _ in node.value:
        # Scalar keys only: `<<` merges a mapping in, where keys may repeat by design.
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}: keep one", key_node.start_mark
                )
            seen.add(key_node.value)
    return loader.construct_mapping(node, deep=deep)


# YAML 1.1's octal: 0500 is 320, while 0900 (not octal) stays text that an integer field reads as
# 900, and YAML 1.2 reads both as decimals.
_OCTAL = re.compile(r"[-+]?0[0-7_]*[1-7][0-7_]*")


def _int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    """Construct an integer; one written with a leading 0 is refused: its reading is ambiguous."""
    if _OCTAL.fullmatch(node.value):
        raise yaml.constructor.ConstructorError(
            None,
            None,
            "an integer with a leading 0 is octal in YAML 1.1 (010 is 8); write it without the "
            "leading zeros, or quote it if it is text",
            node.start_mark,
        )
    _refuse_base_60(node)
    return loader.construct_yaml_int(node)


def _float(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> float:
    """Construct a float; one written with a colon (base 60) is refused, as an integer is, and
    one past the float range: a field would show (or take) the 0.0 or inf it reads as.
    """
    _refuse_base_60(node)
    number = loader.construct_yaml_float(node)
    problem = past_float_range(node.value, number)
    if problem is None:
        return number
    # The value itself is never quoted (it may be a secret): the mark shows where it is.
    raise yaml.constructor.ConstructorError(
        None, None, f"{problem}, or quote it if it is text", node.start_mark
    )


def _refuse_base_60(node: yaml.ScalarNode) -> None:
    """Refuse YAML 1.1's base-60 number: `1:30` is 90 (and `12:30` 750), silently, where a reader
    of the file (and YAML 1.2) sees a time or text.
    """
    if ":" in node.value:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            "a number with a colon is base 60 in YAML 1.1 (1:30 is 90); write it in base 10, "
            "or quote it if it is text",
            node.start_mark,
        )


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _float)
# Far deeper than any config; below what the readers of the data (deepcopy) can recurse through.
MAX_DEPTH = 32
# Far larger than any config (the shipped ones are under 2 KB): a bigger file is data named by
# mistake, which the parser would read whole, for minutes, before refusing it.
MAX_FILE_BYTES = 2**20
_INLINE = "<inline config>"


# The fix for a YAML error whose problem holds these words.
_FIXES = {
    "another document": "a config is one YAML document: remove the --- line",
    "'\\t'": "use spaces: YAML does not allow a tab there",  # PyYAML's repr of a tab
    # A tag (`!ENV ${TOKEN}`, `!!python/name:x`), or a bare `=` (YAML 1.1's value key).
    "could not determine a constructor": (
        "quote the value if it is text; a config takes no custom tags"
    ),
}


def parse_text(text: str, source: str, *, as_json: bool = False) -> Any:
    """Return the data in YAML (or JSON) text; a syntax error names the source, line and column."""
    if as_json:
        return _within_depth(lambda: _parse_json(text, source), source)
    try:
        return parse_value(text, source)
    except yaml.YAMLError as error:
        problem = str(getattr(error, "problem", ""))
        fix = next((fix for words, fix in _FIXES.items() if words in problem), None)
        raise ConfigError(source, describe_yaml_error(error, text=text), allowed=fix) from None


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs, parse_float=_json_float)
    except _PastFloatRange as error:
        raise ConfigError(source, f"invalid JSON: {error.args[0]}") from None
    except json.JSONDecodeError as error:
        raise ConfigError(
            source, f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        ) from None
    except _DuplicateKey as error:
        raise ConfigError(
            source, f"invalid JSON: duplicate key {error.args[0]!r}: keep one"
        ) from None
    except ValueError:  # json.loads' only other refusal: an integer past the digit limit
        raise ConfigError(source, f"invalid JSON: {_too_long_int()}") from None


def parse_value(text: str, source: str) -> Any:
    """Return the data in YAML text, keys given twice refused (yaml.YAMLError when it is not
    valid, a ConfigError naming `source` when nested too deeply); a --set value is read with it,
    as a config file is.
    """
    return _within_depth(
        lambda: yaml.load(text, Loader=_UniqueKeyLoader),  # noqa: S506 - a SafeLoader subclass
        source,
    )


class _PastFloatRange(Exception):
    """A JSON number reads as infinity or, nonzero, as 0 (the reason is the exception's text)."""


def _json_float(text: str) -> float:
    """Return the float of a JSON number; _PastFloatRange where it is past the float range, as
    the YAML loader refuses one: a field would show (or take) the 0.0 or inf it reads as.
    """
    number = float(text)
    problem = past_float_range(text, number)
    if problem is not None:
        raise _PastFloatRange(problem)
    return number


class _DuplicateKey(Exception):
    """A JSON object repeats a key (json.loads keeps the last one)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Return a JSON object's pairs as a dict; _DuplicateKey when a key repeats (json.loads, like
    PyYAML, would keep the last one silently).
    """
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _within_depth(parse: Callable[[], Any], source: str) -> Any:
    """Return what parse() reads, or raise ConfigError when lists and mappings nest more than
    MAX_DEPTH levels in it: the parsers recurse per level (thousands of [ exhaust Python's
    stack), and so does what reads the data later (deepcopy).
    """
    too_deep = ConfigError(
        source, f"is nested more than {MAX_DEPTH} levels deep", allowed="a config a few levels deep"
    )
    try:
        data = parse()
    except RecursionError:
        raise too_deep from None
    if _depth(data) > MAX_DEPTH:
        raise too_deep
    return data


def _depth(data: Any) -> int:
    """Return how deeply lists and mappings nest in data, counted without recursion and no
    further than one level past MAX_DEPTH. YAML aliases share one object between places (a
    "billion laughs" shares it 10**9 times; `&a [*a]` holds itself): each object is walked again
    only from a deeper level than before, so the walk stays as small as the objects.
    """
    deepest, stack, walked = 0, [(data, 0)], {}
    while stack:
        value, level = stack.pop()
        if not isinstance(value, (Mapping, list)) or level > MAX_DEPTH:
            continue
        if walked.get(id(value), -1) >= level:
            continue
        walked[id(value)] = level
        deepest = max(deepest, level + 1)
        items = value.values() if isinstance(value, Mapping) else value
        stack.extend((item, level + 1) for item in items)
    return deepest


def describe_yaml_error(error: yaml.YAMLError, what: str = "invalid YAML", text: str = "") -> str:
    """Return a YAML error in `text` as one line, `<what> at line L, column C: problem`, without
    the quoted source text PyYAML adds (it spans several lines and may hold a secret).
    """
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{what}{where}: {error.problem or error.context}"
    if isinstance(error, yaml.reader.ReaderError) and text:
        # A control character (pasted terminal colours): PyYAML gives only its offset in text.
        line_start = text.rfind("\n", 0, error.position) + 1
        line = text.count("\n", 0, line_start) + 1
        column = error.position - line_start + 1
        return f"{what} at line {line}, column {column}: {str(error).splitlines()[0]}"
    first = str(error).strip().splitlines()
    return f"{what}: {first[0] if first else type(error).__name__}"


# What a look-up answers where no file is (Path.exists()'s own list, and a name too long).
_NO_SUCH_FILE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP, errno.ENAMETOOLONG)


def read_file(path: str | os.PathLike[str]) -> Any:
    """Return the data in a .yaml/.yml/.json file; a missing or unreadable file is a ConfigError."""
    if not str(path):  # Path("") is the current folder
        raise ConfigError(
            "CONFIG", "empty path", allowed="name a config file, e.g. configs/quickstart.yaml"
        )
    file = Path(path)
    if not _exists(file):
        raise ConfigError(str(file), "config file not found", allowed="check the path")
    try:
        if file.is_dir():
            raise ConfigError(
                str(file),
                "is a directory, not a config file",
                allowed="pass a YAML or JSON file, e.g. configs/quickstart.yaml",
            )
        with file.open("rb") as handle:  # at most one byte past the limit, from a pipe too
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(str(file), f"cannot be read: {error.strerror or error}") from None
    # Before decoding: the read's last byte can cut a character of a UTF-8 data file in two.
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            str(file),
            f"is larger than a config file (over {MAX_FILE_BYTES} bytes)",
            allowed="a data file is named in the config, e.g. data.text_path or data.shard_path",
        )
    try:
        # A byte-order mark (Notepad, PowerShell) opens the file, not its JSON text; removed after
        # decoding, so the byte an error names is the file's own.
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise ConfigError(
            str(file),
            f"is not UTF-8 text ({error.reason} at byte {error.start})",
            allowed="a config is YAML or JSON text saved as UTF-8",
        ) from None
    return parse_text(text, str(file), as_json=file.suffix.lower() == ".json")


def _exists(path: Path) -> bool:
    """Return whether a file may be at `path`: False where the look-up finds none, or refuses a
    name longer than the OS allows (a one-line inline config can be); True where it is refused
    otherwise (a folder on the way this user may not search), for the read to say why. Not
    Path.exists(): by Python version it raises or answers False there.
    """
    try:
        path.stat()
    except OSError as error:
        return error.errno not in _NO_SUCH_FILE
    except ValueError:  # a NUL in the name
        return False
    return True


def read_config(path: str | os.PathLike[str]) -> Mapping[str, Any] | None:
    """Return the settings in a config file (read_file's data), None when it is empty."""
    return _mapping(read_file(path), str(Path(path)))


def _mapping(data: Any, source: str) -> Any:
    """Return data read from `source` when it is a mapping of settings or empty (None)."""
    if data is None or isinstance(data, Mapping):
        return data
    raise ConfigError(
        source,
        f"must be a mapping, not {'a list' if isinstance(data, list) else 'a single value'}",
        allowed="write `key: value` lines at the top level, e.g. 'model: {n_layer: 6}'",
    )


def read_source(source: str | os.PathLike[str] | Mapping[str, Any]) -> Any:
    """Return the data of a mapping, a path, or inline YAML/JSON text (told apart heuristically)."""
    if isinstance(source, Mapping):
        return source
    if isinstance(source, os.PathLike):
        return read_config(source)
    if not isinstance(source, str):
        raise ConfigError(
            "",
            f"cannot load a config from {type(source).__name__}",
            allowed="pass a mapping, a file path or YAML/JSON text",
        )
    # Multi-line text or a JSON object is inline; a single line is a path if such a file exists,
    # else inline text when it parses to a mapping, else a path that is missing.
    if "\n" in source or source.lstrip().startswith("{"):
        return _mapping(parse_text(source, _INLINE), _INLINE)
    if _exists(Path(source)):
        return read_config(source)
    try:
        inline = parse_text(source, _INLINE)
    except ConfigError:
        if ": " in source:  # meant as inline YAML: report the syntax error, not a missing file
            raise
        inline = None
    if isinstance(inline, (Mapping, list)):  # a list: no file of that name, YAML not a config
        return _mapping(inline, _INLINE)
    return read_config(source)
