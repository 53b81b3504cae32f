"""One Harbor trial: the agent in the task's sandbox, then the verifier, then the reward it
wrote. The paths are Harbor's (`harbor.models.trial.paths.EnvironmentPaths`): `/logs/agent`,
`/logs/verifier` (`reward.json` read first, else `reward.txt`), `/logs/artifacts`, `/tests`
(copied in after the agent, as Harbor's verifier does), `/solution` (the oracle's only).
Files go in through `tar -x -C /` fed on the exec's stdin, so the image needs `tar`.

The verifier runs where `[verifier] environment_mode` says, as in Harbor 0.25
(`harbor.trial.single_step`, `Trial._run_separate_verifier`): `shared`, in the agent's
sandbox; `separate`, in a sandbox of its own started after the agent's is closed. That one
is the verifier's image (`image.verifier_image`: its tests inside, so none are copied) or
the task's (the tests copied in), with `[verifier.environment]`'s resources, else the
task's; it receives what Harbor's `ArtifactHandler` hands over and nothing else: the agent's
`/logs/artifacts` and every path listed in task.toml's `artifacts`, each at its own path,
read from the agent's sandbox with `tar -c` (a missing path is skipped, as Harbor's
collection is best-effort; more than ARTIFACT_BYTES in all fails the trial, `artifacts`).
Harbor bind-mounts `/logs/verifier` to read the reward from the host; we read it from the
verifier's sandbox before closing it, the same file.

An agent is the oracle (`solution/solve.sh`, with `[solution] env` and
`DEBIAN_FRONTEND=noninteractive`), a command (the instruction in `/logs/agent/instruction.md`
and in `$HARBOR_INSTRUCTION`, its file's path in `$HARBOR_INSTRUCTION_FILE`), a script
(the policy's bash block), or a harness (`HarnessAgent`: a registered agent program or a
command harness, run by `atropos.harnesses.run.run_harness` on `instruction.md`, in the task's
work dir, with HOME `/logs/agent/home`; the sandbox is then model-only to the rollout proxy
and the harness's install is mounted read-only). An agent that runs past its timeout is
killed and the verifier still runs: the rollout is scored, as in Harbor (`AgentTimeoutError`
is recorded, the verifier runs). A harness is the exception: its failures (its exit not ok:
`timeout`, `exit_nonzero`, `no_model_call`, ...) fail the trial with that reason and no
verifier runs, as in the harness environment; a stop on a session limit (`limit`) is scored.
What fails a trial instead of scoring it (`TrialResult.failure`, one word):
the sandbox's `SandboxError` reason (`start_failed`, `start_timeout`, `dead`, `closed`,
`expired`, `unsupported`, `unavailable`), `setup` (the log folders could not be made),
`healthcheck`, `artifacts`, `verifier_timeout`, `no_reward` (neither file written) and
`bad_reward` (not a finite number, or a JSON without numbers).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from atropos.environments.harbor.container import open_task_sandbox
from atropos.environments.harbor.image import TaskImage
from atropos.environments.harbor.task import HarborTask, VerifierEnvironment
from atropos.harnesses.base import HarnessCall, HarnessExit
from atropos.harnesses.run import HarnessRun, base_url, run_harness
from atropos.sandbox import ExecResult, Sandbox, SandboxError, SandboxSpec

__all__ = ["Agent", "HarnessAgent", "TrialResult", "reward_of", "run_trial", "sandbox_spec"]

SETUP_TIMEOUT = 60.0
READ_TIMEOUT = 30.0
INSTRUCTION_FILE = "/logs/agent/instruction.md"
HARNESS_HOME = "/logs/agent/home"  # a harness's HOME: its config files, state and logs
ARTIFACTS = "/logs/artifacts"  # Harbor's convention entry, always handed over
ARTIFACT_BYTES = 64 << 20  # the most a separate verifier is handed, all artifacts together
# what `docker run` gives a root process of a Debian or Ubuntu image (the provider's own PATH
# leaves out the sbin folders)
CONTAINER_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
}
AgentKind = Literal["oracle", "command", "script", "harness"]


@dataclass(frozen=True)
class HarnessAgent:
    """A harness as the agent: `run` (the harness, its install, its proxy session), the
    proxy's URL on the host, the model name, the turn limit it is told."""

    run: HarnessRun
    proxy_url: str
    model: str
    max_turns: int | None = None


@dataclass(frozen=True)
class Agent:
    """What acts on the task: the oracle, a shell command, a bash script (the policy's), or
    a harness (`harness` set)."""

    kind: AgentKind
    text: str = ""
    harness: HarnessAgent | None = None


