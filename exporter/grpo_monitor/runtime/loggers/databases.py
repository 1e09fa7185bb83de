"""MLflow's and Trackio's local SQLite databases: the metric rows added since the last read.

* **MLflow** (``mlflow.db``, the default store since MLflow 3.7; verl points it at
  ``/tmp/mlruns.db``): table ``metrics(key, value, timestamp [ms], step, is_nan, run_uuid)``,
  one row per (key, step); ``runs(run_uuid, name, lifecycle_stage)``. NaN is ``is_nan = 1``,
  ±Inf is stored as ±(the largest double). Rows are read by ``rowid``, which only grows.
* **Trackio** (``<TRACKIO_DIR>/<project>.db``): table ``metrics(id, timestamp [ISO],
  run_name, step, metrics [JSON text])``, one row per ``trackio.log`` call, NaN and ±Inf as the
  strings ``"NaN"``, ``"Infinity"``; read by ``id`` (AUTOINCREMENT).

Opened read-only (``mode=ro``) with the standard library's ``sqlite3``, one short query per
read: a reader never holds a lock between reads, and in WAL mode (Trackio's) never blocks the
writer. A database whose rows went back (restored from a copy, the file replaced) is read again
from its first row. Any other ``*.db`` file is none of ours (``NotALoggerDatabase``).
"""

from __future__ import annotations

import json
import math
import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["FormatError", "NotALoggerDatabase", "Read", "read_new"]

# MLflow writes ±Inf as ±sys.float_info.max.
_MLFLOW_INF = 1.7976931348623157e308
_TRACKIO_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
DEFAULT_LIMIT = 100_000
_TIMEOUT_S = 2.0


class NotALoggerDatabase(Exception):
    """A SQLite file (or no SQLite file) whose tables are neither MLflow's nor Trackio's."""


class FormatError(ValueError):
    """An MLflow or Trackio database that cannot be read (a schema it changed, a corrupt file)."""


@dataclass
class Read:
    fmt: str
    rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (run, flat record)
    cursor: dict[str, Any] = field(default_factory=dict)
    more: bool = False


def _connect(path: Path) -> sqlite3.Connection:
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=_TIMEOUT_S)


def _iso(text: Any) -> float | None:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def read_new(path: Path, cursor: dict[str, Any], limit: int | None = None) -> Read:
    """The rows added to the database at ``path`` since ``cursor`` (a previous Read's; {} at
    first), at most ``limit`` metric rows (``more`` says some are left)."""
    try:
        conn = _connect(path)
    except sqlite3.Error as exc:
        raise NotALoggerDatabase(str(exc)) from None
    try:
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:  # not SQLite at all, or encrypted
            raise NotALoggerDatabase(str(exc)) from None
        try:
            if {"metrics", "runs", "experiments"} <= tables:
                return _mlflow(conn, cursor, limit or DEFAULT_LIMIT)
            if "metrics" in tables and {"run_name", "metrics", "step"} <= _columns(conn, "metrics"):
                return _trackio(conn, cursor, limit or DEFAULT_LIMIT)
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                return Read("mlflow" if "experiments" in tables else "trackio", cursor=cursor,
                            more=True)  # the writer's turn: read at the next one
            raise FormatError(f"{exc}") from None
        except sqlite3.DatabaseError as exc:
            raise FormatError(f"{exc}") from None
        raise NotALoggerDatabase("tables of neither MLflow nor Trackio")
    finally:
        conn.close()


def _busy(exc: sqlite3.OperationalError) -> bool:
    """The writer holds the database (SQLITE_BUSY, SQLITE_LOCKED): not any message that says
    "locked" (sqlite3's error for a cell of no UTF-8 quotes the cell's text)."""
    name = getattr(exc, "sqlite_errorname", None)  # Python 3.11+
    if name is not None:
        return str(name).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    return str(exc).startswith(("database is locked", "database table is locked",
                                "database schema is locked"))


