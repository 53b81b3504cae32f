"""How launch shows what it supervises: the pid column, messages printed whole."""

from __future__ import annotations

import io

from rich.console import Console

from atropos.launch.driver import pid, say
from atropos.launch.supervise import Status


def _status(state: str, pid_: int | None, alive: bool) -> Status:
    return Status(
        name="arithmetic", role="env", state=state, restarts=0, pid=pid_, exit_code=None,
        exit_codes=[], started=None, ready_after=None, reason="", host="127.0.0.1", port=None,
        log="", argv=[], alive=alive,
    )  # fmt: skip


def test_the_pid_column_says_what_became_of_the_process() -> None:
    """An env ends by itself after the trainer's last step, a moment before its supervisor
    sees it: its row keeps the pid and says it ended, never `ready` with `-`."""
    assert pid(_status("ready", 4242, alive=True)) == "4242"
    assert pid(_status("ready", 4242, alive=False)) == "4242 ended"
    assert pid(_status("exited", 4242, alive=False)) == "4242 ended"
    assert pid(_status("waiting", None, alive=False)) == "-"


def test_long_messages_are_not_wrapped() -> None:
    """In a log (no terminal, 80 columns) Rich would break a long error and fold a path
    mid-word; launch prints each message as one line."""
    out = io.StringIO()
    console = Console(file=out, width=40)
    path = "/tmp/" + "a-rather-long-directory-name/" * 4 + "trainer.log"
    message = f"[launch] error: trainer exited with 1 before it was ready\n--- last lines of {path}"
    say(console, message)
    assert out.getvalue() == message + "\n"
