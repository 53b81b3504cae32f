"""The `mt_grpo` environment: the atlas and its tools, the turn and outcome rules, token-exact
episodes in both modes (chat turns; tool calls inside the thinking of one reply) against the
fake server with scripted right and wrong calls, groups carrying per-turn advantages on each
turn's own tokens, and the runs: `check_env`, `atropos env process mt_grpo`, evaluation."""

from __future__ import annotations

import asyncio
import collections
import json
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from atropos.cli.main import main as atropos_main
from atropos.environments.common.turn_credit import turn_advantages
from atropos.environments.mt_grpo import (
    MTGRPO,
    MTGRPOConfig,
    Task,
    demo_responder,
    load_tasks,
    load_world,
    reply_for,
    score_episode,
)
from atropos.environments.mt_grpo import episode as episode_module
from atropos.environments.mt_grpo.demo import RESULT_MARK
from atropos.environments.mt_grpo.scoring import answer_of, judge_turns, outcome_reward
from atropos.environments.mt_grpo.world import calculate, same_answer
from atropos.envs import registry
from atropos.inference.sequence import MASKED, PROMPT_LOGPROB
from atropos.rewards.group import group_advantages
from atropos.testing import FakeInferenceServer

from .helpers import check_against, env_defaults, evaluate_against, make_env, read_jsonl

WORLD = load_world()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def block(c: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps(c)}</tool_call>"


CAPITAL = call("lookup", table="capital", key="Avaria")
POPULATION = call("lookup", table="population", key="Brelholm")
AREA = call("lookup", table="area_km2", key="Brelholm")
DIVIDE = call("calculator", expression="482000 / 241")
TASK = Task(
    "density-avaria",
    "How many people live per square kilometre in the capital of Avaria?",
    (CAPITAL, POPULATION, AREA, DIVIDE),
    "2000",
)

# ----- the atlas, its tools and the rules ---------------------------------------------------------


def test_the_tools_run_on_the_atlas_and_name_what_is_wrong():
    assert WORLD.run(CAPITAL) == {"tool": "lookup", "result": "Brelholm"}
    assert WORLD.run(call("lookup", table="Population", key=" brelholm ")) == {
        "tool": "lookup",
        "result": 482000,
    }
    assert WORLD.run(DIVIDE) == {"tool": "calculator", "result": 2000}
    assert WORLD.run(call("calculator", expression="7 / 2"))["result"] == 3.5
    assert WORLD.run(call("calculator", expression="40 * 0.25"))["result"] == 10
    missing = WORLD.run(call("lookup", table="capital", key="Atlantis"))["error"]
    assert missing.startswith("no 'Atlantis' in capital; keys: Avaria, Cosmeno")
    assert "tables: capital, population" in WORLD.run(call("lookup", table="x", key="y"))["error"]
    assert WORLD.run(call("lookup", table="capital"))["error"] == "missing argument 'key'"
    assert WORLD.run(call("calculator", expression="1 / 0"))["error"] == "division by zero"
    assert "only numbers" in WORLD.run(call("calculator", expression="__import__('os')"))["error"]
    assert "not an arithmetic" in WORLD.run(call("calculator", expression="1 +"))["error"]
    assert WORLD.run({"name": "search", "arguments": {}})["error"].startswith("no tool 'search'")
    assert WORLD.run({"name": "lookup", "arguments": "x"})["error"] == "arguments must be an object"
    assert calculate("-(3 - 5) * 1,000") == 2000


def test_answers_compare_by_value_or_words():
    assert same_answer("2,000", "2000") and same_answer("2000.0000001", "2000")
    assert same_answer(" Brelholm", "brelholm") and not same_answer("2001", "2000")
    assert not same_answer("Dunport", "Brelholm")


def test_the_fixture_answers_itself():
    """Every task's expected calls, run in order, succeed, and the last one gives the answer."""
    train, test = load_tasks("train"), load_tasks("test")
    assert (len(train), len(test)) == (36, 8)
    assert not {t.question for t in train} & {t.question for t in test}
    for task in (*train, *test):
        results = [WORLD.run(c) for c in task.calls]
        assert all("result" in r for r in results), task.id
        assert same_answer(str(results[-1]["result"]), task.answer), task.id
    assert {len(t.calls) for t in train} == {2, 3, 4}
    with pytest.raises(ValueError, match="split must be"):
        load_tasks("eval")


