"""The text of the files `atropos env new` writes (`atropos.envs.scaffold`), as
`string.Template`s: `$name` (the environment and distribution name), `$module` (its import
name), `$cls` (the environment class) and `$config_cls` (its config class); `$$` is a dollar.
The README also names `$python` and `$atropos`: the commands of the install that writes it
(`setup_commands`).
"""

from __future__ import annotations

import os
import shlex
from string import Template

from atropos.install import atropos_command, python_command


def setup_commands() -> dict[str, str]:
    """`python` and `atropos` as the install that runs this names them (`atropos.install`):
    `python` and `atropos` in an activated virtualenv, else their full paths."""
    return {"python": python_command(), "atropos": atropos_command()}


def next_step(root: str | os.PathLike[str]) -> str:
    """The one command that installs the package in folder `root` into this Python and runs
    its tests (`pytest` comes with the package's `test` extra)."""
    python = python_command()
    cd = shlex.quote(os.fspath(root))
    return f"cd {cd} && {python} -m pip install -e '.[test]' && {python} -m pytest"


PYPROJECT = Template("""\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$name"
version = "0.1.0"
description = "The $name environment for Atropos."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["atropos-rl"]

[project.optional-dependencies]
test = ["pytest"]

# How Atropos finds the environment once this package is installed: `atropos env list` shows it
# and `atropos env process $name` runs it.
[project.entry-points."atropos.environments"]
$name = "$module.env:$cls"

[tool.setuptools.packages.find]
include = ["$module*"]

[tool.setuptools.package-data]
$module = ["data/*.jsonl"]

[tool.pytest.ini_options]
testpaths = ["tests", "$module"]
addopts = "--doctest-modules"
""")

INIT = Template('''\
"""The $name environment for Atropos: `$module.env.$cls`."""

from $module.env import $cls, $config_cls

__all__ = ["$cls", "$config_cls"]
''')

ENV = Template('''\
"""`$name`: answer a short question; 1.0 when the answer in <answer></answer> is right.

Made by `atropos env new $name`. Where to change what:

- the items: `data/train.jsonl` (one `{"question": ..., "answer": ...}` per line), or `load()`;
- the prompt: `system_prompt`, or override `prompt(item)` to build the whole conversation;
- the reward: `score()` (and `extract_answer`, `same_answer` that it uses);
- settings: fields of `$config_cls`, each one a flag (`--env.data_file rows.jsonl`).

>>> extract_answer("It is the largest city. <answer> Paris </answer>")
'Paris'
>>> same_answer("paris.", "Paris")
True
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env
from pydantic import Field

DATA = Path(__file__).parent / "data" / "train.jsonl"  # shipped with the package
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def read_rows(path: str | Path = DATA) -> list[dict[str, Any]]:
    """The rows of a JSONL file (one JSON object per line; blank lines are skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def extract_answer(completion: str) -> str | None:
    """The stripped text of the completion's last <answer>...</answer> block; None if none."""
    found = ANSWER.findall(completion)
    return found[-1].strip() if found else None


def same_answer(given: str, expected: str) -> bool:
    """Whether two answers match, ignoring case, repeated spaces and a final period."""

    def norm(text: str) -> str:
        return " ".join(text.lower().split()).rstrip(".")

    return norm(given) == norm(expected)


class $config_cls(BaseEnvConfig):
    """The settings of `$name`: every environment's (group_size, max_token_length, ...) and
    these; each field is a flag (`--env.FIELD`) and a key under `env:` in a `--config` file."""

    data_file: str | None = Field(
        default=None, description="a JSONL file of question/answer rows (unset: the shipped data)"
    )


class $cls(Env[$config_cls]):
    """Answer short questions; 1.0 for the right answer in <answer></answer>, else 0.0."""

    name = "$name"
    # this env's defaults; flags and `--config` files override them
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4,
        "max_token_length": 512,
        "use_wandb": False,
    }
    system_prompt = (
        "Answer the question. Think if you need to, then give only the final answer inside"
        " <answer></answer> tags."
    )

    def load(self) -> list[dict[str, Any]]:
        # The training items. The default prompt() asks an item's "question" as the user turn.
        return read_rows(self.config.data_file or DATA)

    def score(self, item: dict[str, Any], completion: str) -> float:
        # The reward of one completion: 1.0 for the expected answer, else 0.0.
        answer = extract_answer(completion)
        return 1.0 if answer is not None and same_answer(answer, str(item["answer"])) else 0.0
''')

