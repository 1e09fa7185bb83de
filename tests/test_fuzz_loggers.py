"""Fuzzing the readers of the loggers' files, and the rows and key maps they feed.

A logger's file (a TensorBoard event file, a W&B run file, an MLflow or Trackio database, a CSV
table, NeMo-RL's per-sample file) and a run's ``.grpo-keys.toml`` are placed by users: a fault
in one stays in its file. Properties:

* each reader (runtime/loggers: ``tensorboard.read_events``, ``wandb_file.read_records``,
  ``protowire.fields``, ``databases.read_new``) raises its documented exception and nothing else,
  and what it returns is well-typed (steps ints, values floats, names text); a valid stream is
  read back as written, and read alike in one piece or two (the ingest reads a budget a turn);
* the row converters (contract/logger_rows.py) never raise, and give well-typed, finite
  statistics;
* ``LoggerFiles.process`` on any bytes under each format's name never raises but OSError, and
  counts its errors with a reason of ERROR_REASONS;
* the key map parser raises KeyMapError and nothing else;
* through the ingest as a whole, a run folder of hostile files leaves a good run beside it whole.

The frames around mutated payloads are built here (TFRecord with masked CRC-32C, LevelDB's log
with CRC-32), so that the payloads, not only the framing, are fuzzed. Then the findings, one
``@example`` each where a property found them.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sqlite3
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fuzz_strategies import NAMES, encode, fuzz, json_object, json_text, names, values
from hypothesis import example, given
from hypothesis import strategies as st

from grpo_monitor.contract.key_map import KeyMap, KeyMapError, Target
from grpo_monitor.contract.keys import SIGNALS_BY_KEY
from grpo_monitor.contract.logger_rows import (
    StepSamples, as_snapshot_row, csv_table, log_rows, trainer_state_rows,
)
from grpo_monitor.contract.snapshot import RecordError, parse_record
from grpo_monitor.runtime.health import ERROR_REASONS, ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.loggers import databases, protowire, tensorboard, wandb_file
from grpo_monitor.runtime.loggers.sources import LoggerFiles
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.sdk.writer import SnapshotWriter

INT64 = (-(1 << 63), (1 << 63) - 1)
_serial = itertools.count()


# -- protobuf's wire format, written here ------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def pb_varint(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value & ((1 << 64) - 1))  # a negative int64 as 10 bytes


def pb_bytes(number: int, value: bytes) -> bytes:
    return tag(number, 2) + varint(len(value)) + value


def pb_fixed64(number: int, bits: int) -> bytes:
    return tag(number, 1) + bits.to_bytes(8, "little")


def pb_fixed32(number: int, bits: int) -> bytes:
    return tag(number, 5) + bits.to_bytes(4, "little")


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def f64_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def _mutate(data: bytes, ops: list[tuple[str, float, bytes]]) -> bytes:
    """``data`` with a few bytes flipped, cut, inserted, dropped or repeated."""
    b = bytearray(data)
    for op, at, chunk in ops:
        i = int(len(b) * at)
        if op == "flip" and b:
            b[min(i, len(b) - 1)] ^= chunk[0] or 0x80
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = chunk
        elif op == "drop":
            del b[i:i + len(chunk)]
        elif op == "repeat":
            b[i:i] = b[max(0, i - 4 * len(chunk)):i]
    return bytes(b)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of ``choices``, each as often as its weight says (st.one_of draws its branches
    alike, and takes a strategy given twice as one branch)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(table.__getitem__)


def mutated(data: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Bytes of ``data`` as they are, mostly, else with a few mutations."""
    ops = st.lists(st.tuples(st.sampled_from(("flip", "cut", "insert", "drop", "repeat")),
                             st.floats(0, 1), st.binary(min_size=1, max_size=8)),
                   min_size=1, max_size=3)
    return weighted((3, data), (1, st.builds(_mutate, data, ops)))


field_numbers = st.one_of(st.integers(1, 20), st.sampled_from((0, 16, 17, (1 << 29) - 1)),
                          st.integers(0, (1 << 29) - 1))
u64 = st.one_of(st.integers(0, (1 << 64) - 1), st.sampled_from((0, 1, (1 << 63), (1 << 64) - 1)))
any_field = st.one_of(
    st.builds(pb_varint, field_numbers, u64),
    st.builds(pb_fixed64, field_numbers, u64),
    st.builds(pb_fixed32, field_numbers, st.integers(0, (1 << 32) - 1)),
    st.builds(pb_bytes, field_numbers, st.binary(max_size=24)),
)
# Any message, its length-delimited fields holding messages in turn.
messages = st.recursive(
    st.lists(any_field, max_size=4).map(b"".join),
    lambda kids: st.lists(st.one_of(any_field, st.builds(pb_bytes, field_numbers, kids)),
                          max_size=4).map(b"".join),
    max_leaves=16)
# Bytes no message is made of: a varint cut short or too long, a length past the end, groups.
WIRE_TRAPS = (
    b"\x08", b"\x08\xff", b"\x08" + b"\xff" * 9, b"\x08" + b"\xff" * 10 + b"\x01",
    b"\x08" + b"\x80" * 11 + b"\x00", b"\xff" * 12, b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x12" + varint(1 << 63) + b"x", b"\x12\x05abc", b"\x09\x00\x00", b"\x0d\x00", b"\x0b",
    b"\x0c", b"\x0e", b"\x0f\x00", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
)


def nested(depth: int, inner: bytes, number: int = 1) -> bytes:
    for _ in range(depth):
        inner = pb_bytes(number, inner)
    return inner


# -- protowire -------------------------------------------------------------------------------


def check_fields(data: bytes) -> list[tuple[int, int, int | bytes]] | None:
    try:
        out = list(protowire.fields(data))
    except protowire.WireError:
        return None
    for number, wire, value in out:
        assert type(number) is int and number >= 0
        assert wire in (protowire.VARINT, protowire.FIXED64, protowire.LENGTH, protowire.FIXED32)
        if wire == protowire.LENGTH:
            assert type(value) is bytes
        else:
            assert type(value) is int and 0 <= value < 1 << 64
        if wire == protowire.VARINT:
            assert INT64[0] <= protowire.as_int64(value) <= INT64[1]  # type: ignore[arg-type]
        if wire == protowire.FIXED64:
            assert type(protowire.as_double(value)) is float  # type: ignore[arg-type]
        if wire == protowire.FIXED32:
            assert type(protowire.as_float(value)) is float  # type: ignore[arg-type]
    return out


@fuzz(400)
@given(data=st.one_of(st.binary(max_size=64), mutated(messages), st.sampled_from(WIRE_TRAPS),
                      st.builds(lambda m, t: m + t, messages, st.sampled_from(WIRE_TRAPS))))
# An 11th byte of a varint (0x01 past ten 0xff) made as_int64 give 2**69 - 2**64, no int64.
@example(data=b"\x08" + b"\xff" * 9 + b"\x7f")
def test_the_wire_decoder_gives_fields_or_a_wire_error(data: bytes) -> None:
    check_fields(data)


@fuzz(200)
@given(message=messages)
def test_a_message_written_is_read_back_field_by_field(message: bytes) -> None:
    out = check_fields(message)
    assert out is not None
    again = b""
    for number, wire, value in out:
        if wire == protowire.VARINT:
            again += pb_varint(number, value)  # type: ignore[arg-type]
        elif wire == protowire.FIXED64:
            again += pb_fixed64(number, value)  # type: ignore[arg-type]
        elif wire == protowire.FIXED32:
            again += pb_fixed32(number, value)  # type: ignore[arg-type]
        else:
            again += pb_bytes(number, value)  # type: ignore[arg-type]
    assert again == message


