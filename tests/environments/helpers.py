"""Shared scaffolding of the environment tests: an env built against a (fake) policy server,
groups rolled out, `check_env`, `process` and `evaluate` runs against
`atropos.testing.FakeInferenceServer` and what they write, and a stand-in `datasets` module for
the hub loaders. What a test asserts stays in the test."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import sys
import types
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from atropos.envs import cli
from atropos.envs.base import BaseEnv
from atropos.envs.check import CheckReport, check_env
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.envs.layering import load_defaults
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.simple import Rollout
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.testing import FakeInferenceServer

OFFLINE = "http://127.0.0.1:9/v1"  # nothing listens: for envs that never generate
E = TypeVar("E", bound=BaseEnv)
Responder = Callable[[str], Any]
Make = Callable[..., Any]  # `make(url, mode="process", **env)`: a test module's env factory


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def decode_png(b64: str) -> Any:
    """The picture in base64 text, checked to be a PNG, loaded with Pillow (the vision tests)."""
    from PIL import Image

    raw = base64.b64decode(b64, validate=True)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(raw))
    image.load()
    return image


# ----- building and rolling out -------------------------------------------------------------------


def env_defaults(cls: type[BaseEnv]) -> tuple[Any, list[APIServerConfig]]:
    """(env config, servers) of `cls` as the runner reads them: `config_init()`, with the
    local CPU server where it names none (a default `config_init` from `config_defaults`)."""
    defaults = load_defaults(cls)
    assert isinstance(defaults.servers, list), f"{cls.__name__}: servers {defaults.servers!r}"
    assert isinstance(defaults.env, BaseEnvConfig)
    return defaults.env, defaults.servers


def make_env(
    cls: type[E],
    url: str = OFFLINE,
    mode: str = "process",
    *,
    group_size: int | None = 4,
    server_type: str | None = None,
    validate: bool = False,
    **env: Any,
) -> E:
    """`cls` with its `config_init()` defaults, `group_size` (None: the default's) and `env` on
    top, its one policy server at `url` (of `server_type` when given), resolved for `mode`.

    The settings are copied in as given (`model_copy`); `validate=True` validates them instead,
    for configs that normalise what they are given."""
    defaults, [server] = env_defaults(cls)
    update = env if group_size is None else {"group_size": group_size, **env}
    if validate:
        config = cls.env_config_cls.model_validate({**defaults.model_dump(), **update})
    else:
        config = defaults.model_copy(update=update)
    where: dict[str, Any] = {"base_url": url}
    if server_type is not None:
        where["server_type"] = server_type
    servers = [server.model_copy(update=where)]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), mode)  # type: ignore[arg-type]
    return cls(config, servers, manager=resolved.manager)


def rollout(trained: int = 20, *, text: str = "x", finish: str = "stop") -> Rollout:
    """A server rollout of 5 prompt tokens (masked) and `trained` trained ones, for
    `score_group`."""
    return Rollout(text, [1] * (5 + trained), [-100] * 5 + [1] * trained, None, finish, "server")


def collect(env: BaseEnv, *items: Any) -> list[tuple[Any, list[Any]]]:
    """Set `env` up, roll out each of `items` in turn, close it: (group, backlog) per item."""

    async def main() -> list[tuple[Any, list[Any]]]:
        await env.setup()
        try:
            return [await env.collect_trajectories(item) for item in items]
        finally:
            await env.aclose()

    return asyncio.run(main())


def image_group(env: Any) -> tuple[Any, Any, Any, list[Any]]:
    """Set `env` up, collect one group of its first item while recording the messages of every
    chat request, close it: (item, group, backlog, the requests' messages)."""
    sent: list[Any] = []

    async def main() -> tuple[Any, Any, Any]:
        await env.setup()
        real = env.server.chat_completion

        async def spy(**kwargs: Any) -> Any:
            sent.append(kwargs["messages"])
            return await real(**kwargs)

        env.server.chat_completion = spy
        item = env.items[0]
        group, backlog = await env.collect_trajectories(item)
        await env.aclose()
        return item, group, backlog

    item, group, backlog = asyncio.run(main())
    return item, group, backlog, sent


def trained_runs(node: Any) -> list[list[int]]:
    """The runs of trained tokens of a sequence, checking masked logprobs are 1.0 and trained
    ones the server's (below 0)."""
    runs, current = [], []
    for token, mask, lp in zip(node.tokens, node.masked_tokens, node.logprobs, strict=True):
        if mask == -100:
            assert lp == 1.0
            if current:
                runs.append(current)
            current = []
        else:
            assert mask == token and lp < 0
            current.append(token)
    return [*runs, current] if current else runs


def check_against(make: Make, responder: Responder, items: int = 3, **env: Any) -> CheckReport:
    """`check_env` over `items` items of `make(url, **env)`, whose policy is a fake server
    answering with `responder`."""
    with FakeInferenceServer(responder=responder) as fake:
        return check_env(make(fake.base_url, **env), items=items)


# ----- process runs -------------------------------------------------------------------------------


class Processed:
    """What a `process` run wrote at `out`: the groups (JSONL), and beside them the HTML page,
    the final metrics (`.metrics.json`) and the metric records (`.metrics.jsonl`)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    @cached_property
    def groups(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out)

    @cached_property
    def page(self) -> str:
        return self.out.with_suffix(".html").read_text()

    @cached_property
    def metrics(self) -> dict[str, Any]:
        return json.loads(self.out.with_suffix(".metrics.json").read_text())

    @cached_property
    def metric_records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out.with_suffix(".metrics.jsonl"))


def process_through_cli(
    cls: type[BaseEnv], responder: Responder, out: Path, *, steps: int = 3, group_size: int = 2
) -> Processed:
    """`process` through the env's command line (`atropos.envs.cli.main`) against a fake server
    answering with `responder`: `steps` groups of `group_size`, written to `out`."""
    with FakeInferenceServer(responder=responder) as fake:
        argv = [
            "process",
            f"--openai.base_url={fake.base_url}",
            f"--env.total_steps={steps}",
            f"--env.group_size={group_size}",
            f"--env.data_path_to_save_groups={out}",
        ]
        assert cli.main(cls, argv) == 0
    return Processed(out)


def process_with_runner(env: BaseEnv) -> Processed:
    """Run `env` (built with `total_steps` and `data_path_to_save_groups`) in process mode with
    `ProcessRunner` to the end; what it wrote."""
    resolved = ResolvedConfig(env.config, env.server_configs, env.manager_config, "process")
    assert asyncio.run(ProcessRunner(env, resolved).run(show_progress=False)) == 0
    return Processed(Path(env.config.data_path_to_save_groups))  # type: ignore[arg-type]


# ----- evaluation ---------------------------------------------------------------------------------


class EvalFiles:
    """What an evaluation wrote to `out`: `metrics.json` (`doc`) and `samples.jsonl`."""

    def __init__(self, out: Path) -> None:
        self.out = out

    @cached_property
    def doc(self) -> dict[str, Any]:
        return json.loads((self.out / "metrics.json").read_text())

    @cached_property
    def samples(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out / "samples.jsonl")

    @property
    def temperature(self) -> float:
        return self.doc["config_general"]["generation_parameters"]["temperature"]


class Evaluation(EvalFiles):
    """What `evaluate()` returned (`metrics`), and what it wrote to `out`."""

    def __init__(self, metrics: dict[str, Any], out: Path) -> None:
        super().__init__(out)
        self.metrics = metrics


def evaluate(env: BaseEnv, setup: bool = False) -> Any:
    """`env.evaluate()` (after `env.setup()` when `setup`), the env closed after."""

    async def main() -> Any:
        try:
            if setup:
                await env.setup()
            return await env.evaluate()
        finally:
            await env.aclose()

    return asyncio.run(main())


def evaluate_against(
    make: Make, responder: Responder, out: Path, *, setup: bool = False, **env: Any
) -> Evaluation:
    """`evaluate` of `make(url, "evaluate", data_dir_to_save_evals=out, **env)` against a fake
    server answering with `responder`."""
    with FakeInferenceServer(responder=responder) as fake:
        environment = make(fake.base_url, "evaluate", data_dir_to_save_evals=str(out), **env)
        metrics = evaluate(environment, setup=setup)
    return Evaluation(metrics, out)


# ----- the hub, and imports -----------------------------------------------------------------------


class HubCall(NamedTuple):
    name: str
    config: str | None
    split: str | None


def fake_hub(
    monkeypatch: pytest.MonkeyPatch,
    rows: list[Any] | Callable[[str, str | None], list[Any]],
    only: str | None = None,
) -> list[HubCall]:
    """Put a stand-in `datasets` module in `sys.modules` whose `load_dataset(name, config,
    split)` gives a copy of `rows` (or `rows(name, split)`, a function); with `only`, any other
    name raises FileNotFoundError. Returns the calls it gets, in order."""
    calls: list[HubCall] = []

    def load_dataset(name: str, config: Any = None, split: Any = None, **kwargs: Any) -> Any:
        calls.append(HubCall(name, config, split))
        if only is not None and name != only:
            raise FileNotFoundError(name)
        return rows(name, split) if callable(rows) else list(rows)

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def modules_loaded_by(imports: str, watched: Iterable[str]) -> list[str]:
    """Which of `watched` a fresh interpreter holds after `import <imports>`, sorted."""
    found = f"sorted({set(watched)!r} & set(sys.modules))"
    code = f"import json, sys, {imports}; print(json.dumps({found}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
