"""Protocol Buffers' wire format, the few parts the loggers' records need.

TensorBoard's events and W&B's records are protobuf messages. Their readers decode the handful
of fields they use by number (the schemas are fixed and documented), so that the exporter needs
neither the generated classes of ``tensorboard`` or ``wandb`` (heavy packages, the latter
shipping a Go binary) nor ``protobuf`` itself. Unknown fields are skipped, as protobuf does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

__all__ = ["WireError", "fields", "as_double", "as_float", "as_int64"]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are no protobuf message."""


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("a varint runs past the message")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            # A varint is 64 bits: the bits a tenth byte carries past them are dropped, as
            # protobuf's own parsers do (an int64 read from it stays an int64: as_int64).
            return result & _MASK64, pos
        shift += 7
        if shift > 63:
            raise WireError("a varint longer than 10 bytes")


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of one message as (number, wire type, value): an int for a varint or a fixed
    field (its raw bits), the bytes of a length-delimited one (a string, a sub-message, a packed
    array). WireError on bytes that end mid-field or use a group or unknown wire type."""
    pos, end = 0, len(data)
    while pos < end:
        tag = data[pos]
        if tag < 0x80:  # a one-byte tag (fields 1-15): the common case, inline
            pos += 1
        else:
            tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == FIXED64:
            if pos + 8 > end:
                raise WireError("a fixed64 runs past the message")
            yield number, wire, int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise WireError("a fixed32 runs past the message")
            yield number, wire, int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        elif wire == LENGTH:
            if pos < end and data[pos] < 0x80:
                size = data[pos]
                pos += 1
            else:
                size, pos = _varint(data, pos)
            if pos + size > end:
                raise WireError("a length-delimited field runs past the message")
            yield number, wire, bytes(data[pos:pos + size])
            pos += size
        else:
            raise WireError(f"wire type {wire} (groups are not used by these schemas)")


def as_double(bits: int) -> float:
    return struct.unpack("<d", bits.to_bytes(8, "little"))[0]


def as_float(bits: int) -> float:
    return struct.unpack("<f", bits.to_bytes(4, "little"))[0]


def as_int64(value: int) -> int:
    """A varint's value as the signed int64 it encodes (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value
