"""`blackjack` and `blackjack_thinking` against the fake server: moves, rewards, the turn cap,
token-exact multi-turn sequences, per-step groups with advantages, check_env, the CLI."""

from __future__ import annotations

import asyncio
import re
import sys
from functools import partial

import pytest

pytest.importorskip("gymnasium")

from atropos.environments.games import episodes, require_gymnasium  # noqa: E402
from atropos.environments.games.blackjack import (  # noqa: E402
    RULES,
    THINKING_RULES,
    Blackjack,
    BlackjackGame,
    BlackjackThinking,
    demo_responder,
    parse_action,
    think_content,
    thinking_reward,
)
from atropos.environments.games.value import optimal_value  # noqa: E402
from atropos.envs import registry  # noqa: E402
from atropos.install import install_hint  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

from ..helpers import check_against, env_defaults, evaluate_against, process_through_cli  # noqa: E402
from .helpers import Script, assistant_turns, collect, make, take, trained_spans  # noqa: E402

STRING_ARGUMENTS = (
    '<tool_call>{"name": "take_action", "arguments": "{\\"action\\": \\"hit\\"}"}</tool_call>'
)

# ----- moves and rewards -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        (take("hit"), "hit"),
        (take("stick", think="16 against a 6"), "stick"),
        (take(" Stick "), "stick"),
        (STRING_ARGUMENTS, "hit"),  # arguments as a JSON string
        (take("double"), None),  # not a move of this game
        (take("hit") + take("stick"), None),  # two calls: ambiguous
        (take("hit") + "<tool_call>{oops</tool_call>", None),  # a malformed call
        ('<tool_call>{"name": "act", "arguments": {"action": "hit"}}</tool_call>', None),
        ("<think>" + take("hit") + "</think>I am not sure.", None),  # a call inside thinking
        ("hit", None),
        ("", None),
    ],
)
def test_parse_action(reply, action):
    assert parse_action(reply) == action


def test_thinking_reward_terms():
    assert thinking_reward(1.0, valid=True, thought="x", tokens=0, limit=100) == pytest.approx(1.41)
    assert thinking_reward(0.0, valid=True, thought=None, tokens=100, limit=100) == 0.0
    assert thinking_reward(-1.0, valid=False, thought="", tokens=50, limit=100) == pytest.approx(
        -1.395
    )
    assert thinking_reward(0.0, valid=True, thought="x", tokens=500, limit=100) == 0.4  # clipped
    assert think_content("<think>\n</think>" + take("hit")) == ""
    assert think_content(take("hit")) is None


def seed_where(predicate) -> int:
    return next(s for s in range(10_000) if predicate(BlackjackGame(s)))


def test_a_game_replays_exactly_and_an_unparseable_move_ends_it_with_minus_one():
    seed = seed_where(lambda g: g.state[0] <= 11)  # a hit cannot bust
    game = BlackjackGame(seed)
    game.act(take("hit"))
    assert not game.done and game.actions == ["hit"] and game.reward == 0.0
    twin = game.replay()
    assert twin.state == game.state and twin.env.unwrapped.player == game.env.unwrapped.player
    twin.act(take("stick"))
    again = game.replay()
    again.act(take("stick"))
    assert (again.reward, again.env.unwrapped.dealer) == (twin.reward, twin.env.unwrapped.dealer)
    game.act("I'll hit, I think.")
    assert game.done and game.invalid and game.reward == -1.0


def test_values_of_game_states_are_the_exact_v_star():
    game = BlackjackGame(seed_where(lambda g: g.state[0] < 21))
    total, up, ace = game.state
    assert game.value() == float(optimal_value(total, up, ace))
    natural = BlackjackGame(seed_where(lambda g: g.state[0] == 21))
    assert natural.natural and natural.value() == float(
        optimal_value(21, natural.state[1], True, True)
    )
    natural.act(take("stick"))
    assert natural.done and natural.value() == 0.0


# ----- whole episodes --------------------------------------------------------------------------


def test_episodes_are_token_exact_with_every_reply_trained_and_observations_masked():
    script = Script([take("hit"), take("hit", think="still low"), take("stick")])
    with FakeInferenceServer(responder=script) as fake:
        env = make(Blackjack, fake.base_url)
        game = BlackjackGame(seed_where(lambda g: g.state[0] <= 8))  # two hits cannot bust

        async def main():
            async with env.server.managed_server(tokenizer=env.tokenizer) as session:
                played = await episodes.play(
                    session, game, RULES, max_turns=10, max_token_length=4096, reply_tokens=64
                )
                drift = dict(session.drift_counts)
            await env.aclose()
            return played, drift

        played, drift = asyncio.run(main())
        tok = fake.tokenizer
    node = played.node
    replies = assistant_turns(node.messages)
    assert replies == [take("hit"), take("hit", think="still low"), take("stick")]
    assert played.turns == 3 and game.done and not played.truncated
    spans = trained_spans(node.tokens, node.masked_tokens)
    assert [tok.decode(s) for s in spans] == [r + "<|im_end|>" for r in replies]
    masked = tok.decode(
        [t for t, m in zip(node.tokens, node.masked_tokens, strict=True) if m == -100]
    )
    assert RULES in masked and "Your hand sum" in masked and "take_action" not in masked[-200:]
    assert {k.value: v for k, v in drift.items() if v} == {"clean": 2}  # extended by ids
    assert all(
        lp <= 0 for lp, m in zip(node.logprobs, node.masked_tokens, strict=True) if m != -100
    )