@pytest.mark.parametrize("depth", [1, 100, 5000])
def test_deep_nesting_and_huge_lengths_do_not_reach_the_stack(depth: int) -> None:
    """The decoders never recurse past their schema's few levels, however deep a message."""
    deep = nested(depth, pb_fixed32(2, f32_bits(1.5)))
    event = pb_bytes(5, nested(depth, deep))
    assert tensorboard.decode_event(event)[0] is None
    history = pb_bytes(2, nested(depth, pb_bytes(16, b"1")))
    read = wandb_file.Read()
    wandb_file._record(history, read)  # noqa: SLF001 - the decoder below read_records' framing
    assert read.rows == []
    assert check_fields(b"\x12" + varint((1 << 64) - 1) + b"x") is None


# -- TensorBoard ---------------------------------------------------------------------------------


def tf_frame(data: bytes, *, good_length_crc: bool = True, good_data_crc: bool = True) -> bytes:
    header = struct.pack("<Q", len(data))
    length_crc = tensorboard.masked_crc32c(header) ^ (0 if good_length_crc else 1)
    data_crc = tensorboard.masked_crc32c(data) ^ (0 if good_data_crc else 1)
    return header + struct.pack("<I", length_crc) + data + struct.pack("<I", data_crc)


def _crc32c_reference(data: bytes) -> int:
    """CRC-32C bit by bit, for the module's table to be checked against."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


VERSION_EVENT = pb_fixed64(1, f64_bits(1.0)) + pb_bytes(3, b"brain.Event:2")
tags = st.one_of(names.map(encode), st.binary(max_size=8))
f32_values = st.one_of(st.floats(width=32).map(f32_bits), st.integers(0, (1 << 32) - 1))
f64_values = st.one_of(st.floats().map(f64_bits), u64)
tensor_parts = st.one_of(
    st.builds(pb_varint, st.just(1), st.sampled_from((0, 1, 2, 3, 9, 7, 99))),  # dtype
    st.builds(pb_bytes, st.just(4), st.one_of(st.binary(max_size=9),  # tensor_content
                                              f32_values.map(lambda b: b.to_bytes(4, "little")),
                                              f64_values.map(lambda b: b.to_bytes(8, "little")))),
    st.builds(pb_fixed32, st.just(5), f32_values),
    st.builds(pb_bytes, st.just(5), f32_values.map(lambda b: b.to_bytes(4, "little"))),
    st.builds(pb_fixed64, st.just(6), f64_values),
    st.builds(pb_bytes, st.just(6), f64_values.map(lambda b: b.to_bytes(8, "little"))),
    st.builds(pb_varint, st.sampled_from((7, 10)), u64),
    any_field,
)
# A tensor of one number as TensorFlow 2 writes it (its dtype, then the value in the field of
# that dtype), or any of its parts in any order.
tensors = st.one_of(
    st.builds(lambda b: pb_varint(1, 1) + pb_fixed32(5, b), f32_values),
    st.builds(lambda b: pb_varint(1, 2) + pb_fixed64(6, b), f64_values),
    st.builds(lambda b: pb_varint(1, 1) + pb_bytes(4, b.to_bytes(4, "little")), f32_values),
    st.builds(lambda b: pb_varint(1, 2) + pb_bytes(4, b.to_bytes(8, "little")), f64_values),
    st.builds(lambda d, v: pb_varint(1, d) + pb_varint(10 if d == 9 else 7, v),
              st.sampled_from((3, 9)), st.integers(*INT64) | u64),
    st.lists(tensor_parts, max_size=4).map(b"".join),
)
SCALARS_PLUGIN = pb_bytes(1, pb_bytes(1, b"scalars"))
metadata = st.one_of(
    st.just(SCALARS_PLUGIN), st.just(SCALARS_PLUGIN),
    st.builds(lambda name: pb_bytes(1, pb_bytes(1, name)), st.binary(max_size=8)),
    st.builds(pb_varint, st.just(4), st.sampled_from((1, 0, 2, 1 << 63))),
    messages,
)
summary_value = st.one_of(
    st.builds(lambda t, v: pb_bytes(1, t) + pb_fixed32(2, v), tags, f32_values),  # simple_value
    st.builds(lambda t, v: pb_bytes(1, t) + pb_fixed32(2, v), tags, f32_values),
    st.builds(lambda t, tensor, meta: pb_bytes(1, t) + pb_bytes(8, tensor) + pb_bytes(9, meta),
              tags, mutated(tensors), mutated(metadata)),
    st.lists(st.one_of(st.builds(pb_bytes, st.just(1), tags),
                       st.builds(pb_fixed32, st.just(2), f32_values),
                       st.builds(pb_bytes, st.just(8), tensors),
                       st.builds(pb_bytes, st.just(9), metadata),
                       any_field), max_size=5).map(b"".join),
)
summary = st.lists(st.one_of(st.builds(pb_bytes, st.just(1), mutated(summary_value)),
                             st.builds(pb_bytes, st.just(1), summary_value), any_field),
                   max_size=4).map(b"".join)
steps_i64 = st.one_of(st.integers(0, 10**6), st.integers(*INT64), u64)
event_payload = st.one_of(
    st.builds(lambda wall, step, summ, noise: wall + step + pb_bytes(5, summ) + noise,
              st.one_of(st.just(b""), st.builds(pb_fixed64, st.just(1), f64_values)),
              st.one_of(st.just(b""), st.builds(pb_varint, st.just(2), steps_i64)),
              summary, st.lists(any_field, max_size=1).map(b"".join)),
    st.lists(st.one_of(
        st.builds(pb_fixed64, st.just(1), f64_values),
        st.builds(pb_varint, st.just(2), steps_i64),
        st.builds(pb_bytes, st.just(3), st.sampled_from((b"brain.Event:2", b"brain.Event:1", b"",
                                                         b"brain.Event:"))),
        st.builds(pb_bytes, st.just(5), summary),
        any_field,
    ), max_size=5).map(b"".join),
)
good_frames = event_payload.map(tf_frame)
tf_frames = st.one_of(
    mutated(event_payload).map(tf_frame),
    st.builds(lambda d, lc, dc: tf_frame(d, good_length_crc=lc, good_data_crc=dc),
              event_payload, st.booleans(), st.booleans()),
    st.binary(max_size=16),  # bytes between records: the next header's checksum fails
)
tf_streams = st.builds(
    lambda first, frames: b"".join([first, *frames]),
    weighted((6, st.just(tf_frame(VERSION_EVENT))), (1, tf_frames), (1, st.just(b""))),
    st.lists(weighted((5, good_frames), (1, tf_frames)), max_size=6))


# An event file whose one scalar is a DT_DOUBLE tensor of 1e300, beyond float32's range.
HUGE_DOUBLE_SCALAR = tf_frame(VERSION_EVENT) + tf_frame(pb_bytes(5, pb_bytes(1, (
    pb_bytes(1, b"t") + pb_bytes(8, pb_varint(1, 2) + pb_fixed64(6, f64_bits(1e300)))
    + pb_bytes(9, SCALARS_PLUGIN)))))


def check_events(buf: bytes, at_start: bool) -> tuple[list[tensorboard.Event], int, int] | None:
    try:
        events, used, corrupt = tensorboard.read_events(buf, at_start)
    except tensorboard.FormatError:
        return None
    assert type(used) is int and 0 <= used <= len(buf)
    assert type(corrupt) is int and corrupt >= 0
    for event in events:
        assert isinstance(event, tensorboard.Event)
        assert type(event.step) is int and INT64[0] <= event.step <= INT64[1]
        assert event.wall_time is None or type(event.wall_time) is float
        assert event.scalars
        assert all(type(k) is str and type(v) is float for k, v in event.scalars.items())
        for v in event.scalars.values():
            assert type(tensorboard.float32_text(v)) is float  # as sources.py applies it
    # What is left is no whole record: read again, it gives nothing and costs nothing.
    assert tensorboard.read_events(buf[used:], at_start and used == 0) == ([], 0, 0)
    return events, used, corrupt


@fuzz(300)
@given(buf=st.one_of(st.binary(max_size=128), tf_streams, mutated(tf_streams)),
       at_start=st.booleans())
# A scalar tensor of a double beyond float32's range: float32_text (which sources.py applies to
# every scalar) raised OverflowError from struct.pack.
@example(buf=HUGE_DOUBLE_SCALAR, at_start=True)
def test_an_event_stream_gives_typed_events_or_a_format_error(buf: bytes, at_start: bool) -> None:
    check_events(buf, at_start)


@fuzz(200)
@given(buf=tf_streams, at=st.floats(0, 1))
def test_an_event_stream_reads_alike_in_one_piece_or_two(buf: bytes, at: float) -> None:
    """The ingest reads a budget a turn, from where the last turn stopped."""
    whole = check_events(buf, True)
    if whole is None:
        return
    first = check_events(buf[:int(len(buf) * at)], True)
    assert first is not None  # a prefix fails a check only where the whole does
    second = check_events(buf[first[1]:], first[1] == 0)
    assert second is not None
    assert repr(first[0] + second[0]) == repr(whole[0])
    assert (first[1] + second[1], first[2] + second[2]) == (whole[1], whole[2])


scalar_events = st.lists(st.tuples(
    st.integers(*INT64), st.none() | st.floats(),
    st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8),
                    st.floats(width=32), max_size=3)), max_size=5)


@fuzz(150)
@given(events=scalar_events)
def test_scalars_written_are_read_back(
        events: list[tuple[int, float | None, dict[str, float]]]) -> None:
    buf = tf_frame(VERSION_EVENT)
    for step, wall, scalars in events:
        values = b"".join(pb_bytes(1, pb_bytes(1, k.encode()) + pb_fixed32(2, f32_bits(v)))
                          for k, v in scalars.items())
        buf += tf_frame((pb_fixed64(1, f64_bits(wall)) if wall is not None else b"")
                        + pb_varint(2, step) + pb_bytes(5, values))
    read = check_events(buf, True)
    assert read is not None and read[1:] == (len(buf), 0)
    expected = [(step, None if wall is None else f64_bits(wall),
                 {k: f32_bits(v) for k, v in scalars.items()})
                for step, wall, scalars in events if scalars]
    assert [(e.step, None if e.wall_time is None else f64_bits(e.wall_time),
             {k: f32_bits(v) for k, v in e.scalars.items()}) for e in read[0]] == expected


@fuzz(100)
@given(data=st.binary(max_size=300))
def test_the_crc32c_is_castagnolis(data: bytes) -> None:
    assert tensorboard.crc32c(data) == _crc32c_reference(data)


# -- W&B's run file ------------------------------------------------------------------------------

BLOCK, CHUNK = wandb_file.BLOCK, 7


def wandb_log(records: list[bytes], start: int = 0) -> bytes:
    """LevelDB's log of ``records``, laid out from ``start`` bytes into the file (the header)."""
    out = bytearray()
    for record in records:
        first, rest = True, record
        while True:
            left = BLOCK - (start + len(out)) % BLOCK
            if left < CHUNK:
                out += b"\0" * left
                continue
            piece, rest = rest[:left - CHUNK], rest[left - CHUNK:]
            last = not rest
            kind = (wandb_file.FULL if last else wandb_file.FIRST) if first else \
                (wandb_file.LAST if last else wandb_file.MIDDLE)
            out += struct.pack("<IHB", zlib.crc32(bytes([kind]) + piece), len(piece), kind) + piece
            first = False
            if last:
                break
    return bytes(out)


