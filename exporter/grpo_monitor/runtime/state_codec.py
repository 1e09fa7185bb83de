"""The saved state's encoding: the store's and the ingest's objects as MessagePack, by class name
and field name, under a schema number with a migration from each schema to the next.

What makes it outlive the code (docs/state-format.md):
- an object is its class's *stable name* (``CLASSES``, not a module path) and a map of its
  fields by name; a field the code no longer has is ignored, a field the state lacks takes the
  class's default (a blank object's value), so adding or dropping a field needs nothing;
- a change that gives a saved field another meaning or shape bumps ``SCHEMA`` and adds, in
  ``MIGRATIONS[old]``, a function per class from the fields of ``old`` to those of ``old + 1``;
  a state of an older schema is migrated step by step as it is decoded, one of a newer schema
  (a downgrade) is not used;
- what a render derives (the pre-rendered series, the armed table, the pace as rendered) is not
  saved: the code that loads the state renders it again, so a new release serves its own series.

Values are MessagePack's own types (nil, bool, int, float, str, bin, array, map) and three
extension types: ``EXT_OBJECT`` (a MessagePack document inside: [class name, {field: value}]),
``EXT_PATH`` (the path's bytes) and ``EXT_ARRAY`` (a typecode byte, ``q`` or ``d``, then the values
as little-endian 8-byte integers or floats). Tuples, lists, sets and deques are arrays; each
field's declared type (its annotation) says which to make of one when it is decoded, so that
the encoding stays in MessagePack's C code for all but objects, arrays and paths. Strings that
hold bytes of no UTF-8 (a run folder's name can) are written with their surrogates kept.
"""

from __future__ import annotations

import sys
import types
import typing
from array import array
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

import msgpack

from grpo_monitor.runtime.forecast import LawSums
from grpo_monitor.runtime.ingest import FileState
from grpo_monitor.runtime.loggers.sources import LoggedFile
from grpo_monitor.runtime.signals import (
    HeldOutTracker,
    KeyHistory,
    LawTracker,
    PromptTypeSignals,
    RankSignals,
    StepLog,
    Welford,
)
from grpo_monitor.runtime.store import RankState, RunState

