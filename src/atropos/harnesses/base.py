"""The harness interface: what one run of an agent program is given (`HarnessCall`), how it
ended (`HarnessExit`), where it is installed (`Installed`), and the `Harness` class each agent
program subclasses in one file (src/atropos/harnesses/<name>.py).

A harness is declarative: how it is installed on the host (cached, mounted read-only into the
sandbox), which config files and environment variables point it at the rollout proxy's
session, the argv that runs it headless, and how its exit is read. The runner
(atropos.harnesses.run) does the rest: session, sandbox, limits, verifier, score."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from atropos.sandbox import ExecResult


@dataclass(frozen=True)
class HarnessCall:
    """What one run of a harness is given."""

    instruction: str  # the task, plain text
    base_url: str  # the session's base URL as seen inside the sandbox, in the harness's dialect
    api_key: str  # the session's key
    model: str  # the model name to ask for
    workdir: str  # the sandbox's work dir (the repository/task files are there)
    home: str  # a writable HOME inside the sandbox (config files go there)
    max_turns: int | None  # turn/step limit where the harness has one
    timeout: float  # wall seconds for the harness's exec


@dataclass(frozen=True)
class HarnessExit:
    """How a run ended: `ok`, or a short `reason` (exit_nonzero, timeout, approval,
    no_model_call, crashed, ...) with the end of its stderr/log in `detail`."""

    ok: bool
    reason: str  # "ok", or a short word
    detail: str = ""  # the end of its stderr/log, for the failure log
    output: str = ""  # its final answer/result text when it gives one


@dataclass(frozen=True)
class Installed:
    """A harness installed on the host: what to bind read-only into the sandbox
    ({inside path: host path}) and the bin dirs inside to prepend to PATH."""

    mounts: dict[str, Path] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)


class Harness:
    """One agent program. Subclass it in one file and register it in
    atropos.harnesses.HARNESSES; docs/harnesses.md walks through one."""

    name: ClassVar[str]  # "claude-code" | "codex" | "mini-swe-agent"
    dialect: ClassVar[str]  # "anthropic" | "responses" | "openai": which base URL it is given
    version: ClassVar[str]  # the pinned version

    def install(self) -> Installed:
        """Install on the host once (cached under ~/.cache/atropos/harnesses/<name>-<version>,
        idempotent, with a deadline and progress) and say what to mount."""
        raise NotImplementedError

    def files(self, call: HarnessCall) -> dict[str, bytes]:
        """Config files to put into the sandbox: paths relative to the work dir, or absolute
        under `call.home`. May be empty."""
        return {}

    def environment(self, call: HarnessCall) -> dict[str, str]:
        """Base URL and key variables; telemetry, updates and non-essential traffic off;
        headless and approval settings."""
        return {}

    def command(self, call: HarnessCall) -> list[str]:
        """The argv run in the sandbox (cwd = the work dir)."""
        raise NotImplementedError

    def outcome(self, result: ExecResult, calls_made: int) -> HarnessExit:
        """Read its exit and output format. `calls_made` is the model calls the proxy saw for
        the session. The default: a deadline is `timeout`, a non-zero exit `exit_nonzero`,
        no model call `no_model_call`, else ok with stdout as the output."""
        return default_outcome(result, calls_made)


def tail(data: bytes, limit: int = 2000) -> str:
    """The end of a stream as text, for a failure's detail."""
    return data.decode(errors="replace")[-limit:]


def default_outcome(result: ExecResult, calls_made: int) -> HarnessExit:
    """The common reading of an exit, in this order: timeout, exit_nonzero, no_model_call."""
    detail = tail(result.stderr) or tail(result.stdout)
    if result.timed_out:
        return HarnessExit(False, "timeout", detail)
    if result.exit_code != 0:
        return HarnessExit(False, "exit_nonzero", f"exit {result.exit_code}: {detail}")
    if calls_made == 0:
        return HarnessExit(False, "no_model_call", detail)
    return HarnessExit(True, "ok", detail, result.stdout.decode(errors="replace"))
