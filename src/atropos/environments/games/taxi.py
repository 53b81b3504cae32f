"""`taxi`: gymnasium's Taxi (`Taxi-v3`, `render_mode="ansi"`), one move per chat turn.

The system turn gives the rules; each user turn the decoded state, the map (the ANSI render
without its colours, the taxi drawn as `T`) and the actions available there (the env's
`action_mask`). The move is the last whole number in the reply after its last `</think>`
(`parse_action`); a reply without one, a number outside 0..5, or an action the mask rules out
(a wall, a pickup away from the passenger, ...) ends the episode.

Score: 1 when the passenger is delivered (the env terminates), 0 when they were picked up but
not delivered, -1 otherwise. "Picked up" is read from the state, not from the action index: the
decoded passenger location changes to 4 ("in the taxi") on a step (upstream tested
`action == 3`, which is "west"). Gymnasium 1.4 registers only `Taxi-v4`, whose dynamics
without `is_rainy`/`fickle_passenger` are v3's; it is used when `Taxi-v3` is not registered.

>>> parse_action("<think>the passenger is south, 4 steps</think>Action: 0."), parse_action("6")
(0, None)
>>> decode(328), picked_up((3, 1, 2, 0), (3, 1, 4, 0)), picked_up((3, 1, 4, 0), (3, 0, 4, 0))
((3, 1, 2, 0), True, False)
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from typing import Any, ClassVar

from atropos.environments.games import require_gymnasium
from atropos.environments.games.episodes import Episode, GameEnv

__all__ = [
    "ACTION_NAMES",
    "RULES",
    "Taxi",
    "best_move",
    "TaxiGame",
    "decode",
    "demo_responder",
    "parse_action",
    "picked_up",
    "plain_map",
    "plan_action",
    "taxi_score",
]

ACTION_NAMES = ("south", "north", "east", "west", "pickup", "dropoff")
STANDS = ("R", "G", "Y", "B")
STAND_CELLS = ((0, 0), (0, 4), (4, 0), (4, 3))
IN_TAXI = 4
RULES = (
    "You drive a taxi on a 5x5 grid. Pick the passenger up at their stand, then drop them off"
    " at their destination. The stands are R (row 0, column 0), G (row 0, column 4), Y (row 4,"
    " column 0) and B (row 4, column 3); rows count from 0 at the top, columns from 0 at the"
    " left. On the map T is the taxi, '|' a wall it cannot cross and ':' an open side.\n"
    "Actions: 0 = move south (down), 1 = move north (up), 2 = move east (right), 3 = move west"
    " (left), 4 = pick the passenger up, 5 = drop the passenger off.\n"
    "Each turn shows the state and the actions available in it. Reply with the number of one"
    " available action (you may reason first inside <think> </think>; the last number in your"
    " reply is taken). Any other reply ends the episode.\n"
    "Scoring: 1 for delivering the passenger, 0 for picking them up without delivering them,"
    " -1 otherwise."
)
_NUMBER = re.compile(r"\d+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_action(reply: str) -> int | None:
    """The action of a reply: the last whole number after the last `</think>` (an unclosed
    `<think>` has no answer), when it is 0..5; else None."""
    if "</think>" in reply:
        reply = reply.rsplit("</think>", 1)[1]
    elif "<think>" in reply:
        return None
    numbers = _NUMBER.findall(reply)
    action = int(numbers[-1]) if numbers else None
    return action if action is not None and action < len(ACTION_NAMES) else None


def decode(state: int) -> tuple[int, int, int, int]:
    """(taxi row, taxi column, passenger location, destination) of a Taxi state; passenger
    location 0..3 is a stand (R, G, Y, B), 4 is in the taxi."""
    state, destination = divmod(state, 4)
    state, passenger = divmod(state, 5)
    row, column = divmod(state, 5)
    return row, column, passenger, destination


def picked_up(before: tuple[int, int, int, int], after: tuple[int, int, int, int]) -> bool:
    """Whether a step put the passenger in the taxi (decoded states before and after)."""
    return before[2] != IN_TAXI and after[2] == IN_TAXI


def plain_map(ansi: str, row: int, column: int) -> str:
    """The ANSI render's map without colours, the taxi's cell drawn as `T`."""
    lines = _ANSI.sub("", ansi).splitlines()[:7]
    cells = list(lines[1 + row])
    cells[2 * column + 1] = "T"
    lines[1 + row] = "".join(cells)
    return "\n".join(lines)


def _where(index: int) -> str:
    row, column = STAND_CELLS[index]
    return f"{STANDS[index]} (row {row}, column {column})"


class TaxiGame:
    """One Taxi episode with the outcome flags the score reads."""

    def __init__(self, seed: int) -> None:
        gym = require_gymnasium()
        env_id = "Taxi-v3" if "Taxi-v3" in gym.registry else "Taxi-v4"
        self.env = gym.make(env_id, render_mode="ansi")
        state, info = self.env.reset(seed=seed)
        self.state = int(state)
        self.mask = [int(x) for x in info["action_mask"]]
        self.picked_up = self.delivered = self.done = self.invalid = False

    def observation(self) -> str:
        row, column, passenger, destination = decode(self.state)
        where = "in the taxi" if passenger == IN_TAXI else f"waiting at {_where(passenger)}"
        actions = ", ".join(f"{a} ({ACTION_NAMES[a]})" for a, ok in enumerate(self.mask) if ok)
        return (
            f"Taxi: row {row}, column {column}. Passenger: {where}. Destination:"
            f" {_where(destination)}.\n{plain_map(str(self.env.render()), row, column)}\n"
            f"Available actions: {actions}."
        )

    def step(self, action: int) -> None:
        """Play an action the mask allows."""
        before = decode(self.state)
        state, _, terminated, truncated, info = self.env.step(action)
        self.state = int(state)
        self.mask = [int(x) for x in info["action_mask"]]
        self.picked_up = self.picked_up or picked_up(before, decode(self.state))
        self.delivered = bool(terminated)  # Taxi terminates only on a successful drop-off
        self.done = bool(terminated or truncated)

    def act(self, reply: str) -> None:
        """Play the reply's action; none, or one the mask rules out, ends the episode."""
        action = parse_action(reply)
        if action is None or not self.mask[action]:
            self.invalid = self.done = True
        else:
            self.step(action)