@dataclass
class TrialResult:
    """A trial's outcome: `reward` when the verifier wrote one, else `failure` (a reason)."""

    reward: float | None = None
    failure: str | None = None
    detail: str = ""
    rewards: dict[str, float] = field(default_factory=dict)
    agent_exit: int | None = None
    agent_timed_out: bool = False
    agent_output: str = ""
    harness_exit: HarnessExit | None = None  # a harness agent's exit
    agent_seconds: float = 0.0


@dataclass(frozen=True)
class Limits:
    """What the run adds to a task's own settings."""

    provider: str = "docker"
    start_timeout: float = 120.0
    agent_timeout: float = 600.0  # when task.toml's [agent] timeout_sec is unset
    memory_bytes: int | None = 2 << 30  # when task.toml sets none
    pids: int | None = 1024
    output_bytes: int = 1 << 20


def sandbox_spec(
    task: HarborTask, image: TaskImage, limits: Limits, harness: HarnessAgent | None = None
) -> SandboxSpec:
    """The sandbox of a task: its image, environment, work dir and resources; its time to
    live covers the agent, the verifier and their setup. A harness adds the model-only
    network to the proxy and its install, mounted read-only."""
    agent = task.agent_timeout or limits.agent_timeout
    separate = task.verifier_mode == "separate"
    network: dict[str, Any] = {"network": "none"}
    if harness is not None:
        network = {"network": "model-only", "model_url": harness.proxy_url}
        network["mounts"] = dict(harness.run.installed.mounts)
    return _container_spec(
        image,
        _task_environment(task),
        limits,
        ttl_seconds=agent + task.verifier_timeout + 4 * SETUP_TIMEOUT,
        output_bytes=max(limits.output_bytes, ARTIFACT_BYTES if separate else 0),
        **network,
    )


def verifier_spec(task: HarborTask, image: TaskImage, limits: Limits) -> SandboxSpec:
    """A separate verifier's sandbox: its image, and `[verifier.environment]`'s settings,
    else a copy of the task's `[environment]` (Harbor's default)."""
    own = task.verifier_environment or _task_environment(task)
    return _container_spec(
        image,
        own,
        limits,
        ttl_seconds=task.verifier_timeout + 4 * SETUP_TIMEOUT,
        output_bytes=limits.output_bytes,
        network="none",
    )


def _task_environment(task: HarborTask) -> VerifierEnvironment:
    """The task's `[environment]` settings, in the shape a verifier's own take."""
    return VerifierEnvironment(
        None, task.workdir, task.cpus, task.memory_bytes, task.disk_bytes, task.env
    )


def _container_spec(
    image: TaskImage, own: VerifierEnvironment, limits: Limits, **rest: Any
) -> SandboxSpec:
    """The sandbox of one container of a trial: `image` with the settings in `own` (the
    task's `[environment]` or a verifier's own), the trial's `limits`, and `rest`."""
    return SandboxSpec(
        image=image.name,
        env={**CONTAINER_ENV, **image.environment, **own.env},
        workdir=own.workdir or image.working_dir or "/",
        cpus=own.cpus,
        memory_bytes=own.memory_bytes or limits.memory_bytes,
        disk_bytes=own.disk_bytes,
        pids=limits.pids,
        **rest,
    )


async def run_trial(
    task: HarborTask,
    image: TaskImage,
    agent: Agent,
    limits: Limits,
    verifier: TaskImage | None = None,
) -> TrialResult:
    """Start the task's sandbox, run `agent`, then the verifier (in the same sandbox, or in
    one of `verifier`'s image, else `image`'s, when separate), read the reward, close them."""
    result = TrialResult()
    try:
        spec = sandbox_spec(task, image, limits, agent.harness)
        async with await open_task_sandbox(spec, limits.provider, limits.start_timeout) as box:
            if not await _prepare(box, task, result):
                return result
            if not await _act(box, task, agent, limits, result):
                return result
            if task.verifier_mode != "separate":
                await _verify(box, task, result, copy_tests=True)
                return result
            handed = await _collect(box, task, result)
        if handed is None:
            return result
        judge = verifier or image  # the agent's sandbox is closed first, as Harbor stops it
        spec = verifier_spec(task, judge, limits)
        async with await open_task_sandbox(spec, limits.provider, limits.start_timeout) as box:
            await box.exec(["mkdir", "-p", "/logs/verifier", ARTIFACTS], timeout=SETUP_TIMEOUT)
            for archive in handed:
                await _untar(box, archive)
            await _verify(box, task, result, copy_tests=not judge.bundles_tests)
    except SandboxError as error:
        result.failure, result.detail = error.reason, str(error)
    return result