def wandb_file_of(records: list[bytes]) -> bytes:
    return wandb_file.HEADER + wandb_log(records, len(wandb_file.HEADER))


DEEP_JSON = b"[" * 5000 + b"]" * 5000
value_json = st.one_of(json_text.map(encode), st.sampled_from((
    DEEP_JSON, b'{"_type": "image-file", "path": "x"}', b"1" + b"0" * 400, b"1" + b"0" * 5000,
    b"true", b"NaN", b'"12"', b"\xff\xfe", b"")))
item_noise = st.lists(st.one_of(
    st.builds(pb_bytes, st.just(1), tags),  # key
    st.builds(pb_bytes, st.just(2), tags),  # nested_key
    st.builds(pb_bytes, st.just(1), st.sampled_from((b"_step", b"_timestamp", b"_runtime",
                                                     b"media/_type", b"loss"))),
    st.builds(pb_bytes, st.just(16), value_json),
    any_field,
), max_size=4).map(b"".join)
item_keys = st.one_of(tags, st.sampled_from((b"_step", b"_timestamp", b"_runtime", b"loss")))
item = st.one_of(
    st.builds(lambda k, v: pb_bytes(1, k) + pb_bytes(16, v), item_keys, value_json),
    st.builds(lambda k, v: pb_bytes(1, k) + pb_bytes(16, v), item_keys, values.map(encode)),
    st.builds(lambda path, v: b"".join(pb_bytes(2, p) for p in path) + pb_bytes(16, v),
              st.lists(st.one_of(tags, st.just(b"_type")), min_size=1, max_size=3), value_json),
    item_noise,
)
history = st.one_of(
    st.builds(lambda items, step: b"".join(pb_bytes(1, i) for i in items) + step,
              st.lists(mutated(item), max_size=4),
              st.one_of(st.just(b""), steps_i64.map(lambda n: pb_bytes(2, pb_varint(1, n))))),
    st.lists(st.one_of(
        st.builds(pb_bytes, st.just(1), mutated(item)),
        st.builds(lambda n: pb_bytes(2, pb_varint(1, n)), steps_i64),
        any_field,
    ), max_size=5).map(b"".join),
)
run_record = st.lists(st.one_of(st.builds(pb_bytes, st.sampled_from((1, 8)), tags), any_field),
                      max_size=3).map(b"".join)
wandb_records = st.lists(st.one_of(
    st.builds(pb_bytes, st.just(2), history),
    st.builds(pb_bytes, st.just(2), mutated(history)),
    st.builds(pb_bytes, st.just(17), mutated(run_record)),
    st.builds(pb_bytes, st.just(99), st.integers(0, 70_000).map(lambda n: b"p" * n)),  # blocks
    messages,
), max_size=5)
wandb_files = st.one_of(
    wandb_records.map(wandb_file_of),
    mutated(wandb_records.map(wandb_file_of)),
    st.builds(lambda h, rest: h + rest, st.sampled_from((
        wandb_file.HEADER, b":W&B\xe1\xbe\x01", b":W&B", b"", b"\0" * 7)), st.binary(max_size=64)),
)


def check_wandb(data: bytes, at_start: bool, offset: int) -> wandb_file.Read | None:
    try:
        read = wandb_file.read_records(data, at_start=at_start, offset=offset)
    except wandb_file.FormatError:
        return None
    assert type(read.consumed) is int and 0 <= read.consumed <= len(data)
    assert type(read.corrupt) is int and read.corrupt >= 0
    assert read.run_name is None or type(read.run_name) is str
    for row in read.rows:
        assert type(row["step"]) is int
        assert "time" not in row or (type(row["time"]) is float and math.isfinite(row["time"]))
        for name, value in row.items():
            assert type(name) is str
            if name not in ("step", "time"):
                assert type(value) in (int, float), (name, value)
    rest = wandb_file.read_records(data[read.consumed:], at_start=at_start and read.consumed == 0,
                                   offset=offset + read.consumed)
    assert (rest.rows, rest.consumed, rest.corrupt) == ([], 0, 0)
    return read


