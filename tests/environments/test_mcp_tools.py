"""The `mcp_tools` environment: its tasks and reward rules on hand-made cases, tool names and
results, and episodes against the shipped fixture MCP server (a real subprocess) played by a
scripted fake policy: scores, token fidelity, the turn and token limits, `check_env`, `process`,
`evaluate`, and a run against the local CPU server."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from atropos.environments.mcp_tools import MCPTools, MCPToolsConfig, demo_responder
from atropos.environments.mcp_tools.config import MCPServerSpec, fixture_server
from atropos.environments.mcp_tools.demo import reply_for, step_of
from atropos.environments.mcp_tools.env import SYSTEM_PROMPT
from atropos.environments.mcp_tools.fixture_server import (
    FixtureError,
    convert_units,
    items_in_category,
    lookup_item,
)
from atropos.environments.mcp_tools.servers import (
    ToolReply,
    ToolServerError,
    _Server,
    exposed_names,
    result_text,
)
from atropos.environments.mcp_tools.tasks import (
    Task,
    answer_score,
    call_share,
    episode_score,
    extract_answer,
    load_tasks,
    to_task,
)
from atropos.envs.config import ConfigError
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    make_env,
    modules_loaded_by,
    trained_runs,
)

make = partial(make_env, MCPTools)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def block(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps(call(name, **arguments))}</tool_call>"


# ----- tasks and reward rules ---------------------------------------------------------------------


def test_numeric_string_list_and_checker_answers():
    number = to_task({"prompt": "p", "answer": 26.1, "tolerance": 0.01}, "r")
    assert answer_score(number, "about 26.098 miles") == 1.0
    assert answer_score(number, "26.2") == 0.0 and answer_score(number, "no idea") == 0.0
    assert answer_score(number, "from 10 km: 26.10") == 1.0  # the last number counts
    exact = to_task({"prompt": "p", "answer": 1250}, "r")
    assert answer_score(exact, "1,250 units") == 1.0 and answer_score(exact, "1251") == 0.0
    text = to_task({"prompt": "p", "answer": "Dry Bag"}, "r")
    assert answer_score(text, ' "dry  bag." ') == 1.0 and answer_score(text, "Dry Bags") == 0.0
    either = to_task({"prompt": "p", "answer": ["no", "out of stock"]}, "r")
    assert answer_score(either, "Out of stock!") == 1.0 and answer_score(either, "yes") == 0.0
    regex = to_task({"prompt": "p", "checker": {"regex": r"2025-0[23]-\d\d"}}, "r")
    assert answer_score(regex, "2025-02-28") == 1.0 and answer_score(regex, "2025-04-01") == 0.0
    contains = to_task({"prompt": "p", "checker": {"contains": ["camp", "stove"]}}, "r")
    assert answer_score(contains, "The Camp Stove") == 1.0 and answer_score(contains, "camp") == 0
    python = to_task({"prompt": "p", "checker": {"python": "operator:ne"}}, "r")
    assert answer_score(python, "x") == 1.0  # ne(answer, row): True (a checker's bool or score)


def test_final_answers_and_the_score_with_call_credit():
    assert extract_answer("<think>plan</think>It is <answer> 5.29 </answer>.") == "5.29"
    assert extract_answer("<answer>1</answer> no, <answer>2</answer>") == "2"
    assert extract_answer("<think>a <answer>9</answer></think>x") == "9"  # tags win
    assert extract_answer("<think>about 3</think> 4") == "4"
    task = to_task(
        {
            "prompt": "p",
            "answer": 5.29,
            "tolerance": 0.01,
            "expected_calls": [
                call("lookup_item", query="Camp Stove"),
                call("convert_units", value=2.4, from_unit="kg", to_unit="lb"),
            ],
        },
        "r",
    )
    made = [
        call("lookup_item", query="Camp Stove", extra=1),  # extra arguments allowed
        call("convert_units", value="2.4", from_unit="kg", to_unit="lb"),  # "2.4" is 2.4
    ]
    assert call_share(task, made) == 1.0 and call_share(task, made[::-1][:1]) == 0.5
    assert call_share(task, [call("lookup_item", query="Stove")]) == 0.0
    assert episode_score(task, "<answer>5.29</answer>", made, 0.2) == 1.0
    assert episode_score(task, "<answer>5.29</answer>", [], 0.2) == 0.8
    assert episode_score(task, "<answer>7</answer>", made[:1], 0.2) == 0.1
    assert episode_score(task, None, made, 0.2) == 0.2  # no final answer: the answer is wrong
    assert episode_score(task, "<answer>5.29</answer>", [], 0.0) == 1.0
    bare = Task("t", "p", answer=3)
    assert episode_score(bare, "3", [], 0.2) == 1.0  # no expected calls: the answer alone


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": 1}, "'prompt' must be a non-empty string"),
        ({"prompt": "p"}, "exactly one of 'answer' and 'checker'"),
        ({"prompt": "p", "answer": 1, "checker": {"regex": "x"}}, "exactly one of"),
        ({"prompt": "p", "checker": {"regex": "("}}, "does not compile"),
        ({"prompt": "p", "checker": {"python": "no_such_module_x:f"}}, "cannot be imported"),
        ({"prompt": "p", "checker": {"sql": "x"}}, "'checker' must be one of"),
        ({"prompt": "p", "checker": {"contains": []}}, "non-empty list"),
        ({"prompt": "p", "answer": 1, "expected_calls": [{"x": 1}]}, "'expected_calls'"),
        ({"prompt": "p", "answer": 1, "tolerance": "1"}, "'tolerance' must be a number"),
    ],
)
def test_bad_task_rows_are_named(row, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        to_task(row, "tasks.jsonl row 7")
    assert "tasks.jsonl row 7" in str(err.value)


def test_task_files_load_and_bad_files_are_config_errors(tmp_path: Path):
    train, test = load_tasks("train"), load_tasks("test")
    assert len(train) == 20 and len(test) == 6
    assert not {t.id for t in train} & {t.id for t in test}
    assert {len(t.expected_calls) for t in train} == {1, 2, 3}
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "2 + 2?", "answer": 4}\n')
    (folder / "test.jsonl").write_text('{"prompt": "3 + 3?"}\n')
    assert [t.answer for t in load_tasks("train", str(folder))] == [4]
    with pytest.raises(ConfigError, match=r"tasks/test\.jsonl row 1: give exactly one"):
        load_tasks("test", str(folder))


def test_shipped_answers_are_what_the_fixture_tools_compute():
    """Each shipped task whose expected calls the fixture can run alone gets its gold from them."""
    tools = {"convert_units": convert_units, "lookup_item": lookup_item}
    for task in load_tasks("train") + load_tasks("test"):
        [only] = task.expected_calls if len(task.expected_calls) == 1 else [None]
        if only is None or only["name"] != "convert_units":
            continue
        got = tools[only["name"]](**only["arguments"])
        assert answer_score(task, str(got)) == 1.0, task.id
    assert lookup_item("trail lamp")["price"] == 34.25
    with pytest.raises(FixtureError, match="known units"):
        convert_units(1, "km", "parsec")
    with pytest.raises(FixtureError, match="cannot convert length"):
        convert_units(1, "km", "kg")
    with pytest.raises(FixtureError, match="categories: camping, cycling, water"):
        items_in_category("golf")


# ----- tool names, results, config ----------------------------------------------------------------


def test_tool_names_are_prefixed_only_where_servers_share_them():
    by_server = {"calc": ["add", "mul"], "shop": ["add", "find"]}
    names = exposed_names(by_server, "auto")
    assert names == {
        ("calc", "add"): "calc__add",
        ("calc", "mul"): "mul",
        ("shop", "add"): "shop__add",
        ("shop", "find"): "find",
    }
    assert set(exposed_names(by_server, "always").values()) == {
        "calc__add", "calc__mul", "shop__add", "shop__find"
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"share tool names \['add'\].*prefix_tools auto"):
        exposed_names(by_server, "never")


def test_a_dead_instance_is_passed_over_once_no_restarts_are_left():
    async def main() -> list[str]:
        spec = MCPServerSpec(name="calc", command="calc-mcp", instances=3)
        server = _Server(spec, restarts=0)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        server.connections[1]._task = done  # its process went away by itself
        return [server._next_in_turn().label for _ in range(4)]

    assert asyncio.run(main()) == ["calc", "calc", "calc#2", "calc"]


def test_tool_results_become_tool_turn_text():
    text = SimpleNamespace(type="text", text="12.5")
    image = SimpleNamespace(type="image", mime_type="image/png", data="...")
    ok = SimpleNamespace(content=[text, image], structured_content=None, is_error=False)
    assert result_text(ok, 100).text == "12.5\n[image: image/png]"
    failed = SimpleNamespace(content=[], structured_content=None, is_error=True)
    assert result_text(failed, 100) == ToolReply("error: the tool failed", True)
    structured = SimpleNamespace(content=[], structured_content={"v": [1, 2]}, is_error=False)
    assert result_text(structured, 100).text == '{"v": [1, 2]}'
    long = SimpleNamespace(content=[SimpleNamespace(type="text", text="x" * 50)], is_error=False)
    assert result_text(long, 20).text == "x" * 20 + "... [cut 30 characters]"


def test_server_specs_validate_and_keep_secrets_out_of_saved_configs():
    spec = MCPServerSpec.model_validate(
        {"name": "files", "command": "npx", "args": ["-y", "srv"], "env": {"TOKEN": "s3cret"}}
    )
    assert spec.env["TOKEN"].get_secret_value() == "s3cret" and spec.instances == 1
    with pytest.raises(ValueError, match="Extra inputs"):
        MCPServerSpec.model_validate({"name": "x", "command": "y", "port": 1})
    with pytest.raises(ValueError, match="pattern"):
        MCPServerSpec.model_validate({"name": "a b", "command": "y"})
    config = MCPToolsConfig(servers=[spec])
    assert "s3cret" not in json.dumps(config.model_dump(mode="json"))
    assert fixture_server().args == ["-m", "atropos.environments.mcp_tools.fixture_server"]


def test_importing_the_package_or_the_fixture_server_stays_light():
    assert modules_loaded_by("atropos.environments.mcp_tools", ["mcp", "transformers"]) == []
    loaded = modules_loaded_by(
        "atropos.environments.mcp_tools.fixture_server", ["mcp", "atropos.envs", "pydantic"]
    )
    assert loaded == []  # the server imports the SDK only when it runs


# ----- episodes against the fixture server ------------------------------------------------------

STOVE = next(t for t in load_tasks("train") if t.id == "stove-pounds")  # lookup, convert, 5.29
LOOKUP, CONVERT = (
    block("lookup_item", query="Camp Stove"),
    block("convert_units", value=2.4, from_unit="kg", to_unit="lb"),
)


class Scripted:
    """A responder playing `script[i][t]` as rollout i's reply number t (`load` a new script
    for the next group).

    The first replies are one request with n=len(script): the fake asks once per choice, in
    order. Later, a rollout is recognised by the `rollout i` its first reply wrote."""

    def load(self, script: list[list[str]]) -> None:
        self.script = [[f"<think>rollout {i}</think>" + r for r in s] for i, s in enumerate(script)]
        self.first = iter(range(len(script)))
        self.asked: collections.Counter[tuple[int, int]] = collections.Counter()

    def __call__(self, prompt: str) -> str:
        t = prompt.count("<|im_start|>assistant") - 1  # replies so far (the tiny template)
        if t == 0:
            i = next(self.first)
        else:
            found = re.search(r"rollout (\d+)", prompt)
            assert found is not None, "a later turn continues the rollout's own conversation"
            i = int(found.group(1))
        self.asked[i, t] += 1
        return self.script[i][t]


def with_env(scenarios: Any, **settings: Any) -> None:
    """Run `await scenarios(env, responder)` on an env set up against a fake policy answering
    with a `Scripted` responder (the fixture MCP server started once for all of them)."""
    responder = Scripted()
    with FakeInferenceServer(responder=responder) as fake:
        env = make(fake.base_url, **settings)

        async def main() -> None:
            await env.setup()
            try:
                await scenarios(env, responder)
            finally:
                await env.aclose()

        asyncio.run(main())


async def group_of(env: MCPTools, responder: Scripted, task: Task, script: list[list[str]]):
    """(group, episodes) of one group of `task` played by `script`; metrics logged."""
    responder.load(script)
    env.config.group_size = len(script)
    played: list[Any] = []
    play = env.play

    async def recording(*args: Any, **kwargs: Any) -> Any:
        played.append(await play(*args, **kwargs))
        return played[-1]

    env.play = recording  # type: ignore[method-assign]
    try:
        group, backlog = await env.collect_trajectories(task)
    finally:
        del env.play
    assert backlog == []
    await env.wandb_log()
    return group, played[0]


def test_a_group_of_right_and_wrong_calls_is_scored_and_token_exact():
    script = [
        [LOOKUP, CONVERT, "<answer>5.29</answer>"],  # right calls, right answer: 1.0
        ["<answer>5.29</answer>"],  # a guess, no calls: 0.8
        [block("lookup_item", query="Stove"), CONVERT, "<answer>5.5</answer>"],  # 0.2 * 1/2
        [block("teleport"), '<tool_call>{"name": </tool_call>', block("teleport")],  # 3 turns
    ]

    async def scenarios(env: MCPTools, responder: Scripted) -> None:
        group, episodes = await group_of(env, responder, STOVE, script)
        assert group["scores"] == pytest.approx([1.0, 0.8, 0.1, 0.0])
        assert [e.ended for e in episodes] == ["answer", "answer", "answer", "max_turns"]
        assert group["overrides"] == [{}, {}, {}, {"outcome": "truncated/turns"}]  # scored
        assert [e.errors for e in episodes] == [0, 0, 1, 2]  # the last reply is not run
        assert [len(e.calls) for e in episodes] == [2, 0, 2, 1]  # an unreadable block is none
        assert (3, 3) not in responder.asked  # max_turns: no fourth reply
        check_turns(episodes)
        check_tokens(env, group, episodes)
        assert env.metrics["train/accuracy"] == 0.5
        assert env.metrics["train/avg_score"] == pytest.approx(0.475)
        assert env.metrics["train/tool_errors"] == 0.75 and env.metrics["train/answered"] == 0.75
        assert env.metrics["train/drift_forks"] == 0.0
        # the server dies: the next group fails (an infrastructure failure is never a score)
        [pid] = env.servers.pids
        os.killpg(pid, signal.SIGKILL)
        with pytest.raises(ToolServerError, match="MCP server 'fixture'.*killed by signal 9"):
            await group_of(env, responder, STOVE, script[:2])

    with_env(scenarios, max_turns=3, server_restarts=0)


def check_turns(episodes: list[Any]) -> None:
    right = episodes[0]
    assert [m["role"] for m in right.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert right.messages[0]["content"] == SYSTEM_PROMPT  # the tools go to the template
    assert json.loads(right.messages[3]["content"])["weight_kg"] == 2.4
    assert right.messages[5] == {"role": "tool", "name": "convert_units", "content": "5.291094"}
    wrong = episodes[2].messages[3]["content"]
    assert wrong.startswith("error: ") and "no item 'Stove'" in wrong
    assert "there is no tool named 'teleport'" in episodes[3].messages[3]["content"]
    assert "could not be read" in episodes[3].messages[5]["content"]


def check_tokens(env: MCPTools, group: dict[str, Any], episodes: list[Any]) -> None:
    """Each trained run is what the server generated for that reply (+ eos); the prompt and
    the tool turns are masked with logprob 1.0; the row is the server's ids and logprobs."""
    tok = env.tokenizer
    for i, ep in enumerate(episodes):
        replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        expected = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in replies]
        assert trained_runs(ep.node) == expected
        rendered = tok.apply_chat_template(ep.messages, tokenize=False, tools=env.tools)
        assert tok.decode(ep.node.tokens) == rendered.removesuffix("\n")
        assert group["tokens"][i] == ep.node.tokens and group["masks"][i] == ep.node.masked_tokens
        assert group["inference_logprobs"][i] == ep.node.logprobs
        assert group["messages"][i] == ep.messages
    assert group["token_source"] == "server"