async def _collect(box: Sandbox, task: HarborTask, result: TrialResult) -> list[bytes] | None:
    """What a separate verifier is handed: `/logs/artifacts` and task.toml's `artifacts`,
    each a tar rooted at `/` (a path the agent's sandbox lacks is skipped)."""
    handed, size = [], 0
    for source, exclude in [(ARTIFACTS, ()), *((a.source, a.exclude) for a in task.artifacts)]:
        command = ["tar", "-c", "-C", "/", *(f"--exclude={p}" for p in exclude)]
        command += ["--", source.strip("/")]
        present = await box.exec(["test", "-e", source], timeout=READ_TIMEOUT)
        if not present.ok:
            continue
        done = await box.exec(command, timeout=SETUP_TIMEOUT)
        size += len(done.stdout)
        if done.truncated or size > ARTIFACT_BYTES:
            _failed(result, "artifacts", f"the artifacts pass {ARTIFACT_BYTES >> 20} MiB")
            return None
        if done.ok:
            handed.append(done.stdout)
    return handed


async def _prepare(box: Sandbox, task: HarborTask, result: TrialResult) -> bool:
    made = await box.exec(["mkdir", "-p", "/logs/agent", "/logs/verifier", "/logs/artifacts"],
                          timeout=SETUP_TIMEOUT)  # fmt: skip
    if not made.ok:
        return _failed(result, "setup", f"mkdir /logs: {_said(made)}")
    if task.healthcheck is not None and not await _healthy(box, task.healthcheck):
        return _failed(result, "healthcheck", f"never passed: {task.healthcheck['command']}")
    return True


async def _healthy(box: Sandbox, check: Mapping[str, object]) -> bool:
    """Harbor's healthcheck: `retries` tries of `command`, `interval_sec` apart."""
    tries = int(str(check.get("retries", 3))) + 1
    for attempt in range(tries):
        done = await box.exec(
            str(check["command"]), timeout=float(str(check.get("timeout_sec", 30)))
        )
        if done.ok:
            return True
        if attempt + 1 < tries:
            await asyncio.sleep(float(str(check.get("interval_sec", 5))))
    return False


async def _act(
    box: Sandbox, task: HarborTask, agent: Agent, limits: Limits, result: TrialResult
) -> bool:
    """Run the agent; False when the trial failed (a harness's failure: nothing to verify)."""
    timeout = task.agent_timeout or limits.agent_timeout
    env: dict[str, str] = {}
    if agent.harness is not None:
        return await _harness(box, task, agent.harness, timeout, result)
    if agent.kind == "oracle":
        await put_tree(box, task.solution_dir, "/solution")
        command = "chmod +x /solution/solve.sh && /solution/solve.sh > /logs/agent/oracle.txt 2>&1"
        env = {"DEBIAN_FRONTEND": "noninteractive", **task.solution_env}
    elif agent.kind == "command":
        await put_files(box, {INSTRUCTION_FILE: task.instruction.encode()})
        command = agent.text
        env = {"HARBOR_INSTRUCTION": task.instruction, "HARBOR_INSTRUCTION_FILE": INSTRUCTION_FILE}
    else:
        await put_files(box, {"/logs/agent/answer.sh": agent.text.encode()})
        command = "bash /logs/agent/answer.sh"
    done = await box.exec(as_user(command, task.agent_user), timeout=timeout, env=env)
    result.agent_exit, result.agent_timed_out = done.exit_code, done.timed_out
    result.agent_output = (done.stdout + done.stderr).decode(errors="replace")[-4000:]
    return True


async def _harness(
    box: Sandbox, task: HarborTask, agent: HarnessAgent, timeout: float, result: TrialResult
) -> bool:
    """The harness headless on `instruction.md` in the task's work dir (`run_harness`);
    False, with its reason as the trial's failure, when its exit is not ok."""
    inside = getattr(box, "model_url", None)
    assert inside is not None  # the spec is model-only
    session = agent.run.session
    call = HarnessCall(
        instruction=task.instruction,
        base_url=base_url(inside, session, agent.run.harness.dialect),
        api_key=session.key,
        model=agent.model,
        workdir=box.spec.workdir,
        home=HARNESS_HOME,
        max_turns=agent.max_turns,
        timeout=timeout,
    )
    home = ["mkdir", "-p", HARNESS_HOME]
    if task.agent_user not in (None, "root", "0"):
        home = ["sh", "-c", 'mkdir -p "$0" && chown "$1" "$0"', HARNESS_HOME, task.agent_user]
    made = await box.exec(home, timeout=SETUP_TIMEOUT)
    if not made.ok:
        return _failed(result, "setup", f"{HARNESS_HOME}: {_said(made)}")

    async def put(path: str, data: bytes) -> None:
        await put_files(box, {path: data})

    path = box.spec.env.get("PATH", CONTAINER_ENV["PATH"])
    exit, seconds = await run_harness(box, agent.run, call, put, path, task.agent_user)
    result.harness_exit, result.agent_seconds = exit, seconds
    result.agent_timed_out = exit.reason == "timeout"
    result.agent_output = (exit.output or exit.detail)[-4000:]
    if not exit.ok:
        return _failed(result, exit.reason, exit.detail)
    return True


