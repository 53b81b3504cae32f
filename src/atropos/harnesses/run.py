"""One harness rollout, start to end (`run_rollout`): a sandbox with the model-only network
(its one way out is the rollout proxy), the harness's install bound read-only, the task's
repository and the harness's config files put in; the harness run headless against its
session with a wall-time deadline; then the task's test in the same sandbox, and the score.

`run_harness` is the part every task source shares: the harness's config files put in, its
command run in a sandbox the caller opened (model-only, the install mounted), its exit read.
`run_rollout` (JSONL and `swe_patch` tasks) and the `harbor` environment's trials
(atropos.environments.harbor.trial, a Harbor task's own container and verifier) both call it.

Layout inside the sandbox: the work dir `/work` holds `repo/` (the task's files, the harness's
cwd), `home/` (HOME: config files, caches, logs) and, after the harness, what the test adds
(`test_files`). The harness never sees the test files.

Providers (`RolloutSettings.provider`): `bubblewrap` (default: the host's `/usr`, `/etc`, ...
read-only), `process`, or `docker` with `RolloutSettings.image` (a local image; the locked
profile: a read-only root, `/work` a tmpfs volume). The harness's install is mounted in all of
them, so its native code must run on what the sandbox's root holds: docs/harnesses.md,
"Providers", says what each harness needs of an image.

Limits: wall time is the harness exec's deadline (`timeout`, then its whole process tree is
SIGKILLed); calls and tokens are the session's (`atropos.proxy.session.Limits`): a call past
one is refused with a 400 naming it. A harness that stops because a limit was reached (its
own turn limit, or the proxy's refusal) has not failed: its work is scored as it stands
(`reason` "limit"). Failures are never scored: the harness's (`HarnessExit` not ok: timeout,
exit_nonzero, approval, no_model_call, ...), the sandbox's (`SandboxError`: its reason), and
the test's infrastructure (`verifier_timeout`, `verifier_reward`: no readable reward)."""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from atropos.envs.outcome import RolloutLimits
from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed, tail
from atropos.harnesses.tasks import HarnessTask
from atropos.proxy.session import Session
from atropos.sandbox import (
    PROVIDERS,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    open_sandbox,
)

__all__ = [
    "HarnessRun",
    "RolloutResult",
    "RolloutSettings",
    "base_url",
    "run_harness",
    "run_rollout",
    "sandbox_spec",
]

WORK = "/work"
REPO = f"{WORK}/repo"
HOME = f"{WORK}/home"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

Put = Callable[[str, bytes], Awaitable[None]]


@dataclass(frozen=True)
class RolloutSettings:
    """How each rollout runs (from the environment's config). `image`: the docker
    provider's local image (required there, refused elsewhere)."""

    provider: str = "bubblewrap"
    timeout: float = 600.0  # the harness's wall time
    verifier_timeout: float = 300.0
    start_timeout: float = 60.0
    max_turns: int | None = None
    memory_bytes: int | None = None  # RLIMIT_AS per process: Node reserves far more than it uses
    pids: int | None = 512  # Node and its workers are many threads
    disk_bytes: int | None = 1 << 30
    image: str | None = None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(
                f"--env.provider {self.provider!r}: use one of {', '.join(sorted(PROVIDERS))}"
            )
        if self.provider == "docker" and not self.image:
            raise ValueError(
                "--env.provider docker needs --env.image, a local image the tasks run in "
                "(e.g. one made by: atropos sandbox image build NAME --debian --include python3)"
            )
        if self.provider != "docker" and self.image:
            raise ValueError(
                f"--env.image {self.image!r} is for --env.provider docker (the provider is "
                f"{self.provider!r}): set both or neither"
            )

    @property
    def limits(self) -> RolloutLimits:
        """The rollout's bounds as a `RolloutLimits`: `max_turns`, and `timeout` seconds (the
        session's own limits bound its calls and tokens)."""
        return RolloutLimits(max_turns=self.max_turns, max_seconds=self.timeout)


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


@dataclass(frozen=True)
class HarnessRun:
    """A harness run in a sandbox: the harness, its install on the host, its session."""

    harness: Harness
    installed: Installed
    session: Session


