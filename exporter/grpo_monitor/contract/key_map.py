"""A user's key map: the names a run logs, mapped onto the signals they stand for.

One small TOML file, a line per name (``grpo-monitor check RUN_DIR`` prints the lines to paste):

    # <snapshot_dir>/<run>/.grpo-keys.toml, or the file of --snapshot.key-map
    "train/mean_completion_len" = "response/len_mean"
    "gen_len_chars" = { key = "response/len_mean", scale = 0.25 }   # characters -> ~tokens
    "debug/my_counter" = false                                        # not a signal: no warning

A mapped name is read as its key, multiplied by ``scale``; it wins over every other name of
that key in the same record (the user's word is the last one). ``false`` marks a name as no
signal: it is exported generically, never matched and never warned about. The exporter reads
the file of ``--snapshot.key-map`` for every run and a run folder's own ``.grpo-keys.toml`` on
top of it (the run's line wins); ``SnapshotWriter(key_map=...)`` takes the same file or mapping.

Standard library only (tomllib, or tomli before Python 3.11): the trainer side imports it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from grpo_monitor.contract.keys import SIGNALS_BY_KEY, closest_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the package depends on tomli there
    import tomli as tomllib

KEY_MAP_FILE = ".grpo-keys.toml"
MAX_KEY_MAP_BYTES = 1 << 16


class KeyMapError(ValueError):
    """A key map that cannot be used: the message names the line's name and what is wrong."""


@dataclass(frozen=True)
class Target:
    key: str | None  # None: the name is no signal
    scale: float = 1.0


@dataclass(frozen=True)
class KeyMap:
    """name as logged -> what it is."""

    names: Mapping[str, Target] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.names)

    def get(self, name: str) -> Target | None:
        return self.names.get(name)

    def over(self, base: KeyMap | None) -> KeyMap:
        """This map's lines on top of ``base``'s."""
        if not base:
            return self
        return KeyMap({**base.names, **self.names})

    @classmethod
    def parse(cls, text: str | bytes, where: str = "key map") -> KeyMap:
        """A key map from its TOML text; KeyMapError for anything that is not one."""
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise KeyMapError(f"{where}: not UTF-8 ({exc.reason})") from None
        try:
            raw = tomllib.loads(text)
        except ValueError as exc:  # TOMLDecodeError, or int()'s for an integer of 4300+ digits
            raise KeyMapError(f"{where}: {exc}") from None
        except RecursionError:
            # Inline tables nested thousands deep: a few KB that would exhaust the parser's stack.
            raise KeyMapError(f"{where}: nested deeper than a key map can be") from None
        return cls.from_mapping(raw, where)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = "key map") -> KeyMap:
        names: dict[str, Target] = {}
        for name, value in raw.items():
            if not isinstance(name, str):  # a mapping the SDK is given: no name logged matches it
                raise KeyMapError(f"{where}: {name!r} is no name (a name is text)")
            names[name] = _entry(name, value, where)
        return cls(names)

    @classmethod
    def load(cls, path: str | Path) -> KeyMap:
        """A key map file (for the trainer side and the exporter's flag; a run folder's file is
        read by the exporter through safe_io)."""
        data = Path(path).read_bytes()
        if len(data) > MAX_KEY_MAP_BYTES:
            raise KeyMapError(f"{path}: over {MAX_KEY_MAP_BYTES} bytes")
        return cls.parse(data, str(path))


KeyMapLike = Union[KeyMap, Mapping[str, Any], str, Path, None]


def as_key_map(value: KeyMapLike) -> KeyMap | None:
    """A KeyMap from what a caller passes: a KeyMap, a mapping of the file's lines, or a path."""
    if value is None or isinstance(value, KeyMap):
        return value
    if isinstance(value, (str, Path)):
        return KeyMap.load(value)
    return KeyMap.from_mapping(value)


def _entry(name: str, value: Any, where: str) -> Target:
    if value is False:
        return Target(None)
    scale: Any = 1.0
    if isinstance(value, Mapping):
        unknown = set(value) - {"key", "scale"}
        if unknown:
            fields = ", ".join(sorted(map(str, unknown)))  # a mapping's keys: of any type
            raise KeyMapError(f"{where}: {name!r}: unknown field(s) {fields} "
                              f"(a line is \"name\" = \"key\" or {{ key = \"...\", scale = ... }})")
        key, scale = value.get("key"), value.get("scale", 1.0)
    else:
        key = value
    if not isinstance(key, str) or key not in SIGNALS_BY_KEY:
        close = closest_names(key) if isinstance(key, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else " (docs/metrics.md lists the keys)"
        raise KeyMapError(f"{where}: {name!r} maps to {key!r}, which is no canonical key{hint}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not _finite(scale) \
            or scale == 0:
        raise KeyMapError(f"{where}: {name!r}: scale must be a finite number other than 0")
    return Target(key, float(scale))


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer beyond float's range (TOML's integers have no bound here)
        return False


def render_line(name: str, key: str) -> str:
    """One line of a key map, for a person to paste (TOML's basic string escapes)."""
    return f"{_quote(name)} = {_quote(key)}"


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'
