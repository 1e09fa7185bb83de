"""safe_io, the one way into the snapshot folder: what it refuses, without blocking, and what it
writes over without writing through. Real FIFOs, sockets, links and devices in a real folder."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from test_hostile_folder import finishes

from grpo_monitor.contract.safe_io import (
    NOT_REGULAR,
    SYMLINK,
    Refused,
    is_plain_folder,
    open_regular,
    printable,
    read_regular,
    replace_file,
    walk,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "run" / "ok.jsonl").write_bytes(b'{"step": 1}\n')
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.jsonl").write_bytes(b"secret\n")
    return root


def refused(root: Path, path: Path) -> str:
    """The reason ``path`` is refused with; the open must not block (a FIFO without a writer
    would hold a plain open forever)."""
    def read() -> str:
        with pytest.raises(Refused) as exc:
            read_regular(root, path, 100)
        return exc.value.reason

    return finishes(read)


def test_only_a_regular_file_reached_through_no_link_is_read(tree: Path) -> None:
    run = tree / "run"
    assert read_regular(tree, run / "ok.jsonl", 100) == b'{"step": 1}\n'
    assert read_regular(tree, run / "ok.jsonl", 3) == b'{"st'  # the limit, and one byte more
    os.mkfifo(run / "fifo.jsonl")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(run / "sock.jsonl"))
    (run / "dev.jsonl").symlink_to("/dev/zero")
    (run / "out.jsonl").symlink_to(tree.parent / "outside" / "secret.jsonl")
    (run / "in.jsonl").symlink_to("ok.jsonl")  # inside the tree: refused all the same
    (run / "loop.jsonl").symlink_to("loop.jsonl")
    (run / "dangling.jsonl").symlink_to("nothing")
    (tree / "linked").symlink_to(tree.parent / "outside", target_is_directory=True)
    assert {name: refused(tree, run / name) for name in (
        "fifo.jsonl", "sock.jsonl", "dev.jsonl", "out.jsonl", "in.jsonl", "loop.jsonl",
        "dangling.jsonl")} == {"fifo.jsonl": NOT_REGULAR, "sock.jsonl": NOT_REGULAR,
                               "dev.jsonl": SYMLINK, "out.jsonl": SYMLINK, "in.jsonl": SYMLINK,
                               "loop.jsonl": SYMLINK, "dangling.jsonl": SYMLINK}
    # A linked folder on the way is refused, whatever the file at its end.
    assert refused(tree, tree / "linked" / "secret.jsonl") == SYMLINK
    with pytest.raises(Refused):
        is_plain_folder(tree, tree / "linked")
    assert is_plain_folder(tree, run) and not is_plain_folder(tree, tree / "missing")
    with pytest.raises(IsADirectoryError):
        open_regular(tree, run)
    with pytest.raises(FileNotFoundError):
        open_regular(tree, run / "missing.jsonl")
    with pytest.raises(ValueError):  # not below the root, however it is spelt
        open_regular(tree, tree / "run" / ".." / ".." / "outside" / "secret.jsonl")


def test_a_folder_swapped_for_a_link_after_a_look_leads_nowhere(tree: Path) -> None:
    assert is_plain_folder(tree, tree / "run")
    (tree / "run").rename(tree / "run.old")
    (tree / "run").symlink_to(tree.parent / "outside", target_is_directory=True)
    assert refused(tree, tree / "run" / "secret.jsonl") == SYMLINK


def test_a_replace_writes_over_a_fifo_or_a_link_never_through_it(tree: Path) -> None:
    run = tree / "run"
    os.mkfifo(run / "fifo.json")
    (run / "link.json").symlink_to(tree.parent / "outside" / "secret.jsonl")
    for name in ("fifo.json", "link.json", "new.json"):
        replace_file(tree, run / name, b"{}\n")
        st = os.lstat(run / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert read_regular(tree, run / name, 10) == b"{}\n"
    assert (tree.parent / "outside" / "secret.jsonl").read_bytes() == b"secret\n"
    assert sorted(p.name for p in run.iterdir()) == ["fifo.json", "link.json", "new.json", "ok.jsonl"]
    (tree / "linked").symlink_to(tree.parent / "outside", target_is_directory=True)
    with pytest.raises(Refused):
        replace_file(tree, tree / "linked" / "x.json", b"{}\n")
    assert sorted(p.name for p in (tree.parent / "outside").iterdir()) == ["secret.jsonl"]


def test_walk_lists_links_but_enters_real_folders_only(tree: Path) -> None:
    (tree / "run" / "sub").mkdir()
    (tree / "run" / "sub" / "deep.jsonl").write_bytes(b"")
    (tree / "linked").symlink_to(tree.parent / "outside", target_is_directory=True)
    (tree / "run" / "up").symlink_to(tree, target_is_directory=True)
    seen = {folder.relative_to(tree).as_posix(): sorted(e.name for e in entries)
            for folder, entries in walk(tree)}
    assert seen == {".": ["linked", "run"], "run": ["ok.jsonl", "sub", "up"], "run/sub": ["deep.jsonl"]}
    with pytest.raises(Refused):
        list(walk(tree, tree / "linked"))


def test_a_name_that_is_not_utf8_is_logged_as_its_bytes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder named by bytes that are not UTF-8 (Python holds them as surrogates) is named in
    the exporter's log by escapes a UTF-8 log file accepts, not by the surrogates it would refuse."""
    from grpo_monitor.runtime.health import ExporterHealth

    name = os.fsdecode(b"run-\xff\xfe")
    assert printable(tmp_path / name / "latest.json").endswith("run-\\xff\\xfe/latest.json")
    assert printable("caf\u00e9") == "caf\u00e9"
    caplog.set_level("WARNING", logger="grpo_monitor")
    ExporterHealth().error(tmp_path / name / "latest.json", "invalid_json", "bad")
    (line,) = [r.getMessage() for r in caplog.records]
    line.encode("utf-8")  # raises on a surrogate
    assert "run-\\xff\\xfe" in line, line