def sandbox_spec(installed: Installed, proxy_url: str, settings: RolloutSettings) -> SandboxSpec:
    """The rollout's sandbox: model-only to the proxy, the harness bound read-only; on docker,
    `settings.image`."""
    return SandboxSpec(
        image=settings.image if settings.provider == "docker" else None,
        network="model-only",
        model_url=proxy_url,
        workdir=WORK,
        memory_bytes=settings.memory_bytes,
        pids=settings.pids,
        disk_bytes=settings.disk_bytes,
        mounts=dict(installed.mounts),
    )


def base_url(inside: str, session: Session, dialect: str) -> str:
    """The session's base URL inside the sandbox, for `dialect`."""
    root = f"{inside.rstrip('/')}/s/{session.id}"
    return root if dialect == "anthropic" else f"{root}/v1"


async def run_harness(
    box: Sandbox,
    run: HarnessRun,
    call: HarnessCall,
    put: Put | None = None,
    system_path: str = SYSTEM_PATH,
    user: str | None = None,
) -> tuple[HarnessExit, float]:
    """Run `run.harness` headless in `box` (opened by the caller: model-only to the proxy,
    the install mounted) as `call` says: its config files put in (relative paths under
    `call.workdir`; `put(absolute path, data)`, default `box.put`, which writes only under
    the sandbox's work dir), its command run in `call.workdir` within `call.timeout`, as
    `user` when given (`su`; the image's user otherwise). Returns its exit (a stop on a
    session limit is `limit`, not a failure) and its wall seconds. A `SandboxError` is
    raised."""
    write = put or box.put
    for path, data in run.harness.files(call).items():
        await write(_inside(call.workdir, path, (call.workdir, call.home)), data)
    env = _environment(run.harness, call, run.installed, system_path)
    argv = _in_dir(call.workdir, run.harness.command(call))
    command: list[str] | str = argv
    if user not in (None, "root", "0"):  # su resets HOME and PATH: set them after it
        assigned = [f"{k}={v}" for k, v in env.items()]
        inner = shlex.join(["env", *assigned, *argv])
        command = f"su -s /bin/sh {shlex.quote(str(user))} -c {shlex.quote(inner)}"
    started = time.monotonic()
    result = await box.exec(command, call.timeout, env=env)
    seconds = time.monotonic() - started
    return _limited(run.harness.outcome(result, run.session.turns), run.session), seconds


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
            run = HarnessRun(harness, installed, session)
            return await _in_sandbox(box, run, task, model, settings)
        except SandboxError as error:
            return _failed(HarnessExit(False, "sandbox"), error.reason, str(error))


async def _in_sandbox(
    box: Any, run: HarnessRun, task: HarnessTask, model: str, settings: RolloutSettings
) -> RolloutResult:
    assert box.model_url is not None  # model-only
    call = HarnessCall(
        instruction=task.instruction,
        base_url=base_url(box.model_url, run.session, run.harness.dialect),
        api_key=run.session.key,
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
    exit, harness_seconds = await run_harness(box, run, call)
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
    used = {"turns": session.turns, "tokens": session.completion_tokens}
    reached = session.limits.exceeded(**used) is not None  # a RolloutLimits
    if not exit.ok and exit.reason == "exit_nonzero" and reached:
        return HarnessExit(True, "limit", exit.detail, exit.output)
    return exit


def _environment(
    harness: Harness, call: HarnessCall, installed: Installed, system_path: str = SYSTEM_PATH
) -> dict[str, str]:
    path = ":".join([*installed.path, system_path])
    return {"HOME": call.home, "PATH": path, **harness.environment(call)}


def _in_dir(directory: str, argv: list[str]) -> list[str]:
    """`argv` run with `directory` as its cwd (an exec starts in the work dir)."""
    return ["/bin/sh", "-c", 'cd "$0" && exec "$@"', directory, *argv]


def _inside(directory: str, path: str, within: tuple[str, ...] = (WORK,)) -> str:
    """`path` (relative to `directory`, or absolute) as an absolute path under one of
    `within` (default: the work dir)."""
    full = posixpath.normpath(posixpath.join(directory, path))
    if not any(full == top or full.startswith(top.rstrip("/") + "/") for top in within):
        raise ValueError(f"{path!r} is outside {' and '.join(within)}")
    return full


def _detail(result: ExecResult) -> str:
    return tail(result.stderr) or tail(result.stdout)


def _failed(exit: HarnessExit, reason: str, detail: str) -> RolloutResult:
    return RolloutResult(exit, None, reason, detail)