async def _verify(box: Sandbox, task: HarborTask, result: TrialResult, copy_tests: bool) -> None:
    await box.exec(["rm", "-f", "/logs/verifier/reward.txt", "/logs/verifier/reward.json"],
                   timeout=SETUP_TIMEOUT)  # fmt: skip
    if copy_tests:
        await put_tree(box, task.tests_dir, "/tests")
    command = "chmod +x /tests/test.sh && /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
    done = await box.exec(as_user(command, task.verifier_user), timeout=task.verifier_timeout,
                          env=dict(task.verifier_env))  # fmt: skip
    if done.timed_out:
        _failed(result, "verifier_timeout", f"tests/test.sh ran past {task.verifier_timeout:g} s")
        return
    as_json = await box.exec(["cat", "/logs/verifier/reward.json"], timeout=READ_TIMEOUT)
    as_text = None if as_json.ok else await box.exec(["cat", "/logs/verifier/reward.txt"],
                                                    timeout=READ_TIMEOUT)  # fmt: skip
    if as_text is not None and not as_text.ok:
        log = await box.exec(["tail", "-c", "2000", "/logs/verifier/test-stdout.txt"],
                             timeout=READ_TIMEOUT)  # fmt: skip
        _failed(result, "no_reward", "tests/test.sh wrote neither /logs/verifier/reward.json nor"
                f" reward.txt (exit {done.exit_code}); its output: {_said(log)}")  # fmt: skip
        return
    try:
        if as_text is None:
            result.rewards = rewards_of_json(as_json.stdout.decode(errors="replace"))
        else:
            result.rewards = {"reward": reward_of(as_text.stdout.decode(errors="replace"))}
    except ValueError as error:
        _failed(result, "bad_reward", str(error))
        return
    values = result.rewards
    result.reward = values["reward"] if "reward" in values else sum(values.values()) / len(values)


def reward_of(text: str) -> float:
    """reward.txt's number (Harbor: `float(text)`, finite).

    >>> reward_of("1\\n"), reward_of(" 0.25 ")
    (1.0, 0.25)
    """
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"reward.txt holds {text[:80]!r}, not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"reward.txt holds {value!r}, not a finite number")
    return value


def rewards_of_json(text: str) -> dict[str, float]:
    """reward.json's numbers by key (a bare number is the `reward`); Harbor refuses
    non-numeric and non-finite values, and so do we.

    >>> rewards_of_json('{"reward": 1, "partial": 0.5}'), rewards_of_json("0.5")
    ({'reward': 1.0, 'partial': 0.5}, {'reward': 0.5})
    """
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"reward.json is not JSON: {text[:80]!r}") from None
    values = data if isinstance(data, dict) else {"reward": data}
    bad = {k: v for k, v in values.items() if isinstance(v, bool)
           or not isinstance(v, (int, float)) or not math.isfinite(v)}  # fmt: skip
    if bad or not values:
        raise ValueError(f"reward.json needs finite numbers, has {bad or values!r}")
    return {str(k): float(v) for k, v in values.items()}


def as_user(command: str, user: str | None) -> str:
    """`command` run as `user` (`[agent]`/`[verifier]` `user` of task.toml) via `su`; as the
    image's user when None or root."""
    if user in (None, "root", "0"):
        return command
    return f"su -s /bin/sh {shlex.quote(str(user))} -c {shlex.quote(command)}"


async def put_files(box: Sandbox, files: Mapping[str, bytes]) -> None:
    """Write `files` (absolute paths) into the sandbox, as root, via `tar -x -C /`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            archive.addfile(info, io.BytesIO(data))
    await _untar(box, buffer.getvalue())


async def put_tree(box: Sandbox, folder: Path, target: str) -> None:
    """Copy a local `folder` to the absolute `target` in the sandbox."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(folder, arcname=target.lstrip("/"), filter=_owned_by_root)
    await _untar(box, buffer.getvalue())


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


async def _untar(box: Sandbox, archive: bytes) -> None:
    done = await box.exec(["tar", "-x", "-C", "/", "-f", "-"], timeout=SETUP_TIMEOUT, stdin=archive)
    if not done.ok:
        raise SandboxError("start_failed", f"could not copy files in (tar): {_said(done)}")


def _failed(result: TrialResult, reason: str, detail: str) -> bool:
    result.failure, result.detail = reason, detail
    return False


def _said(done: ExecResult) -> str:
    return (done.stderr or done.stdout).decode(errors="replace").strip()[-2000:]