def _history_of(key: bytes, value: bytes, step: int | None = 1) -> bytes:
    step_field = pb_bytes(2, pb_varint(1, step)) if step is not None else b""
    return pb_bytes(2, pb_bytes(1, pb_bytes(1, key) + pb_bytes(16, value)) + step_field)


# A chunk whose checksum fails, in a block not whole yet: it was skipped to the next block, past
# the bytes read (consumed 32768 of 26), and the caller's offset past the file's end.
CORRUPT_IN_OPEN_BLOCK = (wandb_file.HEADER + struct.pack("<IHB", 0xDEADBEEF, 1, wandb_file.FULL)
                         + b"x" + b"\x01" * 11)


def test_a_record_longer_than_a_turn_is_read_in_one_turn_never_stalls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn that read less than its first record consumed nothing and came back to it forever:
    a turn reads at least one record of the longest a reader takes."""
    from grpo_monitor.runtime.loggers import sources

    monkeypatch.setattr(sources, "_WHOLE_RECORD_BYTES", 4096)
    long_row = wandb_file_of([_history_of(b"loss", b"0.5", 1),
                              _history_of(b"x" * 3000, b"1.0", 2), _history_of(b"loss", b"0.25", 3)])
    path = tmp_path / "r" / "run-abc.wandb"
    path.parent.mkdir()
    path.write_bytes(long_row)
    rows: list[Any] = []
    files = LoggerFiles(tmp_path, lambda _p, _r, row, _m: rows.append(row), lambda *_: None)
    assert files.process(path, "wandb", 16) is False  # one turn, the whole file
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_a_wandb_record_longer_than_the_reader_takes_is_skipped_and_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wandb_file, "MAX_RECORD_BYTES", BLOCK)
    data = wandb_file_of([_history_of(b"loss", b"0.5", 1), _history_of(b"x" * (3 * BLOCK), b"1", 2),
                          _history_of(b"loss", b"0.25", 3)])
    read = wandb_file.read_records(data, at_start=True, offset=0)
    assert [r["step"] for r in read.rows] == [1, 3] and read.corrupt == 1
    assert read.consumed == len(data)


def test_a_float32_scalar_is_the_decimal_logged_a_double_keeps_its_digits() -> None:
    summary = (pb_bytes(1, pb_bytes(1, b"f32") + pb_fixed32(2, f32_bits(0.1)))
               + pb_bytes(1, pb_bytes(1, b"f64") + pb_bytes(8, pb_varint(1, 2) + pb_bytes(
                   6, struct.pack("<d", 0.123456789012))) + pb_bytes(9, pb_bytes(1, pb_bytes(
                       1, b"scalars")))))
    event, _ = tensorboard.decode_event(pb_varint(2, 7) + pb_bytes(5, summary))
    assert event is not None and event.scalars == {"f32": 0.1, "f64": 0.123456789012}


@fuzz(300)
@given(data=wandb_files, offset=st.sampled_from((0, 0, 1, BLOCK - 3)))
@example(data=CORRUPT_IN_OPEN_BLOCK, offset=0)
# A value nested 5000 deep: json.loads raised RecursionError, which is no ValueError.
@example(data=wandb_file_of([_history_of(b"loss", DEEP_JSON)]), offset=0)
# A _timestamp beyond float's range: math.isfinite raised OverflowError.
@example(data=wandb_file_of([_history_of(b"_timestamp", b"1" + b"0" * 400)]), offset=0)
# A row with no step of its own and "_step": true: a bool was its step.
@example(data=wandb_file_of([_history_of(b"_step", b"true", None)]), offset=0)
def test_a_wandb_file_gives_typed_rows_or_a_format_error(data: bytes, offset: int) -> None:
    read = check_wandb(data, offset == 0, offset)
    if data == wandb_file_of([_history_of(b"_step", b"true", None)]):
        assert read is not None and read.rows == []


@fuzz(200)
@given(data=st.one_of(wandb_records.map(wandb_file_of), mutated(wandb_records.map(wandb_file_of))),
       at=st.floats(0, 1))
def test_a_wandb_file_reads_alike_in_one_piece_or_two(data: bytes, at: float) -> None:
    whole = check_wandb(data, True, 0)
    if whole is None:
        return
    first = check_wandb(data[:int(len(data) * at)], True, 0)
    assert first is not None
    second = check_wandb(data[first.consumed:], first.consumed == 0, first.consumed)
    assert second is not None
    assert repr(first.rows + second.rows) == repr(whole.rows)
    assert first.consumed + second.consumed == whole.consumed
    assert first.corrupt + second.corrupt == whole.corrupt
    assert (second.run_name or first.run_name) == whole.run_name


def test_a_corrupt_chunk_in_the_block_being_written_is_skipped_once(tmp_path: Path) -> None:
    """Through LoggerFiles: the file was read again from its start at each turn (its offset past
    its end looked like a rewrite), its rows applied again."""
    path = tmp_path / "run" / FILE_NAMES["wandb"]
    path.parent.mkdir()
    data = wandb_file_of([_history_of(b"loss", b"1", 1)]) + CORRUPT_IN_OPEN_BLOCK[7:]
    path.write_bytes(data)
    rows: list[dict[str, Any]] = []
    reasons: list[str] = []
    files = LoggerFiles(tmp_path, lambda _p, _run, row, _m: rows.append(row),
                        lambda _p, reason, _d: reasons.append(reason))
    for _ in range(3):
        files.process(path, "wandb", None)
    assert [row["step"] for row in rows] == [1] and reasons == []
    data += b"\x01" * (BLOCK - len(data))  # the block is whole, the next one holds a record
    path.write_bytes(data + wandb_log([_history_of(b"loss", b"2", 2)], start=len(data)))
    files.process(path, "wandb", None)
    files.process(path, "wandb", None)
    assert [row["step"] for row in rows] == [1, 2] and reasons == ["corrupt_record"]


row_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(
    lambda k: not k.startswith("_") and "/" not in k)


@fuzz(100)
@given(rows=st.lists(st.tuples(st.integers(*INT64), st.dictionaries(
    row_names, st.floats() | st.integers(-10**20, 10**20), max_size=3)), max_size=4),
    name=st.none() | row_names, pad=st.integers(0, 40_000))
def test_rows_written_are_read_back(rows: list[tuple[int, dict[str, float]]], name: str | None,
                                    pad: int) -> None:
    records = [pb_bytes(99, b"p" * pad)]
    if name is not None:
        records.append(pb_bytes(17, pb_bytes(1, b"id") + pb_bytes(8, name.encode())))
    for step, row in rows:
        items = b"".join(pb_bytes(1, pb_bytes(1, k.encode()) + pb_bytes(16, json.dumps(v).encode()))
                         for k, v in row.items())
        records.append(pb_bytes(2, items + pb_bytes(2, pb_varint(1, step))))
    data = wandb_file_of(records)
    read = check_wandb(data, True, 0)
    assert read is not None and (read.consumed, read.corrupt) == (len(data), 0)
    assert repr(read.rows) == repr([{"step": step, **row} for step, row in rows])
    assert read.run_name == (name if name is not None else None)


# -- MLflow's and Trackio's databases ----------------------------------------------------------


class BadText(bytes):
    """Bytes stored as TEXT: no UTF-8, which Python's sqlite3 cannot decode."""


