"""Harbor task folders read and checked without an engine: our three, and one error per thing
we cannot run (naming the file and the fix)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from atropos.environments.harbor import SHIPPED_TASKS, Harbor, bash_block
from atropos.environments.harbor.compose import main_service
from atropos.environments.harbor.image import built_name
from atropos.environments.harbor.task import TaskError, load_tasks, read_task
from atropos.environments.harbor.trial import rewards_of_json
from atropos.envs import registry


def task_copy(tmp_path: Path, name: str = "count-errors") -> Path:
    folder = tmp_path / name
    shutil.copytree(SHIPPED_TASKS / name, folder)
    return folder


def test_our_three_tasks_load_with_their_settings():
    tasks = {t.name: t for t in load_tasks(SHIPPED_TASKS)}
    assert sorted(tasks) == [
        "atropos/count-errors",
        "atropos/fix-median",
        "atropos/inventory-total",
    ]
    shell = tasks["atropos/count-errors"]
    assert (shell.agent_timeout, shell.verifier_timeout, shell.build_timeout) == (60, 60, 300)
    assert (shell.cpus, shell.memory_bytes, shell.disk_bytes) == (1, 512 << 20, 1024 << 20)
    assert "ERROR" in shell.instruction
    compose = main_service(tasks["atropos/inventory-total"], "img")
    assert compose.environment == {"SHOP_CURRENCY": "EUR"}
    assert compose.working_dir == "/srv/shop" and compose.build_args == ("SHOP_DIR=/srv/shop",)


def test_the_environment_is_registered():
    assert registry.get("harbor") is Harbor


def test_a_single_task_folder_is_a_task_set_of_one(tmp_path):
    assert [t.name for t in load_tasks(task_copy(tmp_path))] == ["atropos/count-errors"]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda f: (f / "tests/test.sh").unlink(), "tests/test.sh is missing"),
        (lambda f: (f / "instruction.md").unlink(), "instruction.md is missing"),
        (lambda f: (f / "environment/Dockerfile").unlink(), "environment/Dockerfile is missing"),
        (lambda f: _toml(f, "[agent]\ntimeout_sec = -1\n"), "[agent] timeout_sec must be a"),
        (lambda f: _toml(f, "[[steps]]\nname = 'a'\n"), "multi-step tasks"),
        (lambda f: _toml(f, "[verifier]\nenvironment_mode = 'own'\n"), "'shared' or 'separate'"),
        (
            lambda f: _toml(f, "[verifier]\nenvironment_mode = 'shared'\n[verifier.environment]\n"),
            "drop one of them",
        ),
        (lambda f: _toml(f, "[[verifier.collect]]\ncommand = 'true'\n"), "collect]] hooks"),
        (lambda f: _toml(f, "artifacts = ['out.txt']\n"), "needs an absolute `source`"),
        (lambda f: _toml(f, "artifacts = [{source = '/x', service = 'db'}]\n"), "service 'db'"),
        (lambda f: _toml(f, "[environment]\ngpus = 1\n"), "gpus = 1"),
        (lambda f: _toml(f, "[environment]\nmemory = 'lots'\n"), "like '2G'"),
        (lambda f: _toml(f, "[environment]\nenv = { K = '${ATROPOS_NOT_SET_X}' }\n"), "not set"),
        (lambda f: (f / "task.toml").write_text("[agent\n"), "cannot be read as TOML"),
    ],
)
def test_a_task_we_cannot_run_is_one_error_naming_what_and_how(tmp_path, edit, said):
    folder = task_copy(tmp_path)
    edit(folder)
    with pytest.raises(TaskError, match=None) as raised:
        read_task(folder)
    assert said in str(raised.value) and str(folder) in str(raised.value)


def test_the_separate_verifier_settings_are_read_as_harbor_resolves_them(tmp_path):
    folder = task_copy(tmp_path)
    assert read_task(folder).verifier_mode == "shared"  # unset: shared
    _toml(folder, "[verifier]\nenvironment_mode = 'separate'\n")
    task = read_task(folder)
    assert (task.verifier_mode, task.verifier_environment, task.artifacts) == ("separate", None, ())
    _toml(  # [verifier.environment] alone implies separate
        folder,
        "artifacts = ['/app/out', {source = '/var/log/x', exclude = ['*.tmp']}]\n"
        "[verifier.environment]\ndocker_image = 'judge:1'\ncpus = 2\nmemory_mb = 512\n",
    )
    task = read_task(folder)
    assert task.verifier_mode == "separate"
    assert task.verifier_environment is not None
    assert task.verifier_environment.docker_image == "judge:1"
    assert (task.verifier_environment.cpus, task.verifier_environment.memory_bytes) == (
        2.0,
        512 << 20,
    )
    assert [(a.source, a.exclude) for a in task.artifacts] == [
        ("/app/out", ()),
        ("/var/log/x", ("*.tmp",)),
    ]


def _toml(folder: Path, text: str) -> None:
    (folder / "task.toml").write_text('schema_version = "1.4"\n' + text)


def test_legacy_sizes_and_env_templates_are_read(tmp_path, monkeypatch):
    folder = task_copy(tmp_path)
    monkeypatch.setenv("ATROPOS_HARBOR_T", "x")
    _toml(folder, "[environment]\nmemory = '2G'\nstorage = '512M'\n"
          "env = { A = '${ATROPOS_HARBOR_T}', B = '${ATROPOS_HARBOR_U:-d}' }\n")  # fmt: skip
    task = read_task(folder)
    assert (task.memory_bytes, task.disk_bytes) == (2 << 30, 512 << 20)
    assert dict(task.env) == {"A": "x", "B": "d"}


def test_compose_sidecars_and_volumes_are_refused_with_the_reason(tmp_path):
    folder = task_copy(tmp_path, "inventory-total")
    compose = folder / "environment/docker-compose.yaml"
    compose.write_text("services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n")
    with pytest.raises(TaskError, match=r"services besides `main` \(db\)"):
        main_service(read_task(folder), "img")
    compose.write_text("services:\n  main:\n    build: .\n    volumes: ['/etc:/host']\n")
    with pytest.raises(TaskError, match="volumes is not supported"):
        main_service(read_task(folder), "img")
    compose.write_text("services:\n  main:\n    build: ../..\n")
    with pytest.raises(TaskError, match="outside the task folder"):
        main_service(read_task(folder), "img")


def test_a_built_image_name_follows_the_context(tmp_path):
    folder = task_copy(tmp_path)
    task = read_task(folder)
    before = built_name(task, main_service(task, "x"))
    assert before.startswith("harbor-atropos-count-errors:")
    (folder / "environment/logs/new.log").write_text("ERROR\n")
    assert built_name(task, main_service(task, "x")) != before


def test_rewards_and_answers_are_read_as_harbor_reads_them():
    assert rewards_of_json('{"reward": 1, "checks_passed": 2}') == {
        "reward": 1.0,
        "checks_passed": 2.0,
    }
    for bad in ('{"reward": "1"}', '{"reward": NaN}', "[", "{}"):
        with pytest.raises(ValueError, match="reward.json"):
            rewards_of_json(bad)
    assert bash_block("a\n```sh\nls\n```\nthen\n```bash\npwd\n```") == "pwd\n"
