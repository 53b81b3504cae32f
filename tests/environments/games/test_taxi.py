"""`taxi` against the fake server: parsing, the fixed pickup rule, scores, metrics, token-exact
sequences, check_env and the CLI."""

from __future__ import annotations

import asyncio
import re
from functools import partial

import pytest

pytest.importorskip("gymnasium")

from atropos.environments.games.taxi import (  # noqa: E402
    RULES,
    Taxi,
    TaxiGame,
    best_move,
    decode,
    demo_responder,
    parse_action,
    picked_up,
    plan_action,
    taxi_score,
)
from atropos.envs import registry  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

from ..helpers import check_against, env_defaults, evaluate_against, process_through_cli  # noqa: E402
from .helpers import assistant_turns, collect, make, trained_spans  # noqa: E402

STANDS = ((0, 0), (0, 4), (4, 0), (4, 3))
WEST, PICKUP = 3, 4


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("4", 4),
        ("Action: 2.", 2),
        ("I go south: **0**\n", 0),
        ("<think>row 3, so 1 or 4?</think>\n3", 3),  # numbers inside thinking do not count
        ("Move 2, then 4 next turn", 4),  # the last number
        ("<think>still thinking about 2", None),  # unclosed thinking: no answer
        ("6", None),
        ("12", None),
        ("south", None),
        ("", None),
    ],
)
def test_parse_action(reply, action):
    assert parse_action(reply) == action


def map_of(game: TaxiGame) -> list[str]:
    text = game.observation()
    return text.split("\n")[1:8]


def drive_to(game: TaxiGame, goal: tuple[int, int]) -> None:
    while (move := best_move(map_of(game), decode(game.state)[:2], goal)) is not None:
        game.step(move)


def test_pickup_is_read_from_the_state_not_from_the_action_index():
    game = TaxiGame(seed=next(s for s in range(100) if TaxiGame(s).mask[WEST]))
    assert game.mask[WEST]
    game.act("3")  # upstream counted action 3 (west) as a pickup
    assert not game.picked_up and not game.done and taxi_score(game) == -1.0
    passenger = decode(game.state)[2]
    drive_to(game, STANDS[passenger])
    assert game.mask[PICKUP] and not game.picked_up
    game.act("4")
    assert game.picked_up and decode(game.state)[2] == 4 and taxi_score(game) == 0.0
    drive_to(game, STANDS[decode(game.state)[3]])
    game.act("5")
    assert game.delivered and game.done and taxi_score(game) == 1.0


def test_picked_up_compares_decoded_states():
    assert picked_up((2, 2, 1, 3), (2, 2, 4, 3))  # into the taxi
    assert not picked_up((2, 2, 4, 3), (2, 1, 4, 3))  # already inside: not a new pickup
    assert not picked_up((2, 2, 1, 3), (2, 1, 1, 3))  # a move


def test_a_masked_or_unparseable_action_ends_the_episode():
    game = TaxiGame(seed=0)
    assert not game.mask[PICKUP]  # the taxi never starts on a waiting passenger... here
    game.act("4")
    assert game.done and game.invalid and not game.picked_up and taxi_score(game) == -1.0
    game = TaxiGame(seed=0)
    game.act("Let me think.")
    assert game.done and game.invalid and taxi_score(game) == -1.0


def test_observation_shows_the_state_the_map_and_the_available_actions():
    game = TaxiGame(seed=3)
    row, column, passenger, destination = decode(game.state)
    text = game.observation()
    assert f"Taxi: row {row}, column {column}." in text and "\x1b" not in text
    assert map_of(game)[1 + row][2 * column + 1] == "T"
    listed = [int(a) for a in re.findall(r"(\d) \(", text.rsplit("Available actions:", 1)[1])]
    assert listed == [a for a, ok in enumerate(game.mask) if ok]


def solver(stop_after_pickup: bool = False):
    """A responder playing shortest plans; with `stop_after_pickup`, an invalid reply once the
    passenger is in the taxi."""

    def respond(prompt: str) -> str:
        if stop_after_pickup and "Passenger: in the taxi" in prompt.rsplit("Taxi: ", 1)[1]:
            return "I am done."
        return f"{plan_action(prompt)}"

    return respond


@pytest.mark.parametrize(("stop", "score"), [(False, 1.0), (True, 0.0)])
def test_groups_score_delivery_pickup_and_are_token_exact(stop, score):
    with FakeInferenceServer(responder=solver(stop)) as fake:
        env = make(Taxi, fake.base_url)
        [group] = collect(env)
        asyncio.run(env.wandb_log())
        tok = fake.tokenizer
    assert group["scores"] == [score] * 4
    assert env.metrics["train/percent_correct"] == (1.0 if score == 1.0 else 0.0)
    assert env.metrics["train/percent_picked_up_passenger"] == 1.0
    for tokens, masks, messages in zip(
        group["tokens"], group["masks"], group["messages"], strict=True
    ):
        assert messages[0] == {"role": "system", "content": RULES}
        spans = [tok.decode(s, skip_special_tokens=True) for s in trained_spans(tokens, masks)]
        assert spans == assistant_turns(messages) and len(spans) >= 3


def test_check_env_passes():
    report = check_against(partial(make, Taxi), demo_responder, items=2)
    assert report.groups == 2 and report.token_sources == {"server"}


def test_process_from_the_command_line_writes_mixed_groups_and_html(tmp_path):
    out = tmp_path / "taxi.jsonl"
    run = process_through_cli(registry.get("taxi"), demo_responder, out, steps=4, group_size=4)
    groups = run.groups
    assert len(groups) == 4
    assert {s for g in groups for s in g["scores"]} == {-1.0, 0.0, 1.0}
    assert max(len(assistant_turns(m)) for g in groups for m in g["messages"]) > 5
    assert "Available actions" in run.page
    assert "train/percent_picked_up_passenger" in run.metric_records[-1]


def test_evaluate_and_registration(tmp_path):
    assert registry.get("taxi") is Taxi
    config, [server] = env_defaults(Taxi)
    assert (config.max_turns, config.tokenizer_name, server.server_type) == (25, "tiny", "vllm")
    run = evaluate_against(partial(make, Taxi), solver(), tmp_path, setup=True, eval_episodes=3)
    assert run.metrics == {
        "taxi_eval/percent_correct": 1.0,
        "taxi_eval/percent_picked_up_passenger": 1.0,
        "taxi_eval/avg_score": 1.0,
    }
