"""The `tool_use_multiturn` environment: episodes from ShareGPT rows, the reward rules, token-exact
multi-turn rollouts over replayed tool responses, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import collections
import json
import re
from functools import partial

import pytest

from atropos.environments.common.data_loading import HubUnavailable
from atropos.environments.tool_use_multiturn import (
    ToolEpisode,
    ToolUseMultiTurn,
    ToolUseMultiTurnConfig,
    demo_responder,
    load_episodes,
    to_episode,
)
from atropos.environments.tool_use_multiturn.demo import reply_for
from atropos.environments.tool_use_multiturn.episodes import SYSTEM_PREAMBLE
from atropos.environments.tool_use_multiturn.scoring import (
    check_reply,
    episode_reward,
    group_scores,
    relevance_reward,
    split_think,
)
from atropos.envs import registry
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_with_runner,
    trained_runs,
)

# ----- hand-made episodes -------------------------------------------------------------------------


def call(name: str, **arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


def blocks(*calls: dict) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)


def gpt_calls(*calls: dict) -> dict:
    return {"from": "gpt", "value": "<think>plan</think>\n" + blocks(*calls)}


def tool(text: str) -> dict:
    return {"from": "tool", "value": f"<tool_response>\n{text}\n</tool_response>"}


SYSTEM = {"from": "system", "value": "<tools>\n(schemas)\n</tools>"}
PROFILE, FORECAST = call("get_profile", user="u-7"), call("get_forecast", city="Oslo", days=3)
EVENT = call("add_event", title="Umbrella", date="2025-06-11")
WEATHER, TIME = call("get_weather", city="Oslo"), call("get_time", zone="Europe/Oslo")

THREE_STEPS = {  # three sequential turns, the second with no follow-up user turn
    "id": "three-steps",
    "conversations": [
        SYSTEM,
        {"from": "human", "value": "Plan around the rain for user u-7."},
        gpt_calls(PROFILE),
        tool('{"home": "Oslo"}'),
        gpt_calls(FORECAST),
        tool('{"rain": "2025-06-11"}'),
        gpt_calls(EVENT),
        tool('{"ok": true}'),
        {"from": "gpt", "value": "<think>done</think>Added."},
    ],
}
PARALLEL_THEN_ONE = {
    "conversations": [
        SYSTEM,
        {"from": "human", "value": "Weather and time in Oslo, then the forecast."},
        gpt_calls(WEATHER, TIME),
        tool('{"t": 4}\n{"time": "09:00"}'),
        gpt_calls(FORECAST),
    ]
}
MULTITURN = {
    "scenario_category": "multiturn",
    "conversations": [
        SYSTEM,
        {"from": "human", "value": "Weather in Oslo?"},
        gpt_calls(WEATHER),
        tool('{"t": 4, "where": "Oslo"}'),
        {"from": "gpt", "value": "<think>ok</think>It is 4 degrees."},
        {"from": "human", "value": "And the 3-day forecast?"},
        gpt_calls(FORECAST),
        tool('{"days": [1, 2, 3]}'),
    ],
}
RELEVANCE = {
    "scenario_category": "relevance",
    "conversations": [
        SYSTEM,
        {"from": "human", "value": "Order me a pizza."},
        {"from": "gpt", "value": "<think>no tool</think>Sorry, I can't order food."},
    ],
}


def episode(row: dict) -> ToolEpisode:
    return to_episode(row, "test row")


def good(ep: ToolEpisode, t: int, i: int) -> str:
    """The right reply of rollout `i` at turn `t` (its think block names the rollout)."""
    return f"<think>rollout {i} turn {t}</think>\n" + blocks(*ep.turns[t].calls)


def turn_of(ep: ToolEpisode, prompt: str) -> int:
    return sum(1 for turn in ep.turns[1:] if turn.replay[-1]["content"] in prompt)


class Scripted:
    """A responder playing `script[i][t]` as rollout i's reply at turn t.

    Turn 0 is one request with n=len(script): the fake asks once per choice, in order. At later
    turns a rollout is recognised by the `rollout i` its own first reply wrote into the prompt.
    """

    def __init__(self, ep: ToolEpisode, script: list[list[str]]) -> None:
        self.ep, self.script = ep, script
        self.first = iter(range(len(script)))
        self.asked: collections.Counter[tuple[int, int]] = collections.Counter()

    def __call__(self, prompt: str) -> str:
        t = turn_of(self.ep, prompt)
        if t == 0:
            i = next(self.first)
        else:
            found = re.search(r"rollout (\d+)", prompt)
            assert found is not None, "a later turn must continue the rollout's own conversation"
            i = int(found.group(1))
        self.asked[i, t] += 1
        return self.script[i][t]


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, ToolUseMultiTurn)


def run_group(ep: ToolEpisode, script: list[list[str]], **env: object):
    """(env, trajectories, responder) of one group of `ep` played by `script`."""
    responder = Scripted(ep, script)
    with FakeInferenceServer(responder=responder) as fake:
        environment = make(fake.base_url, group_size=len(script), **env)

        async def main():
            await environment.setup()
            played = await environment.play(ep, len(script))
            await environment.aclose()
            return played

        trajectories = asyncio.run(main())
    return environment, trajectories, responder


def rewards(ep: ToolEpisode, script: list[list[str]], **env: object) -> list[float]:
    environment, trajectories, _ = run_group(ep, script, **env)
    return [environment.reward(ep, tr) for tr in trajectories]


# ----- episodes -----------------------------------------------------------------------------------


def test_rows_become_episodes_with_replayed_turns():
    ep = episode(THREE_STEPS)
    assert ep.id == "three-steps" and ep.scenario == "multistep" and ep.total_calls == 3
    assert [m["role"] for m in ep.context] == ["system", "user"]
    assert ep.context[0]["content"].startswith(SYSTEM_PREAMBLE)
    assert ep.context[0]["content"].endswith(SYSTEM["value"])
    assert [list(t.calls) for t in ep.turns] == [[PROFILE], [FORECAST], [EVENT]]
    assert ep.turns[0].replay == () and [m["role"] for m in ep.turns[1].replay] == ["tool"]
    assert ep.turns[2].replay[0]["content"] == tool('{"rain": "2025-06-11"}')["value"]
    multi = episode(MULTITURN)
    assert multi.scenario == "multiturn"
    assert [m["role"] for m in multi.turns[1].replay] == ["tool", "assistant", "user"]
    assert episode(PARALLEL_THEN_ONE).scenario == "multistep"
    assert len(episode(PARALLEL_THEN_ONE).turns[0].calls) == 2
    rel = episode(RELEVANCE)
    assert rel.scenario == "relevance" and rel.total_calls == 0 and len(rel.turns) == 1
    assert [m["role"] for m in rel.context] == ["system", "user"]
    without = {"conversations": MULTITURN["conversations"]}  # no category: inferred
    assert episode(without).scenario == "multiturn"
    single = {"conversations": [SYSTEM, {"from": "human", "value": "w?"}, gpt_calls(WEATHER)]}
    assert episode(single).scenario == "single"
    assert to_episode(single, "r", hints=False).context[0]["content"].count("\n\n") == 1


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match="r1: the conversation must open with a human turn"):
        to_episode({"conversations": [SYSTEM, gpt_calls(WEATHER)]}, "r1")
    with pytest.raises(ValueError, match="r2: a gpt turn has 1 unreadable"):
        bad = {"from": "gpt", "value": "<tool_call>{oops</tool_call>"}
        to_episode({"conversations": [{"from": "human", "value": "x"}, bad]}, "r2")
    with pytest.raises(ValueError, match="r3: a gpt tool-call turn must follow"):
        turns = [{"from": "human", "value": "x"}, gpt_calls(WEATHER), gpt_calls(TIME)]
        to_episode({"conversations": turns}, "r3")
    with pytest.raises(ValueError, match="r4: no gpt turn"):
        to_episode({"conversations": [{"from": "human", "value": "x"}]}, "r4")
    with pytest.raises(ValueError, match="r5: expected a 'conversations' list"):
        to_episode({"text": "x"}, "r5")


def test_the_fixture_covers_every_scenario_with_disjoint_splits():
    train, test = load_episodes("train"), load_episodes("test")
    assert len(train) == 21 and len(test) == 6
    assert not {e.id for e in train} & {e.id for e in test}
    for episodes in (train, test):
        kinds = collections.Counter(e.scenario for e in episodes)
        assert set(kinds) == {"single", "multistep", "multiturn", "relevance"}
        for e in episodes:
            assert "<tools>" in e.context[0]["content"]
            for turn in e.turns[1:]:
                assert turn.replay and turn.replay[-1]["role"] in ("tool", "user")
    assert max(len(e.turns) for e in train) == 3
    assert any(len(t.calls) == 2 for e in train for t in e.turns)  # parallel calls in a turn
    assert [e.scenario for e in load_episodes("train", scenarios=["relevance"])] == [
        "relevance"
    ] * 4
    with pytest.raises(ValueError, match="split"):
        load_episodes("eval")


@pytest.fixture
def fake_datasets(monkeypatch):
    rows = [
        {
            "id": f"row-{i}",
            "conversations": [
                SYSTEM,
                {"from": "human", "value": f"Request {i}"},
                gpt_calls(call("f", i=i)),
                tool(f'{{"i": {i}}}'),
                gpt_calls(call("g", i=i)),
            ],
        }
        for i in range(39)
    ]
    rows.append({"conversations": "broken"})  # skipped, not fatal
    return fake_hub(monkeypatch, rows, only="interstellarninja/toolace_hermes_sequential_tool_use")


def test_the_hub_dataset_gets_a_seeded_five_percent_split(fake_datasets):
    name = "interstellarninja/toolace_hermes_sequential_tool_use"
    train, test = load_episodes("train", name), load_episodes("test", name)
    assert fake_datasets == [(name, None, "train")] * 2
    assert len(test) == 2 and len(train) == 37  # ceil(5% of 40) held out; the broken row skipped
    assert not {e.id for e in train} & {e.id for e in test}
    assert [e.id for e in test] == [e.id for e in load_episodes("test", name)]
    assert len(load_episodes("test", name, test_fraction=0.25)) == 10
    with pytest.raises(HubUnavailable, match="other/name"):
        load_episodes("train", "other/name")
    env = make("http://127.0.0.1:9/v1", dataset_name=name)
    assert len(env.load("train")) == 37 and len(env.load("test")) == 2


# ----- the rules as functions ---------------------------------------------------------------------


def test_reply_checks_name_the_first_thing_wrong():
    expected = (WEATHER, TIME)
    both = blocks(TIME, WEATHER)  # any order
    assert check_reply(f"<think>x</think>\n{both}", expected).mismatch is None
    assert check_reply(both, expected).mismatch == "think"
    assert check_reply(both, expected, require_think=False).correct == 2
    assert check_reply(f"<think>a</think><think>b</think>{both}", expected).mismatch == "think"
    assert check_reply(f"<think>x</think>Sure! {both}", expected).mismatch == "format"
    assert check_reply("<think>x</think><tool_call>{</tool_call>", expected).mismatch == "malformed"
    count = check_reply(f"<think>x</think>{blocks(WEATHER)}", expected)
    assert (count.correct, count.mismatch) == (1, "count")
    wrong = check_reply(f"<think>x</think>{blocks(WEATHER, call('get_time'))}", expected)
    assert (wrong.correct, wrong.mismatch) == (1, "calls")
    typed = (call("get_forecast", city="Oslo", days=3),)
    as_text = "<think>x</think>" + blocks(call("get_forecast", city="Oslo", days="3"))
    assert check_reply(as_text, typed).mismatch == "calls"
    assert check_reply(as_text, typed, lenient=True).mismatch is None
    assert split_think("<think>x</think>") == ""


def test_episode_and_relevance_rewards():
    assert episode_reward("multistep", 3, 3, False) == 1.5
    assert episode_reward("multistep", 1, 3, True) == pytest.approx(1 / 3 - 0.2)
    assert episode_reward("multistep", 0, 3, True) == -1.0  # not positive
    assert episode_reward("multistep", 3, 3, True) == 0.8  # an extra call: no bonus
    assert episode_reward("multiturn", 1, 2, True) == -1.0  # fewer than 2 correct
    assert episode_reward("multiturn", 2, 2, False) == 1.5
    assert relevance_reward("<think>x</think>Sorry, I can't do that.") == 1.1
    assert relevance_reward("<think>x</think>Which city do you mean?") == 1.1
    assert relevance_reward("<think>x</think>I'm sorry; could you tell me the amount?") == 1.2
    assert relevance_reward("<think>x</think>I can't do that.") == 1.0
    assert relevance_reward("<think>x</think>" + blocks(WEATHER)) == -0.2
    assert relevance_reward("Sorry, which city?") == -0.2  # no think block
    assert relevance_reward("<think>x</think>  ") == -0.2


def test_group_rules():
    assert group_scores("multistep", [1.5, 1.5, 1.5], [10, 60, 100], 100) == [1.5, 1.2, 0.0]
    assert group_scores("multistep", [1.5, -1.0], [100, 100], 100) == [1.5, -1.0]  # not all right
    assert group_scores("multistep", [1.5, 1.5], [10, 10], 100) is None  # identical: dropped
    assert group_scores("multistep", [1.5, 1.5], [10, 10], 100, ensure_scores_differ=False) == [
        1.5,
        1.5,
    ]
    assert group_scores("relevance", [-1.0, -1.0], [10, 10], 100) == [-1.0, -1.0]
    assert group_scores("relevance", [1.2, 1.1], [10, 80], 100) == [1.2, 0.44]


# ----- rollouts against the fake server -----------------------------------------------------------


def test_all_right_mismatch_at_turn_two_and_a_wrong_count():
    ep = episode(THREE_STEPS)
    bad_second = "<think>rollout 1 turn 1</think>\n" + blocks(call("get_forecast", city="Oslo"))
    extra = "<think>rollout 2 turn 0</think>\n" + blocks(PROFILE, PROFILE)
    script = [
        [good(ep, t, 0) for t in range(3)],
        [good(ep, 0, 1), bad_second, good(ep, 2, 1)],
        [extra, good(ep, 1, 2), good(ep, 2, 2)],
        [good(ep, 0, 3), good(ep, 1, 3), "<think>rollout 3</think>Done, I think."],
    ]
    environment, trajectories, responder = run_group(ep, script)
    assert [environment.reward(ep, tr) for tr in trajectories] == pytest.approx(
        [1.5, 1 / 3 - 0.2, 1 / 3 - 0.2, 2 / 3 - 0.2]
    )
    assert [tr.mismatch for tr in trajectories] == [None, "calls", "count", "format"]
    # a wrong call is scored as usual; text around the calls is the policy's fault of form
    assert [tr.outcome("score") for tr in trajectories] == [
        {},
        {},
        {},
        {"outcome": "invalid/format"},
    ]
    assert [tr.turns for tr in trajectories] == [3, 2, 1, 3]
    # deactivation: a failed rollout is never asked again
    assert responder.asked == {
        (0, 0): 1, (0, 1): 1, (0, 2): 1,
        (1, 0): 1, (1, 1): 1,
        (2, 0): 1,
        (3, 0): 1, (3, 1): 1, (3, 2): 1,
    }  # fmt: skip


def test_malformed_think_fails_the_first_turn():
    ep = episode(PARALLEL_THEN_ONE)
    no_think = blocks(WEATHER, TIME)
    script = [[good(ep, 0, 0), good(ep, 1, 0)], [no_think + " rollout 1", good(ep, 1, 1)]]
    environment, trajectories, responder = run_group(ep, script)
    assert [tr.mismatch for tr in trajectories] == [None, "think"]
    assert [environment.reward(ep, tr) for tr in trajectories] == [1.5, -1.0]
    assert (1, 1) not in responder.asked
    _, relaxed, _ = run_group(ep, script, require_think=False)
    assert [tr.mismatch for tr in relaxed] == [None, "format"]  # text after the calls


def test_multiturn_needs_two_correct_calls():
    ep = episode(MULTITURN)
    wrong = "<think>rollout 1 turn 1</think>" + blocks(call("get_forecast", city="Bergen", days=3))
    script = [[good(ep, 0, 0), good(ep, 1, 0)], [good(ep, 0, 1), wrong]]
    assert rewards(ep, script) == [1.5, -1.0]  # 1 of 2 right would be 0.3 elsewhere


def test_relevance_apology_ask_neither_and_a_call():
    ep = episode(RELEVANCE)
    script = [
        ["<think>rollout 0</think>I'm sorry, I can only look things up."],
        ["<think>rollout 1</think>What size and toppings would you like?"],
        ["<think>rollout 2</think>Sorry, I can't order food. Could you tell me what else?"],
        ["<think>rollout 3</think>I can't order food."],
        ["<think>rollout 4</think>" + blocks(call("order_pizza", size="L"))],
    ]
    assert rewards(ep, script) == [1.1, 1.1, 1.2, 1.0, -1.0]


def test_replayed_turns_are_masked_and_trained_spans_are_the_replies():
    ep = episode(THREE_STEPS)
    script = [[good(ep, t, i) for t in range(3)] for i in range(2)]
    environment, trajectories, _ = run_group(ep, script)
    tok = environment.tokenizer
    for i, tr in enumerate(trajectories):
        node = tr.node
        assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
        runs = trained_runs(node)
        # token-exact: each trained span is what the fake server generated for that reply
        expected = [tok.encode(script[i][t], add_special_tokens=False) for t in range(3)]
        assert runs == [ids + [tok.eos_token_id] for ids in expected]
        pairs = zip(node.tokens, node.masked_tokens, strict=True)
        masked_text = tok.decode([t for t, m in pairs if m == -100])
        for turn in ep.turns[1:]:
            assert turn.replay[0]["content"] in masked_text
        roles = [m["role"] for m in tr.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert tok.decode(node.tokens) == tok.apply_chat_template(tr.messages, tokenize=False)[:-1]


def test_a_turn_that_would_not_fit_stops_the_rollout_without_penalty():
    ep = episode(THREE_STEPS)
    script = [[good(ep, t, i) for t in range(3)] for i in range(2)]
    environment, trajectories, _ = run_group(ep, script)
    masks = trajectories[0].node.masked_tokens
    ends = [
        j + 1
        for j in range(len(masks))
        if masks[j] != -100 and (j + 1 == len(masks) or masks[j + 1] == -100)
    ]
    limit = ends[1] + 5  # the second reply fits, the third turn's prompt does not
    environment, short, responder = run_group(ep, script, max_token_length=limit)
    assert [tr.stopped for tr in short] == ["budget", "budget"]
    assert short[0].outcome("mask") == {
        "outcome": "truncated/tokens",
        "set_advantage_to_zero": True,
    }
    assert [tr.mismatch for tr in short] == [None, None]
    assert all(len(tr.node.tokens) <= limit and tr.turns == 2 for tr in short)
    assert [environment.reward(ep, tr) for tr in short] == pytest.approx([2 / 3, 2 / 3])
    assert (0, 2) not in responder.asked and (0, 1) in responder.asked


def collect(ep: ToolEpisode, script: list[list[str]], **env: object):
    """(group, env) from `collect_trajectories` of `ep` played by `script`, metrics logged."""
    with FakeInferenceServer(responder=Scripted(ep, script)) as fake:
        environment = make(fake.base_url, group_size=len(script), **env)

        async def main():
            await environment.setup()
            group, backlog = await environment.collect_trajectories(ep)
            assert backlog == []
            await environment.wandb_log()
            await environment.aclose()
            return group

        return asyncio.run(main()), environment


def test_collect_trajectories_builds_a_token_exact_group():
    ep = episode(THREE_STEPS)
    right = [good(ep, t, 0) for t in range(3)]
    wrong = [good(ep, 0, 1), "<think>rollout 1</think>" + blocks(PROFILE), good(ep, 2, 1)]
    group, environment = collect(ep, [right, wrong])
    assert group["scores"] == pytest.approx([1.5, 1 / 3 - 0.2])
    assert group["token_source"] == "server" and len(group["inference_logprobs"]) == 2
    assert group["messages"][0][-1]["content"] == right[2]
    assert len(group["messages"][1]) == 5  # stopped after its second reply
    assert environment.metrics["train/percent_correct"] == 0.5
    assert environment.metrics["train/mismatch_rate"] == 0.5
    assert environment.metrics["train/avg_reward"] == pytest.approx((1.5 + 1 / 3 - 0.2) / 2)


def test_identical_groups_are_dropped_except_relevance():
    ep = episode(PARALLEL_THEN_ONE)
    all_right = [[good(ep, t, i) for t in range(2)] for i in range(2)]
    assert collect(ep, all_right)[0] is None
    kept, _ = collect(ep, all_right, ensure_scores_are_not_same=False)
    assert kept["scores"] == [1.5, 1.5]
    same = [["<think>rollout 0</think>Sorry."], ["<think>rollout 1</think>Sorry."]]
    group, _ = collect(episode(RELEVANCE), same)
    assert group["scores"] == [1.1, 1.1]


# ----- the environment end to end -----------------------------------------------------------------


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, demo_responder, items=4, group_size=6)
    assert report.groups >= 1 and report.token_sources == {"server"}


def test_process_writes_jsonl_and_html(tmp_path):
    out = tmp_path / "tool_use_multiturn.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make(fake.base_url, group_size=6, total_steps=3, data_path_to_save_groups=str(out))
        run = process_with_runner(env)
    assert len(run.groups) == 3
    for group in run.groups:
        assert len(set(group["scores"])) > 1 and len(group["tokens"]) == 6
        assert group["messages"][0][0]["content"].startswith(SYSTEM_PREAMBLE)
    assert "tool_response" in run.page
    assert run.metrics["groups"] == 3


def test_evaluate_reports_avg_reward_and_percent_correct(tmp_path):
    def always_right(prompt: str) -> str | None:
        for ep in load_episodes("test"):
            user = ep.context[1]["content"]
            if user in prompt:
                return reply_for(ep, turn_of(ep, prompt), right=True)
        return None

    run = evaluate_against(make, always_right, tmp_path, setup=True)
    assert run.metrics["eval/percent_correct"] == 1.0
    assert run.metrics["eval/avg_reward"] == pytest.approx((5 * 1.5 + 1.2) / 6)
    samples = run.samples
    assert len(samples) == 6 and {s["scenario"] for s in samples} >= {"relevance", "multiturn"}
    assert run.doc["results"]["all"] == run.metrics


def test_demo_responder_mixes_right_and_wrong_replies():
    ep = load_episodes("train")[4]  # a multistep episode
    prompt = f"<|im_start|>user\n{ep.context[1]['content']}<|im_end|>"
    replies = [demo_responder(prompt) or "" for _ in range(3)]
    checks = [check_reply(r, ep.turns[0].calls).mismatch for r in replies]
    assert None in checks and any(c is not None for c in checks)
    later = prompt + ep.turns[1].replay[-1]["content"]
    assert json.dumps(ep.turns[1].calls[0]) in reply_for(ep, turn_of(ep, later), True)
    assert demo_responder("What is 2 + 2?") is None


def test_an_openai_server_is_refused():
    env = make("http://127.0.0.1:9/v1")
    env.server_configs[0].server_type = "openai"
    with pytest.raises(ValueError, match="token server"):
        asyncio.run(env.setup())


def test_defaults_and_registration():
    config, [server] = env_defaults(ToolUseMultiTurn)
    assert isinstance(config, ToolUseMultiTurnConfig) and config.dataset_name is None
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert config.test_fraction == 0.05 and config.require_think and config.temperature == 0.8
    assert config.eval_temperature == 0.0 and config.max_gen_per_turn == 1024
    assert registry.get("tool_use_multiturn") is ToolUseMultiTurn