def test_groups_of_one_seed_are_scored_by_the_final_reward():
    with FakeInferenceServer(responder=Script([take("stick"), "no idea"])) as fake:
        [group] = collect(make(Blackjack, fake.base_url))
        tok = fake.tokenizer
    assert len(group["tokens"]) == 4 and group["token_source"] == "server"
    invalid = [i for i, m in enumerate(group["messages"]) if m[-1]["content"] == "no idea"]
    assert invalid and all(group["scores"][i] == -1.0 for i in invalid)
    stuck = [i for i in range(4) if i not in invalid]
    assert len({group["scores"][i] for i in stuck}) == 1  # same seed, same move: same outcome
    first = {tuple(m[1].items()) for m in group["messages"]}
    assert len(first) == 1  # every episode of the group starts from the same deal
    for tokens, masks, messages in zip(
        group["tokens"], group["masks"], group["messages"], strict=True
    ):
        spans = [tok.decode(s, skip_special_tokens=True) for s in trained_spans(tokens, masks)]
        assert spans == assistant_turns(messages)


def test_the_episode_stops_at_max_turns_and_scores_the_last_reward():
    assert Blackjack.config_init()[0].max_turns == 10
    seed = seed_where(lambda g: g.state[0] <= 7 and not BlackjackGame(g.seed, ["hit"] * 2).done)
    with FakeInferenceServer(responder=Script([take("hit")])) as fake:
        env = make(Blackjack, fake.base_url, max_turns=2, first_seed=seed)
        [group] = collect(env)
    assert group["scores"] == [0.0] * 4
    assert all(len(assistant_turns(m)) == 2 for m in group["messages"])
    assert group["overrides"] == [{"outcome": "truncated/turns"}] * 4  # scored as it stands


def test_the_loop_caps_an_endless_game_at_max_turns():
    class Endless:
        done = False

        def observation(self) -> str:
            return "go on"

        def act(self, reply: str) -> None:
            pass

    with FakeInferenceServer(responder=Script(["ok"])) as fake:
        env = make(Blackjack, fake.base_url)

        async def main():
            async with env.server.managed_server(tokenizer=env.tokenizer) as session:
                capped = await episodes.play(
                    session, Endless(), "rules", max_turns=10, max_token_length=4096, reply_tokens=8
                )
                budget = await episodes.play(
                    session, Endless(), "rules", max_turns=10, max_token_length=120, reply_tokens=8
                )
            await env.aclose()
            return capped, budget

        capped, budget = asyncio.run(main())
    assert capped.turns == 10 and capped.truncated
    assert 1 <= budget.turns < 10 and len(budget.node.tokens) <= 120
    # a limit-hit episode is marked by the limit that cut it, under the env's rule
    assert (capped.limit, budget.limit) == ("turns", "tokens")
    entries = episodes.outcome_entries([capped, budget], "mask")
    assert entries[0] == {"outcome": "truncated/turns", "set_advantage_to_zero": True}


# ----- the thinking variant --------------------------------------------------------------------


def test_an_alternative_scores_combined_reward_plus_the_change_in_v_star():
    game = BlackjackGame(seed_where(lambda g: 12 <= g.state[0] <= 16))
    env = make(BlackjackThinking, "http://127.0.0.1:9/v1", reply_tokens=100)
    v_s = float(optimal_value(*game.state))
    after, score = env.alternative(game, take("hit", think="ok"), tokens=40)
    v_next = 0.0 if after.done else float(optimal_value(*after.state))
    expected = after.reward + 0.2 + 0.2 + 0.01 * 0.6 + v_next - v_s
    assert score == pytest.approx(expected) and game.actions == []  # the game itself is unchanged
    after, score = env.alternative(game, "I hit.", tokens=100)
    assert after.invalid and score == pytest.approx(-1.0 - 0.2 - 0.2 + 0.0 + 0.0 - v_s)
    after, score = env.alternative(game, take("stick"), tokens=0)
    assert after.done and score == pytest.approx(after.reward + 0.2 - 0.2 + 0.01 - v_s)


