"""Harbor tasks run for real: the tests' Docker engine, the task images built from their
folders, the docker provider's containers. Our three tasks' oracles pass and a wrong agent
fails; an agent past its timeout is killed and still scored; a broken task is excluded; a
missing image and a dying sandbox fail the rollout with their reason, never a score; and
`atropos env process harbor` makes scored groups against the fake policy server."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.harbor import SHIPPED_TASKS, Harbor
from atropos.environments.harbor.image import task_image
from atropos.environments.harbor.task import HarborTask, load_tasks, read_task
from atropos.environments.harbor.trial import Agent, Limits, TrialResult, run_trial
from atropos.envs import cli
from atropos.sandbox import SandboxError
from atropos.testing import FakeInferenceServer

from .helpers import OFFLINE, make_env, read_jsonl

BASE = "atropos-harbor:bookworm"  # what our tasks' Dockerfiles name (docs/harbor.md)
LIMITS = Limits(start_timeout=60.0)


@pytest.fixture(scope="module")
def engine(
    docker_engine: Any, sandbox_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """`DOCKER_HOST` at the tests' engine, and our tasks' base: the sandbox tests' image
    (python3, pytest, bash) tagged under the name the task folders use."""
    docker_engine.docker(["tag", sandbox_image, BASE], check=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", docker_engine.host)
        # the task images these tests build are saved here, not in the machine's cache
        patch.setenv("ATROPOS_IMAGE_CACHE", str(tmp_path_factory.mktemp("harbor-images")))
        yield docker_engine


def tasks() -> dict[str, HarborTask]:
    return {t.path.name: t for t in load_tasks(SHIPPED_TASKS)}


def trial(task: HarborTask, agent: Agent, limits: Limits = LIMITS) -> TrialResult:
    image = task_image(task)
    return asyncio.run(run_trial(task, image, agent, limits))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["count-errors", "fix-median", "inventory-total"])
def test_our_tasks_oracles_pass_and_a_wrong_agent_fails(engine, name):
    task = tasks()[name]
    oracle = trial(task, Agent("oracle"))
    assert (oracle.failure, oracle.reward) == (None, 1.0), oracle.detail
    wrong = trial(task, Agent("script", "echo 0 > /app/errors.txt; touch wrong.txt"))
    assert (wrong.failure, wrong.reward) == (None, 0.0), wrong.detail
    if name == "inventory-total":  # reward.json, with a key besides the reward
        assert oracle.rewards == {"reward": 1.0, "checks_passed": 2.0}
        assert wrong.rewards == {"reward": 0.0, "checks_passed": 0.0}


@pytest.mark.slow
def test_a_scripted_agent_gets_the_instruction_as_a_file_and_a_variable(engine):
    task = tasks()["count-errors"]
    command = (
        'grep -q "ERROR" "$HARBOR_INSTRUCTION_FILE" && [ -n "$HARBOR_INSTRUCTION" ]'
        " && cat /app/logs/*.log | grep -c ERROR > /app/errors.txt"
    )
    done = trial(task, Agent("command", command))
    assert (done.failure, done.reward, done.agent_exit) == (None, 1.0, 0), done.agent_output


@pytest.mark.slow
def test_an_agent_past_its_timeout_is_killed_and_still_scored(engine):
    task = dataclasses.replace(tasks()["count-errors"], agent_timeout=1.0)
    started = time.monotonic()
    done = trial(task, Agent("script", "sleep 60; echo 3 > /app/errors.txt"))
    assert done.agent_timed_out and done.agent_exit == -9
    assert (done.failure, done.reward) == (None, 0.0)  # the verifier ran on what was left
    assert time.monotonic() - started < 45  # the 60 s sleep did not run out


@pytest.mark.slow
def test_a_sandbox_that_dies_fails_the_rollout_with_its_reason(engine):
    task = tasks()["count-errors"]
    done = trial(task, Agent("script", "echo 3 > /app/errors.txt; kill -TERM 1; sleep 30"))
    assert done.reward is None
    assert done.failure in ("dead", "closed"), (done.failure, done.detail)


def copy_task(tmp_path: Path, name: str, new: str) -> Path:
    folder = tmp_path / new
    shutil.copytree(SHIPPED_TASKS / name, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace(f"atropos/{name}", f"atropos/{new}"))
    return folder


@pytest.mark.slow
def test_a_missing_image_fails_with_its_reason_and_the_stand_in_command(engine, tmp_path):
    folder = copy_task(tmp_path, "count-errors", "wild-base")
    dockerfile = folder / "environment/Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(BASE, "python:3.11-slim"))
    with FakeInferenceServer(responder=answer) as fake:
        env = make_env(Harbor, fake.base_url, tasks=str(folder), group_size=2)

        async def main() -> tuple[TrialResult, BaseException | None]:
            await env.setup()
            first = await env.trial(env.items[0], Agent("oracle"))
            try:  # a rollout of the group: failed, never scored
                await env.collect_trajectories(env.items[0])
            except SandboxError as error:
                return first, error
            return first, None

        first, raised = asyncio.run(main())
    assert first.failure == "image_missing" and first.reward is None
    assert isinstance(raised, SandboxError) and raised.reason == "image_missing"
    assert env.failures == {"image_missing": 2}
    assert "atropos sandbox image build python:3.11-slim --debian" in first.detail


@pytest.mark.slow
def test_a_task_whose_oracle_fails_is_reported_broken_and_never_sampled(engine, tmp_path):
    root = tmp_path / "tasks"
    copy_task(root, "count-errors", "count-errors")
    broken = copy_task(root, "count-errors", "off-by-one")
    (broken / "solution/solve.sh").write_text("#!/bin/bash\necho 4 > /app/errors.txt\n")
    env = make_env(Harbor, OFFLINE, tasks=str(root), oracle=True)

    async def main() -> None:
        await env.setup()
        await env.aclose()

    asyncio.run(main())
    assert [t.name for t in env.items] == ["atropos/count-errors"]
    assert env.broken == {"atropos/off-by-one": "its oracle scored 0, below 1"}


def answer(prompt: str) -> str:
    """The fake policy: the right command on one turn, a wrong one on the next."""
    answer.turn = getattr(answer, "turn", 0) + 1  # type: ignore[attr-defined]
    if answer.turn % 2:  # type: ignore[attr-defined]
        return "I count them.\n```bash\ncat /app/logs/*.log | grep -c ERROR > /app/errors.txt\n```"
    return "Easy.\n```bash\ncat /app/logs/* | grep -c ERROR > /app/errors.txt\n```"


@pytest.mark.slow
def test_env_process_harbor_makes_scored_groups(engine, tmp_path):
    out = tmp_path / "groups.jsonl"
    task = SHIPPED_TASKS / "count-errors"
    with FakeInferenceServer(responder=answer) as fake:
        argv = ["process", f"--openai.base_url={fake.base_url}", "--env.total_steps=2",
                "--env.group_size=2", f"--env.data_path_to_save_groups={out}",
                f"--env.tasks={task}"]  # fmt: skip
        assert cli.main(Harbor, argv) == 0
    groups = read_jsonl(out)
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 1.0]
        assert "/app/logs" in group["messages"][0][0]["content"]


def harbor_cli_or_skip() -> Any:
    """scripts/harbor_cli.py, its root made (cached; 49 s the first time, reaching the
    Debian mirror and PyPI), or a skip saying why it cannot be."""
    import importlib.util

    where = Path(__file__).resolve().parents[2] / "scripts" / "harbor_cli.py"
    spec = importlib.util.spec_from_file_location("harbor_cli", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.ensure_root()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"the harbor CLI root cannot be built here: {error}")
    return module


INIT_FILLED = {  # the three files `harbor tasks init` tells the author to fill
    "instruction.md": "Write the word harbor to /app/answer.txt.\n",
    "solution/solve.sh": "#!/bin/bash\necho harbor > /app/answer.txt\n",
    "tests/test.sh": "#!/bin/bash\nif grep -qx harbor /app/answer.txt; then echo 1;"
    " else echo 0; fi > /logs/verifier/reward.txt\n",
}


# What `uv pip install pytest-json-ctrf` would add to a stand-in: pytest's `--ctrf PATH`
# option, writing a small CTRF-shaped report (a stand-in for the plugin, not its output).
CTRF_STAND_IN = """import json
def pytest_addoption(parser):
    parser.addoption("--ctrf", default=None)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.getoption("ctrf"):
        passed = len(terminalreporter.stats.get("passed", []))
        with open(config.getoption("ctrf"), "w") as out:
            json.dump({"results": {"summary": {"passed": passed}}}, out)
