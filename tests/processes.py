"""Child processes for the tests: grpo_monitor.tools.stack's Child (started, stopped and waited on as
the native stack does it), started on a free loopback port, and their logs for failure messages.

Every child writes stdout and stderr to a log file in a working folder; a test's ExitStack stops
it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path

from grpo_monitor.tools.stack import Child, free_port


def log_tail(child: Child, lines: int = 40) -> str:
    """The last ``lines`` lines of the child's log ("" if it cannot be read)."""
    try:
        text = child.log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def start_child(stack: ExitStack, name: str, argv: list[str], workdir: Path, *, url: str = "",
                log: Path | None = None, env: Mapping[str, str] | None = None) -> Child:
    """``argv`` as a child in ``workdir``, its log ``log`` (default ``workdir/<name>.log``), with
    exactly ``env`` (None: this process' environment); ``stack`` stops it."""
    child = Child.start(name, argv, log or workdir / f"{name}.log", workdir, url=url, env=env)
    stack.callback(child.stop)
    return child


def wait_ready(child: Child, timeout: float = 30.0) -> None:
    """Until ``child.url``/-/ready answers 200; fail at once, with its log, if it exits."""
    try:
        child.wait_ready(f"{child.url}/-/ready", timeout)
    except (RuntimeError, TimeoutError) as e:
        raise AssertionError(f"{e}\n--- {child.name} log ---\n{log_tail(child)}") from None


def start_listening(stack: ExitStack, name: str, argv: Callable[[int], list[str]], workdir: Path,
                    attempts: int = 3, env: Mapping[str, str] | None = None
                    ) -> tuple[Child, int]:
    """Start ``argv(port)`` on a free port and wait until /-/ready answers.

    A port found free can be taken by someone else before the process binds it: a process
    that exits with "address already in use" is started again on another port."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        child = start_child(stack, name, argv(port), workdir, url=f"http://127.0.0.1:{port}",
                            env=env)
        try:
            wait_ready(child)
        except AssertionError:
            # lower(): Go says "bind: address already in use", Python "Address already in use".
            if (attempt < attempts and not child.alive()
                    and "address already in use" in log_tail(child).lower()):
                child.log.rename(child.log.with_suffix(f".log.{attempt}"))
                continue
            raise
        return child, port
    raise AssertionError("unreachable")