def test_thinking_returns_one_group_per_step_and_plays_the_best_alternative():
    replies = [take("hit", "low"), "<think>hmm</think>hit", take("stick"), take("stick", "ok")]
    with FakeInferenceServer(responder=Script(replies)) as fake:
        env = make(
            BlackjackThinking, fake.base_url, first_seed=seed_where(lambda g: g.state[0] <= 8)
        )
        groups, backlog = asyncio.run(_collect_raw(env))
        tok = fake.tokenizer
    assert backlog == [] and isinstance(groups, list) and len(groups) >= 2
    for n, group in enumerate(groups):
        assert len(group["tokens"]) == 4
        scores = group["scores"]
        mean = sum(scores) / 4
        for tokens, masks, adv, score, messages in zip(
            group["tokens"],
            group["masks"],
            group["advantages"],
            scores,
            group["messages"],
            strict=True,
        ):
            [span] = trained_spans(tokens, masks)  # only this step's reply is trained
            assert tok.decode(span, skip_special_tokens=True) == messages[-1]["content"]
            assert len(adv) == len(tokens)
            assert all(
                a == (0.0 if m == -100 else pytest.approx(score - mean))
                for a, m in zip(adv, masks, strict=True)
            )
        best = max(range(4), key=scores.__getitem__)
        if n + 1 < len(groups):  # the next step continues the best alternative
            history = groups[n + 1]["messages"][0]
            assert history[: len(group["messages"][best])] == group["messages"][best]
    assert groups[0]["messages"][0][0]["content"] == THINKING_RULES


async def _collect_raw(env):
    await env.setup()
    out = await env.collect_trajectories(await env.get_next_item())
    await env.aclose()
    return out


# ----- runs, checks, registration --------------------------------------------------------------


@pytest.mark.parametrize("cls", [Blackjack, BlackjackThinking])
def test_check_env_passes(cls):
    report = check_against(partial(make, cls), demo_responder, items=2)
    assert report.groups >= 2 and report.token_sources == {"server"}


@pytest.mark.parametrize("name", ["blackjack", "blackjack_thinking"])
def test_process_from_the_command_line_writes_mixed_groups_and_html(tmp_path, name):
    out = tmp_path / f"{name}.jsonl"
    # about 6 groups in 10 come out mixed (the demo plays a worse move on every third call):
    # 12 groups make all-equal groups (once seen with 4) a chance of about 1 in 60,000
    run = process_through_cli(registry.get(name), demo_responder, out, steps=12, group_size=4)
    groups = run.groups
    assert len(groups) >= 12 and any(len(set(g["scores"])) > 1 for g in groups)
    assert all(bool(g.get("advantages")) == (name == "blackjack_thinking") for g in groups)
    assert "take_action" in run.page


def test_evaluate_reports_rates_that_sum_to_one(tmp_path):
    run = evaluate_against(
        partial(make, Blackjack), demo_responder, tmp_path, setup=True, eval_episodes=12
    )
    metrics = run.metrics
    keys = ["win_rate", "loss_rate", "draw_rate", "avg_reward"]
    assert sorted(metrics) == sorted(f"blackjack_eval/{k}" for k in keys)
    rates = [metrics[f"blackjack_eval/{k}"] for k in keys[:3]]
    assert sum(rates) == pytest.approx(1.0)
    assert metrics["blackjack_eval/avg_reward"] == pytest.approx(rates[0] - rates[1])
    assert len(run.samples) == 12 and run.samples[0]["seed"] == 1_000_000


def test_training_metrics_are_logged_and_reset():
    env = make(Blackjack, "http://127.0.0.1:9/v1")
    env._rewards.extend([1.0, -1.0, 0.0, 1.0])
    asyncio.run(env.wandb_log())
    assert env.metrics == {"train/avg_reward": 0.25, "train/win_rate": 0.5}
    assert env._rewards == []


def test_demo_responder_plays_legal_mixed_moves():
    prompt = "<|im_start|>user\nYour hand sum: 20. Dealer's showing card: 10. Usable ace: no."
    moves = [parse_action(demo_responder(prompt) or "") for _ in range(3)]
    assert sorted(moves) == ["hit", "stick", "stick"]
    thinking = [demo_responder(THINKING_RULES + prompt) or "" for _ in range(4)]
    assert all(parse_action(r) for r in thinking)
    assert sum(think_content(r) is not None for r in thinking) == 3
    assert demo_responder("What is 2 + 2?") is None


def test_registry_resolves_and_defaults():
    assert registry.get("blackjack") is Blackjack
    assert registry.get("blackjack_thinking") is BlackjackThinking
    config, [server] = env_defaults(BlackjackThinking)
    assert (config.temperature, config.top_p, config.tokenizer_name) == (0.7, 0.9, "tiny")
    assert server.base_url == "http://127.0.0.1:9001/v1" and server.server_type == "vllm"


def test_a_missing_gymnasium_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=re.escape(install_hint("games"))):
        require_gymnasium()
    with pytest.raises(ImportError, match="games"):
        BlackjackGame(0)