plain_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
cells = st.one_of(
    st.none(), st.integers(*INT64), st.sampled_from(INT64), st.floats(),
    st.sampled_from(("NaN", "Infinity", "-Infinity", "1e999", "12", "-3", "1.5", "", "locked",
                     "database is locked", "2025-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00",
                     "9999-12-31T23:59:59-14:00")),
    plain_text, st.binary(max_size=12), st.binary(min_size=1, max_size=8).map(BadText),
    st.binary(min_size=1, max_size=4).map(lambda b: BadText(b"\xff locked " + b)),
)


def often(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return weighted((3, valid), (1, cells))


mlflow_metric = st.fixed_dictionaries({
    "key": often(st.sampled_from(("loss", "reward/mean", "kl", ""))),
    "value": often(st.floats() | st.sampled_from((1.7976931348623157e308,
                                                   -1.7976931348623157e308))),
    "timestamp": often(st.integers(0, 1 << 42)), "step": often(st.integers(-5, 10**6)),
    "is_nan": often(st.sampled_from((0, 1))), "run_uuid": often(st.sampled_from(("u1", "u2"))),
})
mlflow_run = st.fixed_dictionaries({
    "run_uuid": often(st.sampled_from(("u1", "u2"))),
    "name": often(st.sampled_from(("a", "", "b"))),
    "lifecycle_stage": often(st.just("active"))})
trackio_metric = st.fixed_dictionaries({
    "timestamp": often(st.sampled_from(("2025-01-01T00:00:00", "2025-01-01T00:00:00Z", "x"))),
    "run_name": often(st.sampled_from(("a", "b"))), "step": often(st.integers(-5, 10**6)),
    "metrics": often(st.one_of(
        st.lists(st.tuples(names, values), max_size=4).map(json_object),
        json_text, st.sampled_from((DEEP_JSON.decode(), '{"a": "NaN", "b": "Infinity"}',
                                    '{"a": 1' + "0" * 400 + "}", "[1]", "null"))))})
MLFLOW_COLUMNS = {"key": "VARCHAR(250)", "value": "FLOAT", "timestamp": "BIGINT", "step": "BIGINT",
                  "is_nan": "BOOLEAN", "run_uuid": "VARCHAR(32)"}
TRACKIO_COLUMNS = {"timestamp": "TEXT", "run_name": "TEXT", "step": "INTEGER", "metrics": "TEXT"}
SCHEMAS = ("mlflow", "mlflow-untyped", "mlflow-without-rowid", "mlflow-missing-column", "trackio",
           "trackio-untyped-id", "trackio-missing-column", "random", "corrupt", "bytes")
databases_spec = st.fixed_dictionaries({
    "schema": st.sampled_from(SCHEMAS),
    "mlflow": st.lists(mlflow_metric, max_size=6), "runs": st.lists(mlflow_run, max_size=3),
    "trackio": st.lists(trackio_metric, max_size=6),
    "random": st.lists(st.tuples(st.sampled_from(("metrics", "runs", "experiments", "other")),
                                 st.lists(st.sampled_from(("id", "key", "value", "step", "run_name",
                                                           "metrics", "timestamp", "x")),
                                          min_size=1, max_size=4, unique=True),
                                 st.lists(cells, max_size=4)), max_size=3),
    "ids": st.lists(cells, min_size=6, max_size=6),
    "bad_text": weighted((3, st.just(False)), (1, st.just(True))),
    "noise": st.binary(max_size=256), "at": st.floats(0, 1),
})


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any],
            bad_text: bool = True) -> None:
    """One row; BadText as TEXT that is no UTF-8, or (``bad_text`` False) as a blob."""
    marks = ", ".join("CAST(? AS TEXT)" if isinstance(v, BadText) and bad_text else "?"
                      for v in row.values())
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})",
                 [bytes(v) if isinstance(v, BadText) else v for v in row.values()])


def build_database(path: Path, spec: dict[str, Any]) -> None:
    schema = spec["schema"]
    if schema == "bytes":
        path.write_bytes(spec["noise"])
        return
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")  # a test's file: no fsync at each commit
    try:
        if schema.startswith("mlflow") or schema == "corrupt":
            columns = dict(MLFLOW_COLUMNS)
            if schema == "mlflow-missing-column":
                columns.pop("is_nan")
            typed = schema != "mlflow-untyped"
            cols = ", ".join(f"{c} {t if typed else ''}" for c, t in columns.items())
            tail = ", PRIMARY KEY (key, step, run_uuid)) WITHOUT ROWID" \
                if schema == "mlflow-without-rowid" else ")"
            conn.execute("CREATE TABLE experiments (experiment_id INTEGER)")
            conn.execute("CREATE TABLE runs (run_uuid VARCHAR(32), name VARCHAR(250), "
                         "lifecycle_stage VARCHAR(20))")
            conn.execute(f"CREATE TABLE metrics ({cols}{tail}")
            for run in spec["runs"]:
                _insert(conn, "runs", run, spec["bad_text"])
            for row in spec["mlflow"]:
                try:
                    _insert(conn, "metrics", {c: v for c, v in row.items() if c in columns},
                            spec["bad_text"])
                except sqlite3.IntegrityError:
                    pass  # a NULL or repeated primary key of the WITHOUT ROWID table
        elif schema.startswith("trackio"):
            columns = dict(TRACKIO_COLUMNS)
            if schema == "trackio-missing-column":
                columns.pop("timestamp")
            key = "id" if schema == "trackio-untyped-id" else "id INTEGER PRIMARY KEY AUTOINCREMENT"
            cols = ", ".join(f"{c} {t}" for c, t in columns.items())
            conn.execute(f"CREATE TABLE metrics ({key}, {cols})")
            for i, row in enumerate(spec["trackio"]):
                row = {c: v for c, v in row.items() if c in columns}
                if schema == "trackio-untyped-id":
                    row["id"] = spec["ids"][i]
                _insert(conn, "metrics", row, spec["bad_text"])
        else:
            for i, (table, columns, row) in enumerate(spec["random"]):
                conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)})")
                if row:
                    try:
                        _insert(conn, table, dict(zip(columns, row)), spec["bad_text"])
                    except sqlite3.OperationalError:
                        pass  # a table made before with other columns
        conn.commit()
    finally:
        conn.close()
    if schema == "corrupt":
        data = bytearray(path.read_bytes())
        at = 100 + int((len(data) - 100) * spec["at"])
        data[at:at + len(spec["noise"])] = spec["noise"]
        path.write_bytes(bytes(data))


def check_database(path: Path, limit: int | None) -> list[tuple[str, dict[str, Any]]] | None:
    """read_new's contract, page by page to the end; the rows read."""
    cursor: dict[str, Any] = {}
    rows: list[tuple[str, dict[str, Any]]] = []
    for _ in range(50):
        try:
            read = databases.read_new(path, cursor, limit)
        except (databases.FormatError, databases.NotALoggerDatabase):
            return None
        assert read.fmt in ("mlflow", "trackio") and type(read.more) is bool
        assert isinstance(read.cursor, dict)
        for run, row in read.rows:
            assert type(run) is str and type(row) is dict
            assert row["step"] is None or type(row["step"]) is int
            for name, value in row.items():
                assert type(name) is str
                if name == "time":
                    assert type(value) is float
                elif name != "step":
                    assert type(value) in (int, float), (name, value)
        rows += read.rows
        cursor = read.cursor
        if not read.more:
            break
    else:
        raise AssertionError("50 pages of a few rows, and still more: the cursor does not move")
    again = databases.read_new(path, cursor, limit)
    assert again.rows == [] and not again.more  # read to its end: nothing new
    return rows