def test_the_token_budget_ends_an_episode():
    script = [[LOOKUP, CONVERT, "<answer>5.29</answer>"], ["<answer>5.29</answer>"]]

    async def scenarios(env: MCPTools, responder: Scripted) -> None:
        _, episodes = await group_of(env, responder, STOVE, script)
        masks = episodes[0].node.masked_tokens
        first_reply = next(j for j in range(len(masks)) if masks[j] != -100)
        first_reply_end = next(j for j in range(first_reply, len(masks)) if masks[j] == -100)
        # the first reply fits; its tool turn and the next reply do not
        env.config.max_token_length = first_reply_end + 40
        short, cut = await group_of(env, responder, STOVE, script)
        assert [e.ended for e in cut] == ["budget", "answer"] and cut[0].turns == 1
        assert len(cut[0].node.tokens) <= env.config.max_token_length
        assert (0, 1) not in responder.asked
        assert short["scores"] == pytest.approx([0.1, 0.8])  # no answer; one call made of two
        assert short["messages"][0][-1]["role"] == "assistant"  # the row holds what was trained

    with_env(scenarios, max_token_length=4096)


# ----- where the tool schemas go, the demo policy, the whole env ----------------------------------


class StubServers:
    """What `MCPTools` reads of its servers for the prompt, without starting any."""

    tools = {"weekday": None}

    def schemas(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "weekday", "parameters": {}}}]