def test_bad_task_files_are_named(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "calls": [], "answer": "1"}\n')
    with pytest.raises(ValueError, match="train.jsonl line 1: a task needs"):
        load_tasks("train", tmp_path)


def rewards(texts: list[str], expected: tuple[dict[str, Any], ...] = TASK.calls) -> list[float]:
    return [j.reward for j in judge_turns(texts, expected, WORLD)]


def test_a_call_scores_for_parsing_the_tool_and_the_arguments():
    assert rewards(["<think>x</think>" + block(CAPITAL)]) == [1.0]
    assert rewards([block(call("lookup", table="capital", key="avaria "))]) == [1.0]
    assert rewards([block(call("lookup", table="capital", key="Gorvash"))]) == [0.5]
    assert rewards([block(call("search", q="Avaria"))]) == [0.25]
    assert rewards([block(call("calculator", expression="(482000)/241"))]) == [1.0]
    assert rewards([block(call("calculator", expression="482000/242"))]) == [0.5]
    assert rewards(["<tool_call>{oops</tool_call>"]) == [0.0]
    assert rewards([block(CAPITAL) + block(POPULATION)]) == [0.0]  # one call per turn
    assert rewards(["<think>x</think>no call"]) == [0.0]  # a call is due


def test_calls_count_in_any_order_and_a_wrong_one_can_be_retried():
    assert rewards([block(c) for c in (CAPITAL, AREA, POPULATION, DIVIDE)]) == [1.0] * 4
    again = [block(CAPITAL), block(CAPITAL)]  # made already: the same lookup again is no use
    assert rewards(again) == [1.0, 0.5]
    retried = [block(call("lookup", table="capital", key="Ithren")), block(CAPITAL)]
    assert rewards(retried) == [0.5, 1.0]
    judged = judge_turns([block(CAPITAL), "\\boxed{1}", "\\boxed{1}"], (CAPITAL,), WORLD)
    assert judged == [(1.0, True), (1.0, False), (1.0, False)]  # the answer is due now
    assert rewards([block(CAPITAL), block(AREA)], (CAPITAL,)) == [1.0, 0.0]  # one call too many


def test_the_answer_and_the_outcome():
    assert answer_of("<think>maybe \\boxed{1}</think>So \\boxed{2,000}.") == "2,000"
    assert answer_of("\\boxed{3}") == "3" and answer_of("\\boxed{3}", think_required=True) is None
    assert answer_of("<think>x</think>no box") is None
    assert outcome_reward("2,000", "2000") == 1.0 and outcome_reward(None, "2000") == 0.0
    assert outcome_reward("2001", "2000") == 0.0


# ----- scripted episodes --------------------------------------------------------------------------


class Scripted:
    """A responder playing `script[i][k]` as rollout i's generation at step k (k: the tool
    results already in the prompt). A rollout's first request takes the next free i, in order
    of arrival; its own first generation writes `rollout i`, which names it later."""

    def __init__(self, script: list[list[str]]) -> None:
        self.script = script
        self.first = iter(range(len(script)))
        self.asked: collections.Counter[tuple[int, int]] = collections.Counter()

    def __call__(self, prompt: str) -> str:
        step = prompt.count(RESULT_MARK)
        found = re.search(r"rollout (\d+)", prompt)
        i = int(found.group(1)) if found else next(self.first)
        self.asked[i, step] += 1
        return self.script[i][step]


make = partial(make_env, MTGRPO)


def rollout_of(ep: Any) -> int:
    found = re.search(r"rollout (\d+)", ep.turns[0].text)
    assert found is not None
    return int(found.group(1))


def play(script: list[list[str]], task: Task = TASK, **env: Any) -> tuple[MTGRPO, list[Any]]:
    """(env, episodes ordered by rollout) of `task` played by `script`."""
    with FakeInferenceServer(responder=Scripted(script)) as fake:
        environment = make(fake.base_url, group_size=len(script), **env)

        async def main() -> list[Any]:
            await environment.setup()
            try:
                return list(await asyncio.gather(*(environment.play(task) for _ in script)))
            finally:
                await environment.aclose()

        episodes = asyncio.run(main())
    return environment, sorted(episodes, key=rollout_of)


