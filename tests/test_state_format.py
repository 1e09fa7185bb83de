"""The saved state's format outlives the code (docs/state-format.md): a state written by an
earlier release (kept as a fixture) is restored by this one and serves what a full read serves;
a field added or dropped needs no migration, a changed one is migrated; a state that cannot be
used is set aside whole; a save encodes again only the ranks that changed."""

from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path

import pytest
import state_fixture

from grpo_monitor.runtime import state_codec
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import FileState, Ingestor
from grpo_monitor.runtime.saved_state import StateFile
from grpo_monitor.runtime.signals import KeyHistory, Welford
from grpo_monitor.runtime.store import RankState, RunStore
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools import simulate


def run_lines(store: RunStore) -> list[str]:
    store.flush()
    return [line for line in "".join(store.render()).splitlines() if '{run="' in line]


def full_read(root: Path) -> tuple[RunStore, Ingestor]:
    store = RunStore()
    ingestor = Ingestor(root, store, ExporterHealth())
    ingestor.rescan()
    store.flush()
    return store, ingestor


def restored(state_dir: Path, root: Path) -> RunStore:
    result, saved = StateFile(state_dir, root).load()
    assert result == "restored" and saved is not None
    store = RunStore()
    store.restore(saved.runs)
    return store


def fixtures() -> list[Path]:
    found = sorted(state_fixture.FIXTURES.glob("saved-state-schema-*"))
    assert state_fixture.folder(state_codec.SCHEMA) in found, (
        "no fixture of the current schema: run `python tests/state_fixture.py`")
    return found


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda p: p.name)
def test_a_state_an_earlier_release_saved_is_restored_as_a_full_read_would_serve_it(
        fixture: Path, tmp_path: Path) -> None:
    """The fixture was saved by the release that introduced its schema; this code restores it,
    and its runs' series are, line for line, those of this code reading the same files."""
    root = state_fixture.snapshots(fixture, tmp_path / "files")
    state_dir, saved_for = state_fixture.state(fixture, tmp_path / "state")
    fresh, _ = full_read(root)
    expected = run_lines(fresh)
    assert len(expected) > 500
    assert run_lines(restored(state_dir, saved_for)) == expected


def _job(root: Path, ranks: int = 3, steps: int = 60, run: str = "job") -> None:
    writers = [SnapshotWriter(root, run, rank=r, world_size=ranks) for r in range(ranks)]
    simulate.write_steps(writers, simulate.generate("healthy", steps=steps, ranks=ranks))
    for w in writers:
        w.close(end=False)


def test_fields_added_or_dropped_need_no_migration() -> None:
    """A field the state lacks takes the class's default; a field the code no longer has is
    ignored."""
    h = KeyHistory()
    h.put(5, 1.5, 20)
    doc = state_codec.pack(h)
    decoded = state_codec.Decoder(state_codec.SCHEMA).unpack(doc)
    assert repr(decoded) == repr(h)  # NaN == NaN by repr
    fields = state_codec.BY_NAME["key_history"].fields
    saved = {f: getattr(h, f) for f in fields if f != "rising"}
    saved["a_field_of_an_older_release"] = [1, 2, 3]
    old = state_codec.msgpack.ExtType(state_codec.EXT_OBJECT, state_codec.pack(["key_history", saved]))
    decoded = state_codec.Decoder(state_codec.SCHEMA).unpack(state_codec.pack(old))
    assert decoded.rising == KeyHistory().rising and list(decoded.values) == [1.5]
    assert not hasattr(decoded, "a_field_of_an_older_release")