class ToolBlindTokenizer:
    """A tokenizer whose chat template ignores `tools`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def apply_chat_template(self, messages: Any, tools: Any = None, **kwargs: Any) -> Any:
        return self.inner.apply_chat_template(messages, **kwargs)


def test_tool_schemas_go_to_the_template_or_the_system_prompt(caplog):
    env = make()
    env._servers = StubServers()  # type: ignore[assignment]
    env.tools = env._schemas_for_template()
    assert env.tools == StubServers().schemas()  # the tiny template renders tools
    assert env.prompt(STOVE)[0]["content"] == SYSTEM_PROMPT
    env.config.tool_schemas = "system"
    env.tools = env._schemas_for_template()
    system = env.prompt(STOVE)[0]["content"]
    assert env.tools is None and system.startswith(SYSTEM_PROMPT)
    assert system.endswith('<tools>\n{"type": "function", "function": {"name": "weekday",'
                           ' "parameters": {}}}\n</tools>')  # fmt: skip
    env.config.tool_schemas = "template"
    env.tokenizer = ToolBlindTokenizer(env.tokenizer)
    assert env._schemas_for_template() is None
    assert "the chat template renders no tools" in caplog.text


def test_the_demo_responder_follows_the_expected_calls_and_misbehaves_sometimes():
    task = next(t for t in load_tasks("train") if t.id == "paddle-slip")
    prompt = f"<|im_start|>user\n{task.prompt}<|im_end|>\n<|im_start|>assistant\n"
    assert step_of(task, prompt) == 0
    later = prompt + reply_for(task, 0, "good") + "<|im_end|>\n<|im_start|>tool\n{}<|im_end|>"
    assert step_of(task, later) == 1
    assert (
        json.loads(re.sub(r"</?tool_call>", "", reply_for(task, 1, "good")))
        == (task.expected_calls[1])
    )
    assert reply_for(task, 3, "good") == "<answer>Sunday</answer>"
    replies = [demo_responder(prompt) for _ in range(8)]
    assert sum("teleport" in r or "answer" in r or '"arguments": <' in r for r in replies) == 2
    assert demo_responder("What is 2 + 2?") is None


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, demo_responder, items=3, group_size=4)
    assert report.groups >= 1 and report.token_sources == {"server"}


def test_evaluate_plays_every_held_out_task(tmp_path: Path):
    def right(prompt: str) -> str | None:  # always the good reply
        task = next((t for t in load_tasks("test") if t.prompt in prompt), None)
        return None if task is None else reply_for(task, step_of(task, prompt), "good")

    run = evaluate_against(make, right, tmp_path, setup=True)
    assert run.metrics["eval/accuracy"] == 1.0 and run.metrics["eval/avg_score"] == 1.0
    assert run.metrics["eval/tool_calls"] == pytest.approx(10 / 6)
    assert len(run.samples) == 6 and {s["ended"] for s in run.samples} == {"answer"}
    assert run.temperature == 0.0 and run.doc["results"]["all"] == run.metrics


def test_an_openai_server_is_refused_and_the_defaults():
    env = make("http://127.0.0.1:9/v1")
    env.server_configs[0].server_type = "openai"
    with pytest.raises(ConfigError, match="needs a token server"):
        asyncio.run(env.setup())
    config, [server] = env_defaults(MCPTools)
    assert isinstance(config, MCPToolsConfig) and [s.name for s in config.servers] == ["fixture"]
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert MCPTools.requires == {"mcp": "mcp"}