@fuzz(150)
@given(spec=databases_spec, limit=st.sampled_from((None, 1, 3)))
def test_a_database_gives_typed_rows_or_its_documented_errors(
        tmp_path_factory: pytest.TempPathFactory, spec: dict[str, Any], limit: int | None) -> None:
    folder = tmp_path_factory.mktemp("db", numbered=True)
    path = folder / "mlflow.db"
    build_database(path, spec)
    check_database(path, limit)
    shutil.rmtree(folder)


def _database_with(tmp_path: Path, schema: str, **rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / f"{next(_serial)}.db"
    build_database(path, {"schema": schema, "mlflow": [], "runs": [], "trackio": [], "random": [],
                          "ids": [], "bad_text": True, "noise": b"", "at": 0.0, **rows})
    return path


MLFLOW_ROW = {"key": "loss", "value": 0.5, "timestamp": 1000, "step": 1, "is_nan": 0,
              "run_uuid": "u1"}


@pytest.mark.parametrize("change", [
    # int(None), int("x"), None / 1000.0, None >= float, int(inf): TypeError, ValueError and
    # OverflowError escaped the reader, and the scan, at the first of these rows.
    {"step": None}, {"step": "x"}, {"step": b"\x01"}, {"step": math.inf}, {"timestamp": None},
    {"timestamp": "soon"}, {"value": None}, {"value": "high"}, {"value": b"\x00"}, {"key": None},
    {"key": 7}, {"run_uuid": None}, {"is_nan": "yes"},
], ids=lambda change: repr(change)[:40])
def test_an_mlflow_row_of_wrong_types_is_left_out_or_counted(tmp_path: Path,
                                                              change: dict[str, Any]) -> None:
    path = _database_with(tmp_path, "mlflow-untyped", runs=[{"run_uuid": "u1", "name": "a",
                                                             "lifecycle_stage": "active"}],
                          mlflow=[{**MLFLOW_ROW, "step": 0}, {**MLFLOW_ROW, **change},
                                  {**MLFLOW_ROW, "step": 2}])
    rows = check_database(path, None)
    assert rows is not None
    steps = [row["step"] for _, row in rows]
    assert steps[0] == 0 and steps[-1] == 2 and all(run == "a" for run, _ in rows)


@pytest.mark.parametrize("change", [
    # int(inf), int("x"), int(b"\x01"): OverflowError and ValueError escaped the reader; json.loads
    # of a value nested 5000 deep, RecursionError.
    {"step": math.inf}, {"step": "x"}, {"step": b"\x01"}, {"metrics": DEEP_JSON.decode()},
    {"metrics": BadText(b'{"a": 1}\xff')}, {"timestamp": "0001-01-01T00:00:00+14:00"},
    {"run_name": None},
], ids=lambda change: repr(change)[:40])
def test_a_trackio_row_of_wrong_types_is_left_out_or_counted(tmp_path: Path,
                                                              change: dict[str, Any]) -> None:
    good = {"timestamp": "2025-01-01T00:00:00", "run_name": "a", "metrics": '{"loss": 1}'}
    path = _database_with(tmp_path, "trackio", trackio=[{**good, "step": 0}, {**good, **change},
                                                         {**good, "step": 2}])
    rows = check_database(path, None)
    if rows is None:  # the whole file is unreadable: counted once (no UTF-8 text)
        assert isinstance(change.get("metrics"), BadText)
        return
    assert rows[0][1]["step"] == 0 and rows[-1][1]["step"] == 2


def test_a_table_of_text_ids_among_numbers_is_read_page_by_page(tmp_path: Path) -> None:
    """Whether the rows went back was asked of Python ("a" < 1: TypeError), the pages of SQLite,
    which orders text after numbers."""
    good = {"timestamp": "2025-01-01T00:00:00", "run_name": "a", "metrics": '{"loss": 1}'}
    path = _database_with(tmp_path, "trackio-untyped-id", ids=[1, "x"],
                          trackio=[{**good, "step": 1}, {**good, "step": 2}])
    rows = check_database(path, 1)
    assert rows is not None and [row["step"] for _, row in rows] == [1, 2]


def test_text_that_says_locked_is_no_busy_database(tmp_path: Path) -> None:
    """A cell of no UTF-8 whose text holds "locked": sqlite3's message quotes it, and the reader
    took the file for one its writer held, to be read again at every turn and never counted."""
    path = _database_with(tmp_path, "trackio", trackio=[{
        "timestamp": "2025-01-01T00:00:00", "run_name": BadText(b"\xff locked"), "step": 1,
        "metrics": '{"loss": 1}'}])
    with pytest.raises(databases.FormatError):
        databases.read_new(path, {}, None)


# -- the row converters ------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**400, 10**400), st.integers(-10, 10),
              st.floats(), st.sampled_from((10**400, -10**400, 1.7976931348623157e308, 1e-320)),
              st.text(max_size=10),
              st.sampled_from(("12", "1.5", "nan", "12/500", " 3 /9", "x/y", "2025-01-01T00:00:00",
                               "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"))),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids,
                                                                      max_size=4)),
    max_leaves=12)
ROW_FIELDS = ("step", "_step", "global_step", "current_steps", "training_step",
              "global_step/max_steps", "time", "_timestamp", "timestamp", "recorded_at", "metrics",
              "data", "loss", "reward", "elapsed_time", "total_steps")
rows_ = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(ROW_FIELDS), st.sampled_from(NAMES),
                              st.text(max_size=6)), json_values, max_size=6),
    json_values)


def check_row(row: Any, out: Any) -> None:
    if out is row:
        return  # handed back as it is, for the record parser to count
    assert type(out) is dict and type(out["step"]) is int
    assert "time" not in out or (type(out["time"]) is float and math.isfinite(out["time"]))
    for name, value in out.items():
        assert type(name) is str
        if name not in ("step", "time"):
            assert type(value) in (int, float, str, dict), (name, value)


@fuzz(400)
@given(row=rows_)
# A time beyond float's range: math.isfinite(10**400) raised OverflowError.
@example(row={"step": 1, "time": 10**400})
def test_a_framework_row_becomes_a_typed_record_or_stays_as_it_was(row: Any) -> None:
    check_row(row, as_snapshot_row(row))


@fuzz(200)
@given(document=st.one_of(
    json_values, st.lists(rows_, max_size=5),
    st.fixed_dictionaries({"log_history": st.lists(rows_, max_size=5) | json_values})))
def test_a_whole_log_gives_records_in_step_order(document: Any) -> None:
    out = log_rows(document)
    state = trainer_state_rows(document)
    assert isinstance(state, list)
    if out is None:
        return
    assert isinstance(out, list)
    for row in out:
        check_row(None, row)
    steps = [row["step"] for row in out]
    assert steps == sorted(set(steps))


CSV_CELLS = ("step", "Step", "global_step", "run_name", "metric", "key", "value", "name",
             "run - loss", "run - loss__MIN", "x", "", " 1 ", "1.5", "nan", "-inf", "1e999", "-1",
             "2.0", "\ufeffstep", '"', '""', "\x00", "\r", "a\r\nb", "é", "\ud800")
csv_cell = st.one_of(st.sampled_from(CSV_CELLS), st.text(max_size=6),
                     st.integers(-3, 10**6).map(str), st.floats().map(str))