"""


def oracle_of(folder: Path) -> TrialResult:
    env = make_env(Harbor, OFFLINE, tasks=str(folder))

    async def main() -> TrialResult:
        await env.setup()
        return await env.trial(env.items[0], Agent("oracle"))

    return asyncio.run(main())


def fill(folder: Path, answer: str = "/app/answer.txt") -> HarborTask:
    for name, text in INIT_FILLED.items():
        (folder / name).write_text(text.replace("/app/answer.txt", answer))
    return read_task(folder)


def provide_verifier_image(engine: Any, name: str, tests: Path, tmp_path: Path) -> None:
    """The verifier image as if built elsewhere: the stand-in, the tests, --ctrf's stand-in."""
    context = tmp_path / "judge"
    shutil.copytree(tests, context / "tests")
    (context / "ctrf_stand_in.py").write_text(CTRF_STAND_IN)
    (context / "Dockerfile").write_text(
        "FROM python:3.12-slim\nCOPY ctrf_stand_in.py /usr/lib/python3/dist-packages/\n"
        'ENV PYTEST_ADDOPTS="-p ctrf_stand_in"\nWORKDIR /app\nCOPY tests /tests/\n'
    )
    engine.docker(["build", "--pull=false", "-q", "-t", name, str(context)], check=True)


