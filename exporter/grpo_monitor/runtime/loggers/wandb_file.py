"""W&B's run file (``wandb/run-<date>-<id>/run-<id>.wandb``): the history rows, and the run's name.

Every W&B run, online or offline, keeps this append-only transaction log beside the trainer
(wandb/sdk/internal/datastore.py; wandb-core's transactionlog). Its layout:

* a 7-byte header: ``:W&B``, the magic 0xBEE1 (uint16, little-endian), version 0;
* then LevelDB's log format: 32 KiB blocks (counted from the file's first byte), each holding
  chunks ``uint32 crc | uint16 length | uint8 type`` + payload; a record too long for its block
  is split FIRST, MIDDLE..., LAST; a block's last < 7 bytes are zero padding. The checksum is
  CRC-32 (IEEE, ``zlib.crc32``) of the type byte and the payload;
* each record a ``wandb_internal.Record`` message: ``history`` (2) holds a step's row —
  ``item`` (1) entries of ``key`` (1) or ``nested_key`` (2, the path of a logged dict's leaf)
  and ``value_json`` (16, NaN and ±Inf as JSON's ``NaN``/``Infinity``), ``step`` (2: ``num``
  1); ``run`` (17) holds ``run_id`` (1) and ``display_name`` (8).

wandb-core writes a block when it is full or flushed: the reader stops at a chunk that is not
whole yet and reads it again on the next turn. Decoded by hand (runtime/loggers/protowire.py):
the ``wandb`` package ships a Go binary and its reader is an internal API
(docs/loggers.md#wb). Fields such as ``_runtime``, ``_timestamp`` and media (a dict with a
``_type``) are no metrics: the time goes to the record's ``time``, the rest is left out.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from grpo_monitor.runtime.loggers.protowire import LENGTH, VARINT, WireError, as_int64, fields

__all__ = ["MAX_RECORD_BYTES", "FormatError", "Read", "read_records"]

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
BLOCK = 32 << 10
_CHUNK = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
# The longest record read: a step's row is a few KiB; a longer record (a huge summary, a hostile
# file) is skipped and counted corrupt, so that one turn's read always holds a whole record.
MAX_RECORD_BYTES = 16 << 20
_HISTORY, _RUN = 2, 17
# Fields of a row that are W&B's own bookkeeping.
_TIME_KEY = "_timestamp"
_NOT_METRICS = frozenset({"_step", "_runtime", "_timestamp"})


class FormatError(ValueError):
    """A file that is no W&B run file of a version this reader knows."""


@dataclass
class Read:
    rows: list[dict[str, Any]] = field(default_factory=list)  # flat snapshot records
    consumed: int = 0
    corrupt: int = 0
    run_name: str | None = None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


def _row(history: bytes) -> dict[str, Any] | None:
    values: dict[str, Any] = {}
    step: int | None = None
    for number, wire, value in fields(history):
        if number == 1 and wire == LENGTH:
            key, path, raw = "", [], b""
            for n2, w2, v2 in fields(value):  # type: ignore[arg-type]
                if n2 == 1 and w2 == LENGTH:
                    key = _text(v2)
                elif n2 == 2 and w2 == LENGTH:
                    path.append(_text(v2))
                elif n2 == 16 and w2 == LENGTH:
                    raw = v2  # type: ignore[assignment]
            name = "/".join(path) if path else key
            if not name:
                continue
            try:
                values[name] = json.loads(raw) if raw else None
            except (ValueError, RecursionError):  # RecursionError: a value nested thousands deep
                continue
        elif number == 2 and wire == LENGTH:
            for n2, w2, v2 in fields(value):  # type: ignore[arg-type]
                if n2 == 1 and w2 == VARINT:
                    step = as_int64(v2)  # type: ignore[arg-type]
    logged_step = values.get("_step")
    if step is None and isinstance(logged_step, int) and not isinstance(logged_step, bool):
        step = logged_step  # (true is no step)
    if step is None:
        return None
    media = {name.rsplit("/", 1)[0] for name in values if name.endswith("/_type")}
    record: dict[str, Any] = {"step": step}
    when = values.get(_TIME_KEY)
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        try:
            when = float(when)
        except OverflowError:  # an integer beyond float's range: no time
            when = math.nan
        if math.isfinite(when):
            record["time"] = when
    for name, value in values.items():
        if name in _NOT_METRICS or any(name.startswith(m + "/") for m in media):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            record[name] = value
    return record


def _run_name(run: bytes) -> str | None:
    run_id = display = None
    for number, wire, value in fields(run):
        if number == 1 and wire == LENGTH:
            run_id = _text(value)
        elif number == 8 and wire == LENGTH:
            display = _text(value)
    return display or run_id


def read_records(data: bytes, *, at_start: bool, offset: int) -> Read:
    """The whole records of ``data``, the file's bytes from ``offset`` (0, or where a previous
    read stopped). FormatError when the file's header is not W&B's version 0."""
    out = Read()
    pos = 0
    if at_start:
        if len(data) < len(HEADER):
            return out
        if data[:len(HEADER)] != HEADER:
            if data[:4] == HEADER[:4]:
                raise FormatError("a W&B run file of another version than 0")
            raise FormatError("no W&B header")
        pos = len(HEADER)
    size = len(data)
    dropping = False  # inside a record longer than MAX_RECORD_BYTES: its chunks are skipped
    while True:
        parts: list[bytes] = []
        assembled = 0
        at = pos
        whole = False
        while True:
            left = BLOCK - (offset + at) % BLOCK
            if left < _CHUNK:  # the block's zero padding
                at += left
                continue
            if at + _CHUNK > size:
                break
            crc, length, kind = struct.unpack_from("<IHB", data, at)
            end = at + _CHUNK + length
            if end > size:
                break  # not whole yet
            payload = data[at + _CHUNK:end]
            if crc == 0 and length == 0 and kind == 0:
                break  # zeros past the written part: wait for it
            ok = (_CHUNK + length <= left and kind in (FULL, FIRST, MIDDLE, LAST)
                  and zlib.crc32(bytes([kind]) + payload) == crc
                  and (kind in (FULL, FIRST)) == (not parts and not dropping))
            if not ok:
                if end >= size or at + left > size:
                    # The last bytes written: maybe torn mid-write, read again later. Or a
                    # corrupt chunk in a block not whole yet: the next chunk to trust starts at
                    # the next block, past these bytes; skipped (and counted) once it is there,
                    # since what is consumed never goes past the bytes read (the caller's offset
                    # would pass the file's end, and the file be read again from its start).
                    break
                # A corrupt chunk: skip to the next block, where a chunk starts.
                out.corrupt += 1
                parts, dropping = [], False
                at += left
                pos = at
                continue
            at = end
            if dropping:  # the rest of a record too long to read
                pos = at
                dropping = kind != LAST
                continue
            parts.append(payload)
            assembled += length
            if assembled > MAX_RECORD_BYTES and kind not in (FULL, LAST):
                out.corrupt += 1
                parts, assembled, dropping, pos = [], 0, True, at
                continue
            if kind in (FULL, LAST):
                whole = True
                break
        if not whole:
            break
        pos = at
        try:
            _record(b"".join(parts), out)
        except WireError:
            out.corrupt += 1
    out.consumed = pos
    return out


def _record(payload: bytes, out: Read) -> None:
    for number, wire, value in fields(payload):
        if number == _HISTORY and wire == LENGTH:
            row = _row(value)  # type: ignore[arg-type]
            if row is not None:
                out.rows.append(row)
        elif number == _RUN and wire == LENGTH:
            out.run_name = _run_name(value) or out.run_name  # type: ignore[arg-type]