def _whole(value: Any) -> int | None:
    """A step cell as the int it holds; None for NULL, text, a blob, a fraction, ±inf: a
    user's file, whose columns (SQLite's) take any type whatever they are declared."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _went_back(conn: sqlite3.Connection, cursor: dict[str, Any], table: str, key: str) -> bool:
    # Compared by SQLite, as the pages are (ORDER BY, >): a user's table may hold text keys
    # among the numbers, which Python cannot order.
    last = cursor.get("last", 0)
    return bool(conn.execute(f"SELECT COALESCE(MAX({key}), 0) < ? FROM {table}",
                             (last,)).fetchone()[0])


def _page(conn: sqlite3.Connection, fmt: str, columns: str, key: str, cursor: dict[str, Any],
          limit: int) -> tuple[list[tuple[Any, ...]], Read]:
    """The metric rows past the cursor's (by ``key``, which only grows), ``limit`` at most,
    and the Read that will carry them; from the first row when the table's rows went back."""
    if _went_back(conn, cursor, "metrics", key):
        cursor = {}
    rows = conn.execute(f"SELECT {key}, {columns} FROM metrics WHERE {key} > ? ORDER BY {key} "
                        "LIMIT ?", (cursor.get("last", 0), limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, Read(fmt, cursor={"last": rows[-1][0] if rows else cursor.get("last", 0)},
                      more=more)


def _mlflow(conn: sqlite3.Connection, cursor: dict[str, Any], limit: int) -> Read:
    names = dict(conn.execute(
        "SELECT r.run_uuid, COALESCE(NULLIF(r.name, ''), r.run_uuid) FROM runs r").fetchall())
    rows, out = _page(conn, "mlflow", "run_uuid, step, key, value, is_nan, timestamp", "rowid",
                      cursor, limit)
    grouped: dict[tuple[str, int], dict[str, Any]] = {}
    for _, run_uuid, step, key, value, is_nan, timestamp in rows:
        # Any cell may hold any type (a user's file): a row of no run is left out, a step that
        # is no integer gives {"step": None} (counted by the record parser), a time that is no
        # number no time, a key that is no text or a value that is no number no value.
        run = names.get(run_uuid, run_uuid)
        if not isinstance(run, (str, int)):
            continue
        run, step, when = str(run), _whole(step), _finite(timestamp)
        record = grouped.get((run, step))
        if record is None:
            record = grouped[(run, step)] = {"step": step}
            out.rows.append((run, record))
        if when is not None:
            record["time"] = max(record.get("time", -math.inf), when / 1000.0)
        if not isinstance(key, str):
            continue
        if is_nan:
            value = math.nan
        elif not isinstance(value, (int, float)):
            continue
        elif value >= _MLFLOW_INF:
            value = math.inf
        elif value <= -_MLFLOW_INF:
            value = -math.inf
        record[key] = value
    return out


def _trackio(conn: sqlite3.Connection, cursor: dict[str, Any], limit: int) -> Read:
    rows, out = _page(conn, "trackio", "run_name, step, metrics, timestamp", "id", cursor, limit)
    for _, run_name, step, metrics, timestamp in rows:
        try:
            values = json.loads(metrics)
        except (ValueError, TypeError, RecursionError):  # RecursionError: nested thousands deep
            values = None
        step = _whole(step)  # text, a blob, a fraction, ±inf: no step
        if not isinstance(values, dict) or step is None:
            out.rows.append((str(run_name), {"step": None}))  # counted by the record parser
            continue
        record: dict[str, Any] = {"step": step}
        when = _iso(timestamp)
        if when is not None:
            record["time"] = when
        for key, value in values.items():
            if isinstance(value, str) and value in _TRACKIO_SPECIAL:
                value = _TRACKIO_SPECIAL[value]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                record[key] = value
        out.rows.append((str(run_name), record))
    return out