def taxi_score(game: TaxiGame) -> float:
    """1 delivered, 0 picked up, -1 otherwise."""
    return 1.0 if game.delivered else 0.0 if game.picked_up else -1.0


class Taxi(GameEnv):
    """Taxi episodes as multi-turn chats; 1 delivered / 0 picked up / -1."""

    name = "taxi"
    rules: ClassVar[str] = RULES
    requires: ClassVar[dict[str, str]] = {"gymnasium": "games"}  # checked before a run

    async def setup(self) -> None:
        require_gymnasium()  # the extra's error at setup, not at the first episode

    config_defaults: ClassVar[dict[str, Any]] = {
        **GameEnv.config_defaults, "max_turns": 25, "reply_tokens": 256
    }  # fmt: skip

    def new_game(self, seed: int) -> TaxiGame:
        return TaxiGame(seed)

    def score(self, game: Any) -> float:
        return taxi_score(game)

    @property
    def _outcomes(self) -> list[tuple[bool, bool]]:
        """(delivered, picked up) of training episodes since the last `wandb_log`."""
        return self.__dict__.setdefault("_train_outcomes", [])  # type: ignore[no-any-return]

    def record(self, episodes: list[Episode]) -> None:
        self._outcomes.extend((e.game.delivered, e.game.picked_up) for e in episodes)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        outcomes = self._outcomes
        if outcomes:
            metrics["train/percent_correct"] = sum(d for d, _ in outcomes) / len(outcomes)
            metrics["train/percent_picked_up_passenger"] = sum(p for _, p in outcomes) / len(
                outcomes
            )
            outcomes.clear()
        await super().wandb_log(metrics)

    def eval_metrics(self, episodes: list[Episode]) -> dict[str, float]:
        n, prefix = len(episodes), f"{self.name}_eval"
        return {
            f"{prefix}/percent_correct": sum(e.game.delivered for e in episodes) / n,
            f"{prefix}/percent_picked_up_passenger": sum(e.game.picked_up for e in episodes) / n,
            f"{prefix}/avg_score": sum(taxi_score(e.game) for e in episodes) / n,
        }


_demo_calls = itertools.count()
_STATE = re.compile(
    r"Taxi: row (\d), column (\d)\. Passenger: (in the taxi|waiting at \w \(row (\d), column"
    r" (\d)\))\. Destination: \w \(row (\d), column (\d)\)\.\n((?:[+|].*\n){7})"
    r"Available actions: ([^.]*)\."
)


def best_move(grid: list[str], start: tuple[int, int], goal: tuple[int, int]) -> int | None:
    """The first move (0..3) of a shortest path on the map's lines, None when at the goal."""
    steps = {0: (1, 0), 1: (-1, 0), 2: (0, 1), 3: (0, -1)}
    first: dict[tuple[int, int], int | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return first[cell]
        row, column = cell
        for action, (dr, dc) in steps.items():
            nxt = (row + dr, column + dc)
            wall = dc and grid[1 + row][2 * column + 1 + dc] == "|"
            if 0 <= nxt[0] < 5 and 0 <= nxt[1] < 5 and not wall and nxt not in first:
                first[nxt] = action if first[cell] is None else first[cell]
                queue.append(nxt)
    return None


def plan_action(text: str) -> int | None:
    """The action of a shortest plan for the last state `text` shows (None: it shows none)."""
    found = _STATE.findall(text)
    if not found:
        return None
    row, column, passenger, p_row, p_col, d_row, d_col, grid, _ = found[-1]
    carrying = passenger == "in the taxi"
    goal = (int(d_row), int(d_col)) if carrying else (int(p_row), int(p_col))
    move = best_move(grid.splitlines(), (int(row), int(column)), goal)
    return move if move is not None else (5 if carrying else 4)


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a Taxi prompt, the move of a
    shortest plan (`plan_action`), except every fifteenth call, which answers an unavailable
    action (ending the episode), so groups are mixed. None (random text) for other prompts."""
    action = plan_action(prompt_text)
    if action is None:
        return None
    if next(_demo_calls) % 15 == 7:
        available = _STATE.findall(prompt_text)[-1][-1]
        action = min(set(range(6)) - {int(a) for a in re.findall(r"(\d) \(", available)})
    return f"Action: {action}"