csv_text = st.one_of(
    st.builds(lambda header, body, sep, bom: bom + sep.join(
        [",".join(header)] + [",".join(r) for r in body]),
        st.lists(csv_cell, min_size=1, max_size=4),
        st.lists(st.lists(csv_cell, max_size=5), max_size=6),
        st.sampled_from(("\n", "\r\n", "\r")), st.sampled_from(("", "\ufeff"))),
    st.text(max_size=64),
    st.sampled_from(("step,a\n1," + "x" * 200_000 + "\n2,3\n", 'step,a\n1,"' + "x" * 200_000,
                     "step,a\n1,2\r3\n4,5\n", "step,a\n1,\x002\n")),
)


@fuzz(300)
@given(text=csv_text)
# A cell over csv's field limit (128 KiB), a carriage return inside a cell: csv.Error escaped.
@example(text="step,a\n1," + "x" * 200_000 + "\n2,3\n")
@example(text="step,a\n1,2\r3\n4,5\n")
def test_a_csv_table_gives_typed_values_or_none(text: str) -> None:
    table = csv_table(text)
    if table is None:
        return
    for run, steps in table.items():
        assert run is None or type(run) is str
        for step, metrics in steps.items():
            assert type(step) is int and step >= 0
            assert all(type(k) is str and type(v) is float for k, v in metrics.items())
    if text == "step,a\n1," + "x" * 200_000 + "\n2,3\n":
        assert table == {None: {2: {"a": 3.0}}}  # the row of the huge cell alone is left out


def test_a_csv_tables_byte_order_mark_is_no_part_of_its_step_column() -> None:
    """Excel's "CSV UTF-8" begins with one: the table was taken for a CSV of something else."""
    assert csv_table("\ufeffStep,loss\r\n1,0.5\r\n") == {None: {1: {"loss": 0.5}}}


sample_values = st.one_of(
    json_values, st.lists(st.floats() | st.integers(-10**400, 10**400), max_size=1),
    st.lists(st.lists(st.integers(0, 1) | json_values, max_size=6), max_size=1),
    st.sampled_from((1e308, -1e308, 1.7976931348623157e308, 10**400, [10**400], [[10**400]])))
sample_rows = st.one_of(
    st.fixed_dictionaries({}, optional={"rewards": sample_values, "advantages": sample_values,
                                        "token_loss_mask": sample_values, "text": json_values}),
    json_values)


def check_samples(rows: list[Any], step: int) -> dict[str, Any]:
    samples = StepSamples()
    for row in rows:
        assert samples.add(row) is isinstance(row, dict)
    out = samples.row(step)
    assert out["step"] == step and samples.samples == sum(isinstance(r, dict) for r in rows)
    for name, value in out.items():
        if name != "step":
            assert type(value) is float and math.isfinite(value), (name, value)
    if "group/zero_std_frac" in out:
        assert 0 <= out["group/zero_std_frac"] <= 1
    if "reward/min" in out:
        assert out["reward/min"] <= out["reward/max"]
    return out


@fuzz(300)
@given(rows=st.lists(sample_rows, max_size=6), step=st.integers(0, 10**6))
# A reward beyond float's range: math.isfinite raised OverflowError; so did a mask's sum.
@example(rows=[{"rewards": 10**400}, {"token_loss_mask": [[10**400]]}], step=3)
# Two rewards near float's max: statistics.fmean's sum overflowed (OverflowError).
@example(rows=[{"rewards": 1e308}, {"rewards": 1e308}], step=3)
# A mask of infinities: a length of inf, a mean of NaN.
@example(rows=[{"token_loss_mask": [math.inf]}, {"token_loss_mask": [-math.inf]}], step=3)
def test_a_steps_samples_give_finite_statistics(rows: list[Any], step: int) -> None:
    check_samples(rows, step)


def test_huge_rewards_keep_their_mean() -> None:
    out = check_samples([{"rewards": 1e308}, {"rewards": 1e308}, {"rewards": 1e308}], 1)
    assert out["reward/mean"] == 1e308 and out["reward/min"] == out["reward/max"] == 1e308


# -- the key map ---------------------------------------------------------------------------------

CANONICAL = sorted(SIGNALS_BY_KEY)
toml_keys = st.one_of(st.sampled_from(NAMES).map(json.dumps),
                      st.sampled_from(("a", "b.c", "x-y", "1")),
                      st.text(max_size=6))
toml_scalars = st.one_of(
    st.sampled_from(CANONICAL).map(json.dumps),
    st.sampled_from(("false", "true", "0", "-0.0", "nan", "inf", "-inf", "1e999", "0.25",
                     "1" + "0" * 400, "1" + "0" * 5000, "0x10", "1979-05-27")),
    st.text(max_size=6).map(json.dumps), st.floats().map(repr), st.integers().map(str))
toml_values = st.recursive(
    toml_scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3).map(lambda v: "[" + ", ".join(v) + "]"),
        st.lists(st.tuples(st.sampled_from(("key", "scale", "other", '"key"')) | toml_keys, kids),
                 max_size=3).map(lambda kv: "{ " + ", ".join(f"{k} = {v}" for k, v in kv) + " }")),
    max_leaves=8)
toml_names = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=8).map(
    lambda n: json.dumps(n, ensure_ascii=False)),
                       st.sampled_from(("a", "b.c", "x-y", "1")))
toml_lines = weighted(
    (5, st.builds(lambda n, k: f"{n} = {json.dumps(k)}", toml_names, st.sampled_from(CANONICAL))),
    (2, st.builds(lambda n, k, scale: f"{n} = {{ key = {json.dumps(k)}, scale = {scale} }}",
                  toml_names, st.sampled_from(CANONICAL),
                  st.one_of(st.floats().map(repr), toml_scalars))),
    (1, toml_names.map(lambda n: f"{n} = false")),
    (1, st.tuples(toml_keys, toml_values).map(lambda kv: f"{kv[0]} = {kv[1]}")),
    (1, st.one_of(toml_keys.map(lambda k: f"[{k}]"), st.text(max_size=12))),
)
toml_text = st.one_of(
    st.lists(toml_lines, max_size=5, unique_by=lambda line: line.split(" = ")[0]).map("\n".join),
    st.sampled_from(("a = " + "[" * 20000, "a = " + "{b=" * 20000, "a = 1" + "0" * 5000,
                     '"n" = { key = "reward/mean", scale = 1' + "0" * 400 + " }",
                     '"n" = { key = "reward/mean", scale = 0 }',
                     '"n" = { key = "reward/mean", 1 = 2 }',
                     "\n".join(f'"k{i}" = "reward/mean"' for i in range(3000)))),
)
toml_bytes = st.one_of(toml_text.map(encode), st.binary(max_size=64),
                       st.builds(lambda t, b: encode(t) + b, toml_text,
                                 st.binary(min_size=1, max_size=4)))


def check_key_map(make: Callable[[], KeyMap]) -> KeyMap | None:
    try:
        km = make()
    except KeyMapError:
        return None
    assert isinstance(km, KeyMap)
    for name, target in km.names.items():
        assert type(name) is str and isinstance(target, Target)
        assert target.key is None or target.key in SIGNALS_BY_KEY
        assert type(target.scale) is float and math.isfinite(target.scale) and target.scale != 0
    return km


@fuzz(300)
@given(text=st.one_of(toml_text, toml_bytes))
# An integer of 5000 digits: tomllib's int() raised ValueError, no TOMLDecodeError.
@example(text="a = 1" + "0" * 5000)
# A scale beyond float's range: math.isfinite raised OverflowError.
@example(text='"n" = { key = "reward/mean", scale = 1' + "0" * 400 + " }")
def test_a_key_map_file_parses_or_raises_key_map_error(text: str | bytes) -> None:
    check_key_map(lambda: KeyMap.parse(text, "k"))