def test_a_state_of_an_older_schema_is_migrated_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next schema changes what a saved field means: its migration rewrites the old fields
    as the state is decoded; a schema with no migration to this one, or a newer one, is unusable."""
    doc = state_codec.pack(Welford(n=3, mean=2.0, m2=8.0))
    monkeypatch.setattr(state_codec, "SCHEMA", state_codec.SCHEMA + 2)
    monkeypatch.setattr(state_codec, "MIGRATIONS", {
        state_codec.SCHEMA - 2: {"welford": lambda f: {**f, "m2": f["m2"] / 2}},  # say, m2 halved
        state_codec.SCHEMA - 1: {"welford": lambda f: {**f, "n": f["n"] * 10}},
    })
    assert state_codec.Decoder(state_codec.SCHEMA - 2).unpack(doc) == Welford(n=30, mean=2.0, m2=4.0)
    assert state_codec.Decoder(state_codec.SCHEMA - 1).unpack(doc) == Welford(n=30, mean=2.0, m2=8.0)
    for schema in (state_codec.SCHEMA - 3, state_codec.SCHEMA + 1):
        with pytest.raises(state_codec.UnusableState):
            state_codec.Decoder(schema)


def plain(obj: object) -> object:
    """An object of the state as nested plain values with their types, to compare (NaN too)."""
    known = state_codec.BY_CLASS.get(type(obj))
    if known is not None:
        return known.name, {f: plain(getattr(obj, f)) for f in known.fields}
    if isinstance(obj, dict):
        return type(obj).__name__, [(plain(k), plain(v)) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, deque)):
        return type(obj).__name__, [plain(v) for v in obj]
    return type(obj).__name__, repr(obj)


def test_every_kind_of_value_a_rank_holds_comes_back_as_it_was() -> None:
    """Tuples (as dict keys too), sets, deques with their bound, counters, names of any bytes,
    NaN: each field comes back of its declared type."""
    rank = RankState("r\udcffun", 3, placement=("host", "0", "0", ""))
    rank.unknown[("key", "math")] = float("nan")
    rank.nonfinite["loss"] += 2
    rank.counted.add("entropy/mean")
    for step in range(200):
        rank.note_pace(step, 1000.0 + step, 2000.0 + step)
        rank.signals.add(step, {"entropy/mean": 1.0 - step / 400, "reward/mean": step / 200}, False)
    back = state_codec.Decoder(state_codec.SCHEMA).unpack(state_codec.pack(rank))
    assert plain(back) == plain(rank)
    assert type(back.pace) is deque and back.pace.maxlen == rank.pace.maxlen
    assert isinstance(back.nonfinite, defaultdict) and back.nonfinite.default_factory is int
    assert type(back.signals.law.closed[0][2]) is list and type(back.steps_logged.runs[0]) is list
    back.render()
    rank.render()
    assert back.blocks == rank.blocks


def test_a_file_state_comes_back_with_its_path_of_any_bytes() -> None:
    files = {Path("/snaps/r\udcffun/rank-0.jsonl"): FileState(7, Path("/snaps/r\udcffun/rank-0.jsonl"), 10,
                                                           b"\n", signature=(1, 2))}
    assert state_codec.Decoder(state_codec.SCHEMA).unpack(state_codec.pack(files)) == files


def test_a_class_this_code_does_not_know_sets_the_state_aside_whole(tmp_path: Path) -> None:
    """A state naming a class of a newer release is stale, and nothing of it is used."""
    root = tmp_path / "snaps"
    _job(root)
    store, ingestor = full_read(root)
    state = StateFile(tmp_path / "state", root)
    original = state_codec.BY_CLASS[Welford]
    try:
        state_codec.BY_CLASS[Welford] = state_codec.StateClass("welford_of_a_newer_release", Welford, Welford)
        state.save(store, ingestor)
    finally:
        state_codec.BY_CLASS[Welford] = original
    assert StateFile(tmp_path / "state", root).load() == ("stale", None)


def test_a_save_encodes_only_the_ranks_that_changed_and_equals_a_whole_save(tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    writers = [SnapshotWriter(root, "job", rank=r, world_size=4) for r in range(4)]
    steps = list(simulate.generate("healthy", steps=40, ranks=4))
    simulate.write_steps(writers, steps[:30])
    store, ingestor = full_read(root)
    state = StateFile(tmp_path / "state", root)
    state.save(store, ingestor)
    assert state.encoded_last == 4
    state.save(store, ingestor)
    assert state.encoded_last == 0
    writers[2].log({"perf/step_time_s": 1.0}, step=31)
    ingestor.rescan()
    store.flush()
    state.save(store, ingestor)
    assert state.encoded_last == 1
    incremental = state.path.read_bytes()
    whole = StateFile(tmp_path / "whole", root)
    whole.save(store, ingestor)
    assert whole.encoded_last == 4
    assert run_lines(restored(tmp_path / "state", root)) == run_lines(restored(tmp_path / "whole", root)) \
        == run_lines(store)
    payload = lambda data: data.split(b"\n", 3)[3]  # noqa: E731 (the header holds the time)
    assert payload(incremental) == payload(whole.path.read_bytes())

