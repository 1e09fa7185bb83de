"""TensorBoard's event files (``events.out.tfevents.*``): the scalars of each event, by step.

The file is a TFRecord stream: each record ``uint64 length``, ``uint32 masked crc32c(length)``,
``length`` bytes of data, ``uint32 masked crc32c(data)``, all little-endian; each data an
``Event`` message (tensorflow/core/util/event.proto): ``wall_time`` (1, double), ``step`` (2,
int64), ``file_version`` (3, the first event: ``brain.Event:2``), ``summary`` (5). A
``Summary`` holds ``value`` entries (1): ``tag`` (1) with a ``simple_value`` (2, float) as
``torch.utils.tensorboard`` and tensorboardX write scalars by default, or a ``tensor`` (8) of one
number with ``metadata`` (9) naming the ``scalars`` plugin, as TensorFlow 2 and
``new_style=True`` write them. Images, histograms, text and graphs are skipped.

A writer appends whole records but flushes when it likes (every two minutes by default): the
reader stops at a record that is not whole yet and takes it up on the next read. Decoded by
hand (runtime/loggers/protowire.py) rather than with the ``tensorboard`` package, whose reader
pulls grpcio, werkzeug and pillow into the exporter's image (docs/loggers.md#tensorboard).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_monitor.runtime.loggers.protowire import (
    FIXED32, FIXED64, LENGTH, VARINT, WireError, as_double, as_float, as_int64, fields,
)

__all__ = ["Event", "FormatError", "float32_text", "masked_crc32c", "read_events"]

_HEADER = 12  # length (8) and its crc (4)
# No scalar event is near this: a length beyond it is a corrupt header, not a record to wait for.
MAX_RECORD_BYTES = 64 << 20
FILE_VERSION = b"brain.Event:"
# TensorProto dtypes that hold one number.
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9


class FormatError(ValueError):
    """Bytes that are no TensorBoard event file (the whole file, not one record)."""


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use it; table-driven: a scalar event is ~60 bytes."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass(frozen=True)
class Event:
    step: int
    wall_time: float | None
    # A float32 (simple_value, a DT_FLOAT tensor) as the decimal the trainer logged
    # (float32_text); a double or an integer as it is.
    scalars: dict[str, float]


def _tensor_number(data: bytes) -> float | None:
    dtype, values = 0, []
    for number, wire, value in fields(data):
        if number == 1 and wire == VARINT:
            dtype = int(value)  # type: ignore[arg-type]
        elif number == 4 and wire == LENGTH:  # tensor_content: the raw little-endian array
            fmt = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}.get(dtype)
            if fmt and len(value) == struct.calcsize(fmt):  # type: ignore[arg-type]
                raw = struct.unpack(fmt, value)[0]  # type: ignore[arg-type]
                values.append(float32_text(raw) if dtype == _DT_FLOAT else raw)
        elif number == 5:  # float_val, packed or not
            if wire == LENGTH and len(value) == 4:  # type: ignore[arg-type]
                values.append(float32_text(struct.unpack("<f", value)[0]))  # type: ignore[arg-type]
            elif wire == FIXED32:
                values.append(float32_text(as_float(value)))  # type: ignore[arg-type]
        elif number == 6:  # double_val
            if wire == LENGTH and len(value) == 8:  # type: ignore[arg-type]
                values.append(struct.unpack("<d", value)[0])  # type: ignore[arg-type]
            elif wire == FIXED64:
                values.append(as_double(value))  # type: ignore[arg-type]
        elif number in (7, 10) and wire == VARINT:  # int_val, int64_val
            values.append(float(as_int64(value)))  # type: ignore[arg-type]
    return float(values[0]) if len(values) == 1 else None


def _is_scalar_plugin(metadata: bytes) -> bool:
    for number, wire, value in fields(metadata):
        if number == 1 and wire == LENGTH:  # plugin_data
            for n2, w2, v2 in fields(value):  # type: ignore[arg-type]
                if n2 == 1 and w2 == LENGTH and v2 == b"scalars":
                    return True
        elif number == 4 and wire == VARINT and value == 1:  # data_class: DATA_CLASS_SCALAR
            return True
    return False


def _summary_scalars(summary: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    for number, wire, value in fields(summary):
        if number != 1 or wire != LENGTH:
            continue
        tag, simple, tensor, metadata = None, None, None, None
        for n2, w2, v2 in fields(value):  # type: ignore[arg-type]
            if n2 == 1 and w2 == LENGTH:
                tag = v2
            elif n2 == 2 and w2 == FIXED32:
                simple = float32_text(as_float(v2))  # type: ignore[arg-type]
            elif n2 == 8 and w2 == LENGTH:
                tensor = v2
            elif n2 == 9 and w2 == LENGTH:
                metadata = v2
        if not isinstance(tag, bytes):
            continue
        if simple is None and isinstance(tensor, bytes) and isinstance(metadata, bytes) \
                and _is_scalar_plugin(metadata):
            simple = _tensor_number(tensor)
        if simple is not None:
            out[tag.decode("utf-8", "replace")] = simple
    return out


def decode_event(data: bytes) -> tuple[Event | None, bytes | None]:
    """One ``Event`` as (its scalars, or None when it has none; its file_version, if any)."""
    step, wall_time, scalars, version = 0, None, {}, None
    for number, wire, value in fields(data):
        if number == 1 and wire == FIXED64:
            wall_time = as_double(value)  # type: ignore[arg-type]
        elif number == 2 and wire == VARINT:
            step = as_int64(value)  # type: ignore[arg-type]
        elif number == 3 and wire == LENGTH:
            version = value  # type: ignore[assignment]
        elif number == 5 and wire == LENGTH:
            scalars = _summary_scalars(value)  # type: ignore[arg-type]
    event = Event(step, wall_time, scalars) if scalars else None
    return event, version


def read_events(buf: bytes, at_start: bool) -> tuple[list[Event], int, int]:
    """The whole records of ``buf`` (bytes of the file from a record's start) as (their events
    that carry scalars, bytes consumed, corrupt records skipped). ``at_start``: ``buf`` begins at
    the file's first byte, whose record must name the event file version. FormatError when the
    file is no event file: its first record is not an Event, or a length's checksum fails (no
    record boundary can be trusted after it)."""
    events: list[Event] = []
    pos, corrupt, view = 0, 0, memoryview(buf)
    while len(buf) - pos >= _HEADER:
        header = bytes(view[pos:pos + 8])
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", view[pos + 8:pos + 12])
        if masked_crc32c(header) != length_crc or length > MAX_RECORD_BYTES:
            raise FormatError("a record length whose checksum fails: not a TFRecord stream")
        end = pos + _HEADER + length + 4
        if end > len(buf):
            break  # not whole yet
        data = bytes(view[pos + _HEADER:pos + _HEADER + length])
        (data_crc,) = struct.unpack("<I", view[end - 4:end])
        pos = end
        if masked_crc32c(data) != data_crc:
            corrupt += 1
            continue
        try:
            event, version = decode_event(data)
        except WireError:
            if at_start and not events:
                raise FormatError("its first record is no Event") from None
            corrupt += 1
            continue
        if at_start:
            if version is None or not version.startswith(FILE_VERSION):
                raise FormatError("its first event names no event file version")
            at_start = False
        if event is not None:
            events.append(event)
    return events, pos, corrupt


def float32_text(value: float) -> float:
    """A float32 as the shortest decimal that is the same float32 (0.1, not 0.100000001):
    the value the trainer logged, as the SDK would have written it."""
    if value != value or value in (float("inf"), float("-inf")):
        return value
    try:
        packed = struct.pack("<f", value)
    except OverflowError:  # a tensor's double beyond float32's range: no float32 to shorten
        return value
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value


def by_step(events: list[Event]) -> Iterator[Event]:
    """Consecutive events of one step merged: a writer logs a step's scalars one event each."""
    current: Event | None = None
    for event in events:
        if current is not None and event.step == current.step:
            current.scalars.update(event.scalars)
            continue
        if current is not None:
            yield current
        current = Event(event.step, event.wall_time, dict(event.scalars))
    if current is not None:
        yield current