# The schema of the objects' fields. Bump it, with a migration, when a saved field changes its
# meaning or shape (not for a field added or dropped: see the module's docstring).
SCHEMA = 1
# MIGRATIONS[n][class name]: the fields of schema n -> those of schema n + 1, for the classes
# that changed between the two (the others' fields pass unchanged).
MIGRATIONS: dict[int, dict[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {}

EXT_OBJECT, EXT_PATH, EXT_ARRAY = 1, 6, 7  # codes 2 to 5 are not assigned
ARRAY_TYPES = ("q", "d")  # 8-byte signed integers, 8-byte floats
UNICODE_ERRORS = "surrogatepass"

Convert = Callable[[Any], Any]


class _ArrayHint:
    """``array[int]`` in an annotation (array.array takes no subscript before Python 3.12)."""

    def __class_getitem__(cls, item: Any) -> type:
        return array


def _converter(hint: Any, default: Any) -> Convert | None:
    """What makes a decoded value (arrays decode as tuples) the field's declared type; None when
    it already is. ``default``: the field's value in a blank object (a deque's maxlen, a
    defaultdict's factory)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        convert = _converter(inner[0], default) if len(inner) == 1 else None
        return None if convert is None else (lambda x: None if x is None else convert(x))
    if origin is tuple:
        parts = [_converter(a, None) for a in args if a is not Ellipsis]
        if not any(parts):
            return None
        if len(args) == 2 and args[1] is Ellipsis:
            one = parts[0]
            return lambda x: tuple(map(one, x))
        return lambda x: tuple(c(v) if c else v for c, v in zip(parts, x))
    if origin in (list, set, deque):
        item = _converter(args[0], None) if args else None
        if origin is deque:
            maxlen = default.maxlen if isinstance(default, deque) else None
            return lambda x: deque(map(item, x) if item else x, maxlen=maxlen)
        return (lambda x: origin(map(item, x))) if item else origin
    if origin is dict:
        key, value = _converter(args[0], None), _converter(args[1], None)
        factory = default.default_factory if isinstance(default, defaultdict) else None
        if key is None and value is None and factory is None:
            return None
        key, value = key or (lambda k: k), value or (lambda v: v)
        if factory is not None:
            return lambda x: defaultdict(factory, {key(k): value(v) for k, v in x.items()})
        return lambda x: {key(k): value(v) for k, v in x.items()}
    return None  # a scalar, a class of the state, an array, a path: decoded as it is


class StateClass:
    """A class the state holds: its stable name, a blank object (whose fields are the defaults
    of fields a state lacks), and the fields not in its object: those a render derives, and a
    run's ranks, which follow the run as documents of their own (saved_state.py)."""

    def __init__(self, name: str, cls: type, blank: Callable[[], Any], omitted: tuple[str, ...] = ()):
        self.name, self.cls, self.blank, self.omitted = name, cls, blank, omitted
        hints = typing.get_type_hints(cls, localns={"array": _ArrayHint})
        example = blank()
        self.fields = tuple(f for f in field_names(example) if f not in omitted)
        missing = [f for f in self.fields if f not in hints]
        if missing:
            raise TypeError(f"{cls.__name__}: declare the type of {missing}: the state decodes by it")
        declared: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            declared.update(vars(klass).get("__annotations__", {}))
        self.declared = {f: str(declared[f]) for f in self.fields}  # as written: the docs' table
        self.convert = {f: c for f in self.fields
                        if (c := _converter(hints[f], getattr(example, f))) is not None}
        # A dataclass's field defaults, made without a blank object (a blank rank makes a dozen
        # objects of its own): for the omitted fields of every object, and a field a state lacks.
        self.defaults: dict[str, Callable[[], Any]] = {}
        if is_dataclass(cls):
            for f in fields(cls):
                if f.default_factory is not MISSING:
                    self.defaults[f.name] = f.default_factory
                elif f.default is not MISSING:
                    self.defaults[f.name] = lambda value=f.default: value
        self.omitted_fields = tuple(f for f in field_names(example) if f in omitted)
        self.field_set = frozenset(self.fields)
        self.all_defaults = all(f in self.defaults for f in (*self.fields, *self.omitted_fields))

    def build(self, saved: dict[str, Any]) -> Any:
        """An object of the class from its saved fields, each made its declared type."""
        defaults, convert = self.defaults, self.convert
        if not (self.all_defaults or (not self.omitted_fields and saved.keys() >= self.field_set)):
            obj = self.blank()  # a field without a default of its own: take the blank's
        else:
            obj = self.cls.__new__(self.cls)
            for f in self.omitted_fields:
                object.__setattr__(obj, f, defaults[f]())
        for f in self.fields:
            if f in saved:
                value = saved[f]
                object.__setattr__(obj, f, convert[f](value) if f in convert else value)
            elif f in defaults:
                object.__setattr__(obj, f, defaults[f]())
        return obj


def field_names(obj: Any) -> tuple[str, ...]:
    if is_dataclass(obj):
        return tuple(f.name for f in fields(obj))
    slots = getattr(type(obj), "__slots__", None)
    return tuple(slots) if slots is not None else tuple(vars(obj))


CLASSES: tuple[StateClass, ...] = (
    StateClass("run", RunState, lambda: RunState(""), omitted=("ranks", "blocks", "armed", "pace")),
    StateClass("rank", RankState, lambda: RankState("", 0), omitted=("blocks", "intervals_now")),
    StateClass("rank_signals", RankSignals, lambda: RankSignals(0)),
    StateClass("prompt_type_signals", PromptTypeSignals, PromptTypeSignals),
    StateClass("key_history", KeyHistory, KeyHistory),
    StateClass("welford", Welford, Welford),
    StateClass("law_tracker", LawTracker, LawTracker),
    StateClass("law_sums", LawSums, LawSums),
    StateClass("heldout_tracker", HeldOutTracker, HeldOutTracker),
    StateClass("step_log", StepLog, StepLog),
    StateClass("file", FileState, lambda: FileState(0)),
    StateClass("logger_file", LoggedFile, lambda: LoggedFile(""), omitted=("pending", "seen_pending")),
)
BY_NAME = {c.name: c for c in CLASSES}
BY_CLASS = {c.cls: c for c in CLASSES}


class UnusableState(ValueError):
    """A state this code cannot use (a class or extension type it does not know, a schema with
    no migration to this one): set aside whole."""


def _encode(obj: Any) -> Any:
    """MessagePack's ``default``: every value that is not one of its own types."""
    kind = type(obj)
    if (known := BY_CLASS.get(kind)) is not None:
        return msgpack.ExtType(EXT_OBJECT, pack([known.name, {f: getattr(obj, f) for f in known.fields}]))
    if kind is deque or kind is set or kind is frozenset:
        return list(obj)
    if isinstance(obj, Path):
        return msgpack.ExtType(EXT_PATH, bytes(obj))
    if kind is array and obj.typecode in ARRAY_TYPES:
        if sys.byteorder != "little":
            obj = array(obj.typecode, obj)
            obj.byteswap()
        return msgpack.ExtType(EXT_ARRAY, obj.typecode.encode() + obj.tobytes())
    raise TypeError(f"the saved state cannot hold a {kind.__name__}")


def pack(obj: Any) -> bytes:
    """One MessagePack document of ``obj`` (the store's objects included)."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True, unicode_errors=UNICODE_ERRORS)


class Decoder:
    """Decodes documents written under ``schema``, migrating each object's fields to SCHEMA."""

    def __init__(self, schema: int) -> None:
        if schema > SCHEMA or any(s not in MIGRATIONS for s in range(schema, SCHEMA)):
            raise UnusableState(f"schema {schema}: this exporter reads schema {SCHEMA} and migrates "
                                f"from {min(MIGRATIONS, default=SCHEMA)} on")
        self.steps = [MIGRATIONS[s] for s in range(schema, SCHEMA)]

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self._ext, use_list=False, strict_map_key=False,
                               raw=False, unicode_errors=UNICODE_ERRORS)

    def stream(self, data: bytes | memoryview) -> Iterator[Any]:
        """The documents of ``data``, one after the other."""
        unpacker = msgpack.Unpacker(ext_hook=self._ext, use_list=False, strict_map_key=False, raw=False,
                                    unicode_errors=UNICODE_ERRORS, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        yield from unpacker

    def _ext(self, code: int, data: bytes) -> Any:
        if code == EXT_PATH:
            return Path(data.decode(errors="surrogateescape"))
        if code == EXT_ARRAY:
            typecode = data[:1].decode()
            if typecode not in ARRAY_TYPES:
                raise UnusableState(f"an array of type {typecode!r}")
            values = array(typecode)
            values.frombytes(data[1:])
            if sys.byteorder != "little":
                values.byteswap()
            return values
        if code == EXT_OBJECT:
            return self._object(*self.unpack(data))
        raise UnusableState(f"extension type {code}")

    def _object(self, name: str, saved: dict[str, Any]) -> Any:
        known = BY_NAME.get(name)
        if known is None:
            raise UnusableState(f"an object of class {name!r}")
        for step in self.steps:
            if (migrate := step.get(name)) is not None:
                saved = migrate(saved)
        return known.build(saved)