def chat_script(i: int, calls: list[dict[str, Any]], answer: str) -> list[str]:
    return [f"<think>rollout {i} step {k}</think>{block(c)}" for k, c in enumerate(calls)] + [
        f"<think>rollout {i} done</think>The answer is \\boxed{{{answer}}}."
    ]


def runs(node: Any) -> list[tuple[bool, list[int]]]:
    """The sequence as runs of (trained?, ids)."""
    out: list[tuple[bool, list[int]]] = []
    for token, mask in zip(node.tokens, node.masked_tokens, strict=True):
        trained = mask != MASKED
        if not out or out[-1][0] != trained:
            out.append((trained, []))
        out[-1][1].append(token)
    return out


def assert_logprobs_line_up(node: Any) -> None:
    for token, mask, lp in zip(node.tokens, node.masked_tokens, node.logprobs, strict=True):
        assert (lp == PROMPT_LOGPROB) if mask == MASKED else (mask == token and lp < 0)


def test_chat_turns_are_token_exact_and_scored_turn_by_turn():
    wrong = call("lookup", table="population", key="Brelholmx")
    script = [
        chat_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000"),
        chat_script(1, [CAPITAL, wrong, AREA, DIVIDE], "5"),
        ["<think>rollout 2 guess</think>\\boxed{2000}"],  # answers at once
    ]
    environment, episodes = play(script)
    tok = environment.tokenizer
    scored = [score_episode(e, WORLD, think_required=False) for e in episodes]
    assert [x.turn_rewards for x in scored] == [[1.0] * 5, [1.0, 0.5, 1.0, 1.0, 0.0], [0.0]]
    assert [x.outcome for x in scored] == [1.0, 0.0, 1.0]
    assert [e.stopped for e in episodes] == ["answered"] * 3
    assert episodes[1].messages[5]["content"].startswith('{"tool": "lookup", "error": "no')
    for i, ep in enumerate(episodes):
        node = ep.node
        assert_logprobs_line_up(node)
        trained = [ids for is_trained, ids in runs(node) if is_trained]
        # each trained run is exactly what the server generated for that reply (+ end of turn)
        assert trained == [
            tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in script[i]
        ]
        spans = [turn.span for turn in ep.turns]
        assert [node.tokens[a:b] for a, b in spans] == trained
        masked = tok.decode(
            [t for t, m in zip(node.tokens, node.masked_tokens, strict=True) if m == MASKED]
        )
        assert all(m["content"] in masked for m in ep.messages if m["role"] == "tool")


def test_wrong_calls_get_their_wrong_results_and_the_episode_goes_on():
    script = [chat_script(0, [call("lookup", table="capital", key="Gorvash")], "733000")]
    task = Task(
        "t", "How many people live in the capital of Avaria?", (CAPITAL, POPULATION), "482000"
    )
    _, [ep] = play(script, task)
    assert json.loads(ep.messages[3]["content"]) == {"tool": "lookup", "result": "Halcyra"}
    assert score_episode(ep, WORLD, False).turn_rewards == [0.5, 0.0]  # answered at step 1


def test_a_policy_that_never_answers_stops_at_max_turns():
    task = Task(
        "t", "How many people live in the capital of Avaria?", (CAPITAL, POPULATION), "482000"
    )
    script = [[f"<think>rollout 0 {k}</think>{block(CAPITAL)}" for k in range(4)]]
    _, [ep] = play(script, task, extra_turns=1)  # 2 calls + the answer + 1 more
    assert ep.stopped == "max_turns" and len(ep.turns) == 4 and ep.answer_text is None
    assert ep.outcome("mask") == {"outcome": "truncated/turns", "set_advantage_to_zero": True}
    scored = score_episode(ep, WORLD, False)
    assert scored.turn_rewards == [1.0, 0.5, 0.5, 0.5] and scored.outcome == 0.0