DATA = Template("""\
{"question": "What is 7 + 5?", "answer": "12"}
{"question": "What is 9 times 3?", "answer": "27"}
{"question": "What is the capital of France?", "answer": "Paris"}
{"question": "What is the capital of Japan?", "answer": "Tokyo"}
{"question": "How many legs does a spider have?", "answer": "8"}
{"question": "Which planet is closest to the Sun?", "answer": "Mercury"}
""")

TEST = Template('''\
"""Tests of `$name`: its reward rule, and a check of the whole environment against a fake
policy server (`atropos.testing.FakeInferenceServer`: real HTTP on 127.0.0.1, no model)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from atropos.envs.check import check_env
from atropos.inference.config import APIServerConfig
from atropos.testing import FakeInferenceServer

from $module.env import $cls, read_rows

ITEM = {"question": "What is 7 + 5?", "answer": "12"}


def right_answer(prompt_text: str) -> str | None:
    """A fake policy that knows every answer of the shipped data (None: random text)."""
    for row in read_rows():
        if row["question"] in prompt_text:
            return f"Let me see. <answer>{row['answer']}</answer>"
    return None


@pytest.fixture(scope="module")
def policy() -> Iterator[FakeInferenceServer]:
    """The fake server, answering right; stopped when the tests of this file are done."""
    with FakeInferenceServer(responder=right_answer) as server:
        yield server


def make_env(base_url: str) -> $cls:
    """The environment with its own defaults, its one policy server at `base_url`."""
    config, _ = $cls.config_init()
    server = APIServerConfig(base_url=base_url, model_name="atropos-tiny", server_type="vllm")
    return $cls(config, [server])


def test_score_rewards_only_the_right_answer() -> None:
    env = make_env("http://127.0.0.1:9/v1")  # scoring calls no server
    assert env.score(ITEM, "Seven and five. <answer>12</answer>") == 1.0
    assert env.score(ITEM, "<answer> 12. </answer>") == 1.0
    assert env.score(ITEM, "<answer>13</answer>") == 0.0
    assert env.score(ITEM, "12") == 0.0  # no <answer> tags


def test_the_environment_keeps_the_contract(policy: FakeInferenceServer) -> None:
    report = check_env(make_env(policy.base_url), items=2)
    assert report.groups == 2 and report.token_sources == {"server"}


def test_a_policy_that_knows_the_answers_scores_1(policy: FakeInferenceServer) -> None:
    env = make_env(policy.base_url)

    async def one_group() -> list[float]:
        await env.setup()
        try:
            group, _ = await env.collect_trajectories(await env.get_next_item())
        finally:
            await env.aclose()
        assert group is not None
        return list(group["scores"])

    assert asyncio.run(one_group()) == [1.0] * env.config.group_size
''')

README = Template("""\
# $name

An environment for [Atropos](https://pypi.org/project/atropos-rl/): short questions, with a
reward of 1.0 for the right answer inside `<answer></answer>` tags. The environment is
`$module/env.py`; its data is `$module/data/train.jsonl`.

## Install

Into the Python environment where `atropos-rl` is installed. The commands below name its
interpreter and its `atropos` as they were found when this package was written: by their full
paths, or plain `python` and `atropos` where those were on `PATH` (an activated virtualenv).

```bash
$python -m pip install -e '.[test]'     # the package, and pytest for its tests
$atropos env list          # lists $name, from $name 0.1.0
```

## Test

```bash
$python -m pytest
```

The tests run `check_env` against `atropos.testing.FakeInferenceServer`, a fake policy server
on 127.0.0.1 that answers every question of the data right, and check the reward rule.

## Run

Against the local CPU server and its tiny policy (offline; its answers are noise):

```bash
$atropos local serve tiny &
$atropos env process $name --env.total_steps 4 --env.data_path_to_save_groups runs/$module.jsonl
```

Against another inference server, and with your own data:

```bash
$atropos env process $name --openai.base_url http://127.0.0.1:8000/v1 \\
    --openai.model_name MODEL --openai.server_type vllm --env.data_file rows.jsonl
```

`atropos env serve $name` sends the scored groups to a trajectory API for training, and
`atropos env process $name --help` lists every setting.
""")