mapping_keys = st.one_of(st.sampled_from(("key", "scale")), st.text(max_size=6), st.integers(),
                         st.none(), st.tuples(st.integers()), st.booleans())
mapping_values = st.recursive(
    st.one_of(st.sampled_from(CANONICAL), st.none(), st.booleans(), st.integers(-10**400, 10**400),
              st.floats(), st.text(max_size=6), st.binary(max_size=4),
              st.sampled_from((10**400, 0, 0.25, float("nan")))),
    lambda kids: st.one_of(st.lists(kids, max_size=3),
                           st.dictionaries(mapping_keys, kids, max_size=3)),
    max_leaves=10)


@fuzz(300)
@given(raw=st.dictionaries(mapping_keys, mapping_values, max_size=5))
# A line's unknown fields of several types: sorted() raised TypeError naming them.
@example(raw={"n": {1: 2, "a": 3}})
# A name that is no text (a mapping the SDK takes): no name logged can match it.
@example(raw={1: "reward/mean"})
def test_a_key_map_mapping_gives_a_key_map_or_key_map_error(raw: dict[Any, Any]) -> None:
    check_key_map(lambda: KeyMap.from_mapping(raw))


# -- LoggerFiles, the runtime's front of the readers ---------------------------------------------

FILE_NAMES = {"tensorboard": "events.out.tfevents.1.h", "wandb": "run-abc.wandb",
              "mlflow": "mlflow.db", "trackio": "proj.db", "csv": "metrics.csv",
              "samples": "train_data_step3.jsonl"}


def database_bytes(spec: dict[str, Any]) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.db"
        build_database(path, spec)
        return path.read_bytes()


def jsonl(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(r, default=repr).encode() + b"\n" for r in rows)


file_contents = {
    "tensorboard": st.one_of(tf_streams, mutated(tf_streams)),
    "wandb": wandb_files,
    "mlflow": databases_spec.map(database_bytes),
    "trackio": databases_spec.map(database_bytes),
    "csv": csv_text.map(encode),
    "samples": st.one_of(
        st.lists(sample_rows, max_size=6).map(jsonl),
        st.lists(st.one_of(st.lists(sample_rows, max_size=1).map(jsonl), st.binary(max_size=24)),
                 max_size=6).map(b"".join)),
}
fmt_and_bytes = st.sampled_from(sorted(FILE_NAMES)).flatmap(
    lambda fmt: st.tuples(st.just(fmt), st.one_of(file_contents[fmt], st.binary(max_size=200))))


def read_logger_file(root: Path, path: Path, fmt: str,
                     budget: int | None) -> tuple[list[Any], list[str]]:
    """``path`` read as the ingest reads it, ``budget`` bytes a turn, then flushed; (the rows
    applied, the reasons counted). Only OSError (safe_io's Refused among them) may escape."""
    rows: list[Any] = []
    reasons: list[str] = []
    files = LoggerFiles(root, lambda _p, run, row, _m: rows.append((run, row)),
                        lambda _p, reason, _d: reasons.append(reason))
    try:
        # A turn reads one record at least (sources._WHOLE_RECORD_BYTES): these small files are
        # read in one turn whatever the budget, and a second finds nothing left.
        files.process(path, fmt, budget)
        assert files.process(path, fmt, budget) is False
        files.flush_all()
    except OSError:
        pass
    return rows, reasons


@fuzz(200)
@given(fmt_data=fmt_and_bytes, budget=st.sampled_from((None, 1, 13, 64, 4096)))
# A double scalar beyond float32's range (float32_text: OverflowError out of process()).
@example(fmt_data=("tensorboard", HUGE_DOUBLE_SCALAR), budget=None)
# Rewards near float's max (flush_all: OverflowError out of StepSamples.row).
@example(fmt_data=("samples", b'{"rewards": 1e308}\n{"rewards": 1e308}\n'), budget=13)
def test_a_logger_file_of_any_bytes_is_read_or_counted(
        tmp_path_factory: pytest.TempPathFactory, fmt_data: tuple[str, bytes],
        budget: int | None) -> None:
    fmt, data = fmt_data
    root = tmp_path_factory.mktemp("loggers", numbered=True)
    path = root / "run" / FILE_NAMES[fmt]
    path.parent.mkdir()
    path.write_bytes(data)
    rows, reasons = read_logger_file(root, path, fmt, budget)
    assert set(reasons) <= ERROR_REASONS.keys(), reasons
    for run, row in rows:
        assert type(run) is str and type(row) is dict
        try:
            snap = parse_record(row, run=run, rank=0, mtime=1.0)
        except RecordError as exc:
            assert exc.reason in ERROR_REASONS
            continue
        assert {reason for reason, _ in snap.problems} <= ERROR_REASONS.keys()
    shutil.rmtree(root)


# -- the ingest as a whole -----------------------------------------------------------------------

GOOD_STEPS = 12
HOSTILE_NAMES = {**FILE_NAMES, "jsonl": "metrics.jsonl", "trainer_state": "trainer_state.json",
                 "key_map": ".grpo-keys.toml"}
hostile_contents = {
    **file_contents, "jsonl": st.lists(rows_, max_size=4).map(jsonl),
    "trainer_state": st.fixed_dictionaries({"log_history": st.lists(rows_, max_size=4)}).map(
        lambda d: json.dumps(d, default=repr).encode()),
    "key_map": toml_bytes}
hostile_folder = st.fixed_dictionaries(
    {}, optional={fmt: st.one_of(st.binary(max_size=200), hostile_contents[fmt])
                  for fmt in HOSTILE_NAMES})


class CountingHealth(ExporterHealth):
    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def error(self, path: Path, reason: str, detail: str) -> None:
        self.reasons.append(reason)
        super().error(path, reason, detail)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, dict[str, float]]:
    """A snapshot run's file as the SDK writes it, and the values the ingest reads of it alone."""
    root = tmp_path_factory.mktemp("good")
    writer = SnapshotWriter(root, "good", rank=0, world_size=1)
    for step in range(GOOD_STEPS):
        writer.log({"reward/mean": 0.1 * step, "kl/mean": 0.01 * step, "loss": 1.0 / (step + 1)},
                   step, timestamp=1_700_000_000.0 + step)
    writer.close(end=False)
    ingest = Ingestor(root, RunStore(), ExporterHealth())
    ingest.rescan()
    run = ingest.store.run_state("good")
    assert run is not None and run.ranks[0].logged_steps == GOOD_STEPS
    return Path(writer.path).name, Path(writer.path).read_bytes(), dict(run.ranks[0].values)


@fuzz(25)
@given(hostile=hostile_folder)
def test_a_folder_of_hostile_logger_files_leaves_the_run_beside_it_whole(
        good_run: tuple[str, bytes, dict[str, float]], hostile: dict[str, bytes]) -> None:
    name, data, values_read = good_run
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "good").mkdir()
        (root / "good" / name).write_bytes(data)
        (root / "bad").mkdir()
        for fmt, content in hostile.items():
            (root / "bad" / HOSTILE_NAMES[fmt]).write_bytes(content)
        health = CountingHealth()
        ingest = Ingestor(root, RunStore(), health)
        ingest.rescan()
        ingest.rescan()
        ingest.loggers.flush_all()
        run = ingest.store.run_state("good")
        assert run is not None and run.ranks[0].logged_steps == GOOD_STEPS
        assert ingest.store.max_step("good") == GOOD_STEPS - 1
        assert dict(run.ranks[0].values) == values_read
        assert set(health.reasons) <= ERROR_REASONS.keys(), health.reasons