def test_a_turn_that_would_not_fit_ends_the_episode():
    script = [chat_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000")]
    _, [full] = play(script)
    ends = [b for _, b in (t.span for t in full.turns)]
    _, [short] = play(script, max_token_length=ends[1] + 40)
    assert short.stopped == "context" and len(short.turns) == 2
    assert short.outcome("score") == {"outcome": "truncated/tokens"}
    assert len(short.node.tokens) <= ends[1] + 40


# ----- tools inside thinking ----------------------------------------------------------------------


def think_script(i: int, calls: list[dict[str, Any]], answer: str) -> list[str]:
    """Generations of one reply: the first opens the think block, each ends at a call."""
    chunks = [
        f"{'<think>' if k == 0 else ''}rollout {i} step {k}\n{block(c)}"
        for k, c in enumerate(calls)
    ]
    return chunks + [f"rollout {i} done\n</think>\nThe answer is \\boxed{{{answer}}}."]


def result_text(c: dict[str, Any]) -> str:
    return f"\n<tool_response>\n{json.dumps(WORLD.run(c))}\n</tool_response>\n"


def test_tools_inside_thinking_stay_in_one_reply_token_exact():
    wrong = call("calculator", expression="482000 / 241 + 1")
    script = [
        think_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000"),
        think_script(1, [CAPITAL, POPULATION, AREA, wrong], "2001"),
    ]
    environment, episodes = play(script, tools_in_think=True)
    tok = environment.tokenizer
    for i, ep in enumerate(episodes):
        node = ep.node
        assert_logprobs_line_up(node)
        assert [m["role"] for m in ep.messages] == ["system", "user", "assistant"]
        whole = tok.decode(node.tokens, skip_special_tokens=False)
        assert whole.count("<|im_start|>assistant") == 1  # one turn, never re-rendered
        chunks = [tok.encode(t, add_special_tokens=False) for t in script[i]]
        chunks[-1].append(tok.eos_token_id)
        pieces = runs(node)
        assert [ids for trained, ids in pieces if trained] == chunks  # the policy's own ids
        inserted = [tok.decode(ids) for trained, ids in pieces[1:] if not trained]
        calls = [CAPITAL, POPULATION, AREA, DIVIDE if i == 0 else wrong]
        assert inserted == [result_text(c) for c in calls]  # each result right after its call
        assert [node.tokens[a:b] for a, b in (t.span for t in ep.turns)] == chunks
        assert ep.results == 4 and ep.cut_stops == 0 and ep.stopped == "answered"
        assert ep.messages[-1]["content"] == "".join(
            s + (result_text(c) if k < 4 else "")
            for k, (s, c) in enumerate(zip(script[i], [*calls, None], strict=True))
        )
    scored = [score_episode(e, WORLD, think_required=True) for e in episodes]
    assert [x.turn_rewards for x in scored] == [[1.0] * 5, [1.0, 1.0, 1.0, 0.5, 0.0]]
    assert [x.outcome for x in scored] == [1.0, 0.0]


def test_a_cut_stop_string_is_put_back_masked(monkeypatch):
    """Servers that leave a stop string out of the ids (our fake does; vLLM keeps them): the
    closing tag goes in with the result, masked, and the call still counts."""
    monkeypatch.setattr(episode_module, "stop_at_call", lambda tok: {"stop": ["</tool_call>"]})
    environment, [ep] = play(
        [think_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000")], tools_in_think=True
    )
    tok = environment.tokenizer
    inserted = [tok.decode(ids) for trained, ids in runs(ep.node)[1:] if not trained]
    assert all(text.startswith("</tool_call>\n<tool_response>") for text in inserted)
    assert ep.cut_stops == 4 and ep.results == 4
    assert score_episode(ep, WORLD, True).turn_rewards == [1.0] * 5


def test_a_call_after_the_thinking_ends_the_reply():
    script = [[f"<think>rollout 0</think>{block(CAPITAL)}"]]
    _, [ep] = play(script, tools_in_think=True)
    assert ep.stopped == "call_after_think" and ep.answer_text is None and ep.results == 0
    assert ep.outcome("score") == {"outcome": "invalid/call_after_think"}  # the policy's fault
    assert score_episode(ep, WORLD, True).outcome == 0.0


# ----- groups ------------------------------------------------------------------------------------


def collect(script: list[list[str]], task: Task = TASK, **env: Any) -> tuple[Any, MTGRPO]:
    with FakeInferenceServer(responder=Scripted(script)) as fake:
        environment = make(fake.base_url, group_size=len(script), **env)

        async def main() -> Any:
            await environment.setup()
            try:
                group, backlog = await environment.collect_trajectories(task)
                assert backlog == []
                await environment.wandb_log()
                return group
            finally:
                await environment.aclose()

        return asyncio.run(main()), environment


def spans_of(masks: list[int]) -> list[tuple[int, int]]:
    """The trained runs of a row, as spans."""
    out: list[tuple[int, int]] = []
    for j, m in enumerate(masks):
        if m != MASKED and (not out or out[-1][1] != j):
            out.append((j, j + 1))
        elif m != MASKED:
            out[-1] = (out[-1][0], j + 1)
    return out


@pytest.mark.parametrize("think", [False, True])
def test_groups_carry_each_turns_advantage_on_its_own_tokens(think):
    make_script = think_script if think else chat_script
    wrong = call("lookup", table="population", key="Brelholmx")
    script = [
        make_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000"),
        make_script(1, [CAPITAL, wrong, AREA, DIVIDE], "5"),
        make_script(2, [CAPITAL, POPULATION, AREA, DIVIDE], "7"),
    ]
    group, environment = collect(script, tools_in_think=think)
    order = [int(re.search(r"rollout (\d+)", m[2]["content"]).group(1)) for m in group["messages"]]
    turn_rewards = {0: [1.0] * 5, 1: [1.0, 0.5, 1.0, 1.0, 0.0], 2: [1.0] * 5}
    outcomes = {0: 1.0, 1: 0.0, 2: 0.0}
    rows = turn_advantages([turn_rewards[i] for i in order], [outcomes[i] for i in order])
    assert group["scores"] == [outcomes[i] for i in order]
    for masks, advantages, row in zip(group["masks"], group["advantages"], rows, strict=True):
        spans = spans_of(masks)
        assert len(spans) == 5  # four calls and the answer, each its own run of trained ids
        for (a, b), value in zip(spans, row, strict=True):
            assert set(advantages[a:b]) == {value}
        assert all(v == 0.0 for v, m in zip(advantages, masks, strict=True) if m == MASKED)
    assert group["token_source"] == "server" and len(group["inference_logprobs"]) == 3
    metrics = environment.metrics
    assert metrics["train/accuracy"] == pytest.approx(1 / 3)
    assert metrics["train/calls_right"] == pytest.approx(11 / 13)  # rollout 1 never made one
    assert metrics["train/tool_results"] == 4.0 and metrics["train/answered"] == 1.0


def test_the_grpo_baseline_puts_grpos_advantage_on_every_trained_token():
    script = [
        chat_script(i, [CAPITAL, POPULATION, AREA, DIVIDE], a) for i, a in enumerate(["2000", "1"])
    ]
    group, _ = collect(script, credit="grpo")
    expected = group_advantages(group["scores"])
    for masks, advantages, a in zip(group["masks"], group["advantages"], expected, strict=True):
        assert advantages == [0.0 if m == MASKED else a for m in masks]


def test_a_group_that_teaches_nothing_is_dropped():
    same = [chat_script(i, [CAPITAL, POPULATION, AREA, DIVIDE], "2000") for i in range(2)]
    assert collect(same)[0] is None
    kept, _ = collect(same, drop_zero_advantage=False)
    assert kept["scores"] == [1.0, 1.0] and not any(a for row in kept["advantages"] for a in row)
    # the same outcomes, but one rollout misspelt a call: the turn credit still teaches
    misspelt = [
        chat_script(0, [CAPITAL, POPULATION, AREA, DIVIDE], "2000"),
        chat_script(
            1, [CAPITAL, call("lookup", table="population", key="x"), AREA, DIVIDE], "2000"
        ),
    ]
    assert collect(misspelt)[0] is not None
    assert collect(misspelt, credit="grpo")[0] is None


# ----- the environment end to end -----------------------------------------------------------------


@pytest.mark.parametrize("think", [False, True])
def test_check_env_passes_with_the_demo_responder(think):
    report = check_against(make, demo_responder, items=3, group_size=3, tools_in_think=think)
    assert report.groups >= 1 and report.token_sources == {"server"}


@pytest.fixture
def registered() -> Iterator[None]:
    """`mt_grpo` by name, also where the installed entry points predate it."""
    if "mt_grpo" in registry.names():
        yield
        return
    registry.register("mt_grpo", "atropos.environments.mt_grpo:MTGRPO")
    try:
        yield
    finally:
        registry._registered.pop("mt_grpo", None)


def process(url: str, out: Any, think: bool, *flags: str) -> list[dict[str, Any]]:
    """`atropos env process mt_grpo` against the server at `url`: the 2 groups it wrote, each
    row's tokens, masks, logprobs and advantages one per token, masked positions without
    advantage."""
    argv = [
        "env", "process", "mt_grpo", "--openai.base_url", url, "--env.total_steps", "2",
        "--env.data_path_to_save_groups", str(out), "--env.tools_in_think", str(think).lower(),
        *flags,
    ]  # fmt: skip
    assert atropos_main(argv) == 0
    groups = read_jsonl(out)
    assert len(groups) == 2 and out.with_suffix(".html").exists()
    for group in groups:
        assert group["token_source"] == "server"
        rows = zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["advantages"],
            strict=True,
        )  # fmt: skip
        for tokens, masks, logprobs, advantages in rows:
            assert len(tokens) == len(masks) == len(logprobs) == len(advantages)
            assert any(m != MASKED for m in masks)
            assert all(a == 0.0 for a, m in zip(advantages, masks, strict=True) if m == MASKED)
    return groups


@pytest.mark.parametrize("think", [False, True])
def test_atropos_env_process_mt_grpo(registered, tmp_path, think):
    with FakeInferenceServer(responder=demo_responder) as fake:
        groups = process(fake.base_url, tmp_path / "mt_grpo.jsonl", think, "--env.group_size", "3")
    for group in groups:
        assert len(group["tokens"]) == 3
        assert any(a != 0.0 for row in group["advantages"] for a in row)
        for chat in group["messages"]:
            replies = [m for m in chat if m["role"] == "assistant"]
            assert len(replies) == 1 if think else len(replies) > 1  # calls inside one reply


def test_evaluate_reports_accuracy_and_calls(tmp_path):
    def always_right(prompt: str) -> str | None:
        for task in load_tasks("test"):
            if task.question in prompt:
                return reply_for(task, prompt.count(RESULT_MARK), True, False, False)
        return None

    run = evaluate_against(make, always_right, tmp_path, setup=True)
    assert run.metrics["eval/accuracy"] == 1.0 and run.metrics["eval/calls_right"] == 1.0
    assert run.metrics["eval/answered"] == 1.0
    assert len(run.samples) == 8 and all(s["stopped"] == "answered" for s in run.samples)
    assert run.doc["results"]["all"] == run.metrics


def test_demo_responder_mixes_right_and_wrong_calls():
    task = load_tasks("train")[0]
    prompt = f"<|im_start|>user\n{task.question}<|im_end|>"
    replies = [demo_responder(prompt) or "" for _ in range(3)]
    first = [rewards([r], task.calls)[0] for r in replies]
    assert 1.0 in first and any(r < 1.0 for r in first)
    assert demo_responder("What is 2 + 2?") is None


def test_defaults_refusals_and_registration():
    config, [server] = env_defaults(MTGRPO)
    assert isinstance(config, MTGRPOConfig) and config.credit == "mt_grpo"
    assert (config.turn_coef, config.discount, config.tools_in_think) == (1.0, 1.0, False)
    assert config.group_size == 8 and not config.ensure_scores_are_not_same
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    env = make("http://127.0.0.1:9/v1")
    env.server_configs[0].server_type = "openai"
    with pytest.raises(ValueError, match="token server"):
        asyncio.run(env.setup())
    budgeted = make("http://127.0.0.1:9/v1", tools_in_think=True, max_reasoning_tokens=2048)
    with pytest.raises(ValueError, match="reasoning budget"):
        asyncio.run(budgeted.setup())
    with pytest.raises(ValueError, match="credit"):
        MTGRPOConfig(credit="ppo")  # type: ignore[arg-type]
    assert registry.get("atropos.environments.mt_grpo:MTGRPO") is MTGRPO


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    """`atropos local serve tiny` (the shipped tiny policy on the CPU): real ids and logprobs;
    its replies are noise here, so every group is kept whatever its advantages."""
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server() as url:
        yield url


@pytest.mark.parametrize("think", [False, True])
def test_atropos_env_process_mt_grpo_on_the_cpu_server(registered, local_url, tmp_path, think):
    flags = [
        "--openai.server_type", "vllm", "--openai.model_name", "atropos-tiny",
        "--env.tokenizer_name", "tiny", "--env.max_token_length", "1024", "--env.group_size", "2",
        "--env.max_reply_tokens", "24", "--env.drop_zero_advantage", "false",
    ]  # fmt: skip
    groups = process(local_url, tmp_path / "mt_grpo.jsonl", think, *flags)
    assert all(len(group["tokens"]) == 2 for group in groups)