@pytest.mark.slow
def test_a_task_made_by_harbor_tasks_init_runs_unchanged(engine, tmp_path, sandbox_image):
    """Harbor's default `tasks init` (a separate verifier built from tests/Dockerfile:
    FROM python:3.12-slim, COPY --from=ghcr.io/astral-sh/uv, RUN uv pip install pytest
    pytest-json-ctrf), then --no-pytest (separate), --verifier-mode shared with and without
    --no-pytest. The stand-ins for ubuntu:24.04 and python:3.12-slim are the sandbox tests'
    image tagged under those names: Debian with bash, tar, python3 and pytest, all that the
    templates' files run offline."""
    harbor_cli = harbor_cli_or_skip()
    made = tmp_path / "made"
    harbor_cli.harbor(["tasks", "init", "atropos/default", "-p", str(made)])
    harbor_cli.harbor(["tasks", "init", "atropos/no-pytest", "--no-pytest", "-p", str(made)])
    for name, flags in (("shared", ["--no-pytest"]), ("shared-pytest", [])):
        harbor_cli.harbor(["tasks", "init", f"atropos/{name}", "--verifier-mode", "shared",
                           *flags, "-p", str(made)])  # fmt: skip
    default = read_task(made / "default")
    assert default.verifier_mode == "separate" and (made / "default/tests/Dockerfile").is_file()
    missing = oracle_of(made / "default")  # FROM ubuntu:24.04, which is never pulled
    assert missing.failure == "image_missing" and "ubuntu:24.04" in missing.detail
    for name in ("ubuntu:24.04", "python:3.12-slim"):
        engine.docker(["tag", sandbox_image, name], check=True)  # the stand-ins
    try:
        offline = oracle_of(made / "default")  # its verifier image needs ghcr.io and PyPI
        assert offline.failure == "image_build", offline.detail
        assert "COPY --from=ghcr.io/astral-sh/uv:0.9.7" in offline.detail
        assert "docker load" in offline.detail and "--debian" in offline.detail
        judge = offline.detail.split("provide ", 1)[1].split(" instead", 1)[0]
        provide_verifier_image(engine, judge, made / "default/tests", tmp_path)
        placeholder = oracle_of(made / "default")  # test_outputs.py's placeholder passes
        assert (placeholder.failure, placeholder.reward) == (None, 1.0), placeholder.detail

        separate = oracle_of(made / "no-pytest")  # its tests/Dockerfile builds offline
        assert separate.failure == "no_reward", separate.detail  # test.sh writes none yet
        task = fill(made / "no-pytest")  # /app/answer.txt stays in the agent's container
        assert trial(task, Agent("oracle")).reward == 0.0  # as in Harbor: not handed over
        task = fill(made / "no-pytest", "/logs/artifacts/answer.txt")  # what is handed over
        assert trial(task, Agent("oracle")).reward == 1.0
        wrong = "echo boat > /logs/artifacts/answer.txt"
        assert trial(task, Agent("script", wrong)).reward == 0.0

        shared = oracle_of(made / "shared")
        assert shared.failure == "no_reward", shared.detail
        task = fill(made / "shared")
        assert trial(task, Agent("oracle")).reward == 1.0
        assert trial(task, Agent("script", "echo boat > /app/answer.txt")).reward == 0.0
        # shared with pytest: test.sh fetches curl and uv first; offline it writes 0
        fetching = oracle_of(made / "shared-pytest")
        assert (fetching.failure, fetching.reward) == (None, 0.0), fetching.detail
    finally:
        engine.docker(["rmi", "ubuntu:24.04", "python:3.12-slim"])


@pytest.mark.slow
def test_a_separate_verifier_is_handed_the_artifacts_only(engine, tmp_path):
    """The verifier's own sandbox sees /logs/artifacts and the listed `artifacts`, not the
    agent's other files; the task's image, saved when built, is loaded after an rmi."""
    folder = copy_task(tmp_path, "count-errors", "judged")
    toml = folder / "task.toml"
    text = toml.read_text().replace('environment_mode = "shared"', 'environment_mode = "separate"')
    toml.write_text(text.replace("\n[task]", "artifacts = ['/app/errors.txt']\n\n[task]", 1))
    (folder / "tests/test.sh").write_text(
        "#!/bin/bash\n[ -e /app/unlisted.txt ] && echo 0 > /logs/verifier/reward.txt && exit\n"
        "n=$(cat /app/errors.txt); a=$(cat /logs/artifacts/note.txt)\n"
        '[ "$n" = 3 ] && [ "$a" = seen ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    task = read_task(folder)
    assert (task.verifier_mode, [a.source for a in task.artifacts]) == (
        "separate",
        ["/app/errors.txt"],
    )
    solve = ("cat /app/logs/*.log | grep -c ERROR > /app/errors.txt; touch /app/unlisted.txt;"
             " echo seen > /logs/artifacts/note.txt")  # fmt: skip
    done = trial(task, Agent("script", solve))
    assert (done.failure, done.reward) == (None, 1.0), done.detail
    engine.docker(["rmi", task_image(task).name], check=True)
    assert task_image(task).how == "loaded"  # from the image cache's archive, not rebuilt
