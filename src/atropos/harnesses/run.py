"""One harness rollout, start to end (`run_rollout`): a sandbox with the model-only network
(its one way out is the rollout proxy), the harness's install bound read-only, the task's
repository and the harness's config files put in; the harness run headless against its
session with a wall-time deadline; then the task's test in the same sandbox, and the score.

Layout inside the sandbox: the work dir `/work` holds `repo/` (the task's files, the harness's
cwd), `home/` (HOME: config files, caches, logs) and, after the harness, what the test adds
(`test_files`). The harness never sees the test files.

Limits: wall time is the harness exec's deadline (`timeout`, then its whole process tree is
SIGKILLed); calls and tokens are the session's (`atropos.proxy.session.Limits`): a call past
one is refused with a 400 naming it. A harness that stops because a limit was reached (its
own turn limit, or the proxy's refusal) has not failed: its work is scored as it stands
(`reason` "limit"). Failures are never scored: the harness's (`HarnessExit` not ok: timeout,
exit_nonzero, approval, no_model_call, ...), the sandbox's (`SandboxError`: its reason), and
the test's infrastructure (`verifier_timeout`, `verifier_reward`: no readable reward)."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed, tail
from atropos.harnesses.tasks import HarnessTask
from atropos.proxy.session import Session
from atropos.sandbox import ExecResult, SandboxError, SandboxSpec, open_sandbox

__all__ = ["RolloutResult", "RolloutSettings", "run_rollout", "sandbox_spec"]

WORK = "/work"
REPO = f"{WORK}/repo"
HOME = f"{WORK}/home"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class RolloutSettings:
    """How each rollout runs (from the environment's config)."""

    provider: str = "bubblewrap"
    timeout: float = 600.0  # the harness's wall time
    verifier_timeout: float = 300.0
    start_timeout: float = 60.0
    max_turns: int | None = None
    memory_bytes: int | None = None  # RLIMIT_AS per process: Node reserves far more than it uses
    pids: int | None = 512  # Node and its workers are many threads
    disk_bytes: int | None = 1 << 30


@dataclass
class RolloutResult:
    """How one rollout ended: the harness's exit, the score (None when failed), the failure's
    reason and detail, and the seconds each part took."""

    exit: HarnessExit
    score: float | None = None
    failure: str | None = None
    detail: str = ""
    harness_seconds: float = 0.0
    verifier_seconds: float = 0.0


def sandbox_spec(installed: Installed, proxy_url: str, settings: RolloutSettings) -> SandboxSpec:
    """The rollout's sandbox: model-only to the proxy, the harness bound read-only. Until
    the sandbox takes `mounts`, bubblewrap runs over the host's root read-only (which shows the
    harness's cache folder at its own path)."""
    spec: dict[str, Any] = {
        "network": "model-only",
        "model_url": proxy_url,
        "workdir": WORK,
        "memory_bytes": settings.memory_bytes,
        "pids": settings.pids,
        "disk_bytes": settings.disk_bytes,
    }
    if "mounts" in {f.name for f in fields(SandboxSpec)}:
        spec["mounts"] = dict(installed.mounts)
    elif settings.provider == "bubblewrap":
        spec["root"] = Path("/")
    return SandboxSpec(**spec)


def base_url(inside: str, session: Session, dialect: str) -> str:
    """The session's base URL inside the sandbox, for `dialect`."""
    root = f"{inside.rstrip('/')}/s/{session.id}"
    return root if dialect == "anthropic" else f"{root}/v1"


async def run_rollout(
    harness: Harness,
    installed: Installed,
    task: HarnessTask,
    session: Session,
    proxy_url: str,
    model: str,
    settings: RolloutSettings,
) -> RolloutResult:
    """Run `harness` on `task` against `session` in a new sandbox, then the task's test. A
    sandbox failure is a failed result (never raised); cancellation closes the sandbox."""
    try:
        box = await open_sandbox(
            sandbox_spec(installed, proxy_url, settings), settings.provider, settings.start_timeout
        )
    except SandboxError as error:
        return _failed(HarnessExit(False, "sandbox"), error.reason, str(error))
    async with box:
        try:
            return await _in_sandbox(box, harness, installed, task, session, model, settings)
        except SandboxError as error:
            return _failed(HarnessExit(False, "sandbox"), error.reason, str(error))


async def _in_sandbox(
    box: Any,
    harness: Harness,
    installed: Installed,
    task: HarnessTask,
    session: Session,
    model: str,
    settings: RolloutSettings,
) -> RolloutResult:
    assert box.model_url is not None  # model-only
    call = HarnessCall(
        instruction=task.instruction,
        base_url=base_url(box.model_url, session, harness.dialect),
        api_key=session.key,
        model=model,
        workdir=REPO,
        home=HOME,
        max_turns=settings.max_turns,
        timeout=settings.timeout,
    )
    await box.put(f"{HOME}/.keep", b"")
    await box.put(f"{REPO}/.keep", b"")
    for path, data in task.files.items():
        await box.put(_inside(REPO, path), data)
    for path, data in harness.files(call).items():
        await box.put(_inside(REPO, path), data)
    started = time.monotonic()
    result = await box.exec(
        _in_dir(REPO, harness.command(call)),
        settings.timeout,
        env=_environment(harness, call, installed),
    )
    harness_seconds = time.monotonic() - started
    exit = _limited(harness.outcome(result, session.turns), session)
    if not exit.ok:
        failed = _failed(exit, exit.reason, exit.detail)
        failed.harness_seconds = harness_seconds
        return failed
    return await _verify(box, task, exit, harness_seconds, settings)


async def _verify(
    box: Any,
    task: HarnessTask,
    exit: HarnessExit,
    harness_seconds: float,
    settings: RolloutSettings,
) -> RolloutResult:
    for path, data in task.test_files.items():
        await box.put(_inside(REPO, path), data)
    started = time.monotonic()
    result = await box.exec(_in_dir(REPO, ["/bin/sh", "-c", task.test]), settings.verifier_timeout)
    seconds = time.monotonic() - started
    if result.timed_out:
        failed = _failed(exit, "verifier_timeout", _detail(result))
        failed.harness_seconds, failed.verifier_seconds = harness_seconds, seconds
        return failed
    score = 1.0 if result.exit_code == 0 else 0.0
    if task.reward_file is not None:
        try:
            score = float((await box.get(_inside(REPO, task.reward_file))).decode().strip())
        except (FileNotFoundError, ValueError) as error:
            failed = _failed(exit, "verifier_reward", f"{task.reward_file}: {error}")
            failed.harness_seconds, failed.verifier_seconds = harness_seconds, seconds
            return failed
    return RolloutResult(exit, score, None, _detail(result), harness_seconds, seconds)


def _limited(exit: HarnessExit, session: Session) -> HarnessExit:
    """A harness that stopped on a limit (the proxy refused its next call) has not failed."""
    limits = session.limits
    reached = session.turns >= limits.max_turns or session.tokens_left() <= 0
    if not exit.ok and exit.reason == "exit_nonzero" and reached:
        return HarnessExit(True, "limit", exit.detail, exit.output)
    return exit


def _environment(harness: Harness, call: HarnessCall, installed: Installed) -> dict[str, str]:
    path = ":".join([*installed.path, SYSTEM_PATH])
    return {"HOME": call.home, "PATH": path, **harness.environment(call)}


def _in_dir(directory: str, argv: list[str]) -> list[str]:
    """`argv` run with `directory` as its cwd (an exec starts in the work dir)."""
    return ["/bin/sh", "-c", 'cd "$0" && exec "$@"', directory, *argv]


def _inside(directory: str, path: str) -> str:
    """`path` (relative to `directory`, or absolute) as an absolute path under the work dir."""
    full = posixpath.normpath(posixpath.join(directory, path))
    if full != WORK and not full.startswith(WORK + "/"):
        raise ValueError(f"{path!r} is outside the sandbox's work dir {WORK}")
    return full


def _detail(result: ExecResult) -> str:
    return tail(result.stderr) or tail(result.stdout)


def _failed(exit: HarnessExit, reason: str, detail: str) -> RolloutResult:
    return RolloutResult(exit, None, reason, detail)
