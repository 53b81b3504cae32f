"""`blackjack` and `blackjack_thinking`: gymnasium's Blackjack-v1, one move per chat turn.

Each turn the policy sees its hand sum, the dealer's face-up card and whether it holds a usable
ace, and answers with one Hermes call, `<tool_call>{"name": "take_action", "arguments":
{"action": "stick"|"hit"}}</tool_call>` (after `</think>` when it thinks first). A reply without
exactly one such call ends the episode with -1.

- `blackjack`: `group_size` whole episodes of one seed (up to `max_turns` replies), every
  assistant turn trained; score = the final env reward (+1 / 0 / -1).
- `blackjack_thinking`: per-step windowed GRPO. At each state it samples `group_size`
  alternatives, simulates each (replaying the seed and the moves so far), scores it
  `thinking_reward(...) + V*(s') - V*(s)` with the exact V* of `value.py`, plays the best and
  returns one group per step, with token-level `advantages`. Details: `docs/games.md`.

>>> parse_action('<tool_call>{"name": "take_action", "arguments": {"action": "hit"}}</tool_call>')
'hit'
>>> parse_action("<think>I should hit</think>hit"), think_content("<think> sure </think>x")
(None, 'sure')
>>> round(thinking_reward(1.0, valid=True, thought="...", tokens=100, limit=200), 3)
1.405
"""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.tool_calls import parse_text
from atropos.environments.games import require_gymnasium
from atropos.environments.games.episodes import (
    Episode,
    GameConfig,
    GameConfigT,
    GameEnv,
    fits_next_turn,
    step_group,
)
from atropos.environments.games.value import best_action, optimal_value
from atropos.envs.types import Item, ScoredDataGroup

__all__ = [
    "RULES",
    "THINKING_RULES",
    "Blackjack",
    "BlackjackGame",
    "BlackjackThinking",
    "BlackjackThinkingConfig",
    "demo_responder",
    "observation_text",
    "parse_action",
    "think_content",
    "thinking_reward",
]

ACTIONS = {"stick": 0, "hit": 1}
TOOL = {
    "type": "function",
    "function": {
        "name": "take_action",
        "description": "Play your move: 'hit' draws a card, 'stick' ends your turn.",
        "parameters": {
            "type": "object",
            "properties": {"action": {"type": "string", "enum": ["stick", "hit"]}},
            "required": ["action"],
        },
    },
}
RULES = (
    "You are playing Blackjack against a dealer. Get a hand sum closer to 21 than the dealer's"
    " without going over. Number cards count their value, face cards 10, an ace 1 or 11 (a"
    " 'usable ace' is one counted as 11). 'hit' draws a card; 'stick' ends your turn, then the"
    " dealer draws until it has 17 or more. A win scores +1, a draw 0, a loss -1.\n\n"
    f"You have one tool:\n<tools>\n{json.dumps(TOOL)}\n</tools>\n\n"
    "Answer every turn with exactly one call, in this format:\n<tool_call>\n"
    '{"name": "take_action", "arguments": {"action": "hit"}}\n</tool_call>'
)
THINK_INSTRUCTION = "First reason step by step inside <think> </think> tags, then make the call."
THINKING_RULES = f"{RULES}\n\n{THINK_INSTRUCTION}"
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def parse_action(reply: str) -> str | None:
    """ "stick" or "hit" when the reply (after its last `</think>`) holds exactly one
    `take_action` call with one of them as `action`; else None (an invalid move)."""
    parsed = parse_text(reply)
    if parsed.malformed or len(parsed.calls) != 1:
        return None
    call = parsed.calls[0]
    action = call["arguments"].get("action")
    if call["name"] != "take_action" or not isinstance(action, str):
        return None
    action = action.strip().lower()
    return action if action in ACTIONS else None


def think_content(reply: str) -> str | None:
    """The stripped text of the reply's first `<think>...</think>` block (None: no block)."""
    found = _THINK.search(reply)
    return found.group(1).strip() if found else None


def thinking_reward(
    env_reward: float, *, valid: bool, thought: str | None, tokens: int, limit: int
) -> float:
    """One alternative's combined reward: the env reward of its move, +0.2 / -0.2 for a valid
    / invalid call, +0.2 / -0.2 for non-empty / missing or empty thinking, and a tie-break of
    0.01 * (1 - tokens / limit) favouring shorter replies (`tokens` clipped to [0, limit])."""
    used = min(max(tokens, 0), limit) / limit
    return env_reward + (0.2 if valid else -0.2) + (0.2 if thought else -0.2) + 0.01 * (1.0 - used)


def observation_text(player_sum: int, dealer_card: int, usable_ace: bool) -> str:
    """The user turn for a state.

    >>> observation_text(13, 1, True)
    "Your hand sum: 13. Dealer's showing card: 1 (ace). Usable ace: yes. Hit or stick?"
    """
    shown = "1 (ace)" if dealer_card == 1 else str(dealer_card)
    ace = "yes" if usable_ace else "no"
    return (
        f"Your hand sum: {player_sum}. Dealer's showing card: {shown}. Usable ace: {ace}."
        " Hit or stick?"
    )


class BlackjackGame:
    """One Blackjack-v1 episode, rebuilt exactly from its seed and the moves played."""

    def __init__(self, seed: int, actions: list[str] | tuple[str, ...] = ()) -> None:
        gym = require_gymnasium()
        self.seed = seed
        self.env = gym.make("Blackjack-v1")
        obs, _ = self.env.reset(seed=seed)
        self.state: tuple[int, int, bool] = (int(obs[0]), int(obs[1]), bool(obs[2]))
        self.actions: list[str] = []
        self.reward = 0.0  # of the last move (the final reward once done)
        self.done = False
        self.invalid = False
        for action in actions:
            self.step(action)

    def replay(self) -> BlackjackGame:
        """A copy in the same state: the seed dealt again and the same moves played."""
        return BlackjackGame(self.seed, self.actions)

    @property
    def natural(self) -> bool:
        """Whether the hand is still the opening ace and ten."""
        return len(self.env.unwrapped.player) == 2 and self.state[0] == 21

    def value(self) -> float:
        """V* of the current state (0 once the episode is over)."""
        if self.done:
            return 0.0
        sab = bool(self.env.unwrapped.sab)
        return float(optimal_value(*self.state, natural=self.natural, sab=sab))

    def observation(self) -> str:
        return observation_text(*self.state)

    def step(self, action: str) -> None:
        obs, reward, terminated, truncated, _ = self.env.step(ACTIONS[action])
        self.state = (int(obs[0]), int(obs[1]), bool(obs[2]))
        self.actions.append(action)
        self.reward = float(reward)
        self.done = bool(terminated or truncated)

    def act(self, reply: str) -> None:
        """Play the reply's move; an invalid reply ends the episode with -1."""
        action = parse_action(reply)
        if action is None:
            self.invalid, self.done, self.reward = True, True, -1.0
        else:
            self.step(action)


class Blackjack(GameEnv[GameConfigT]):
    """Blackjack-v1 episodes as multi-turn tool-calling chats; score = the final reward."""

    name = "blackjack"
    rules: ClassVar[str] = RULES
    requires: ClassVar[dict[str, str]] = {"gymnasium": "games"}  # checked before a run

    async def setup(self) -> None:
        require_gymnasium()  # the extra's error at setup, not at the first episode

    def new_game(self, seed: int) -> BlackjackGame:
        return BlackjackGame(seed)

    def score(self, game: Any) -> float:
        return float(game.reward)

    @property
    def _rewards(self) -> list[float]:
        """Final rewards of training episodes since the last `wandb_log`."""
        return self.__dict__.setdefault("_train_rewards", [])  # type: ignore[no-any-return]

    def record(self, episodes: list[Episode]) -> None:
        self._rewards.extend(self.score(e.game) for e in episodes)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        rewards = self._rewards
        if rewards:
            metrics["train/avg_reward"] = sum(rewards) / len(rewards)
            metrics["train/win_rate"] = sum(r > 0 for r in rewards) / len(rewards)
            rewards.clear()
        await super().wandb_log(metrics)

    def eval_metrics(self, episodes: list[Episode]) -> dict[str, float]:
        rewards = [self.score(e.game) for e in episodes]
        n, prefix = len(rewards), f"{self.name}_eval"
        return {
            f"{prefix}/win_rate": sum(r > 0 for r in rewards) / n,
            f"{prefix}/loss_rate": sum(r < 0 for r in rewards) / n,
            f"{prefix}/draw_rate": sum(r == 0 for r in rewards) / n,
            f"{prefix}/avg_reward": sum(rewards) / n,
        }


class BlackjackThinkingConfig(GameConfig):
    """`blackjack_thinking`'s settings: upstream's sampling of alternatives."""

    temperature: float = Field(default=0.7, ge=0, description="sampling temperature (training)")
    top_p: float = Field(default=0.9, gt=0, le=1, description="nucleus sampling of alternatives")


class BlackjackThinking(Blackjack[BlackjackThinkingConfig]):
    """Per-step windowed GRPO on Blackjack-v1 with exact V* shaping; a list of groups per item."""

    name = "blackjack_thinking"
    rules: ClassVar[str] = THINKING_RULES

    def alternative(self, game: BlackjackGame, reply: str, tokens: int) -> tuple[Any, float]:
        """Simulate `reply` from `game`'s state: (the game after it, its score)."""
        after = game.replay()
        before = after.value()
        after.act(reply)
        combined = thinking_reward(
            after.reward,
            valid=not after.invalid,
            thought=think_content(reply),
            tokens=tokens,
            limit=self.config.reply_tokens,
        )
        return after, combined + after.value() - before

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[list[ScoredDataGroup | None], list[Item]]:
        s = self.config
        game = BlackjackGame(int(item["seed"]))
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.rules}]
        groups: list[ScoredDataGroup | None] = []
        sampling = {"temperature": s.temperature, "top_p": s.top_p}
        tokenizer = self.tokenizer  # before the servers, so they share it
        # per-step groups: each is whole (one step's alternatives), so a limit only ends the
        # episode's steps; no row of it is truncated
        limits, started = s.rollout_limits(max_turns=s.max_turns), time.monotonic()
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            held = None
            while not game.done and not limits.exceeded(
                turns=len(groups), seconds=time.monotonic() - started
            ):
                observation = game.observation()
                if held is not None and not fits_next_turn(
                    session, held, observation, s.reply_tokens, s.max_token_length
                ):
                    break
                messages.append({"role": "user", "content": observation})
                turn = await session.chat_turn(
                    messages=messages,
                    n=self.config.group_size,
                    max_tokens=s.reply_tokens,
                    split="train",
                    **sampling,
                )
                start = len(turn.prompt_tokens)
                tried = [
                    self.alternative(game, text, len(node.tokens) - start)
                    for text, node in zip(turn.contents, turn.nodes, strict=True)
                ]
                scores = [score for _, score in tried]
                groups.append(step_group(turn, scores))
                best = max(range(len(scores)), key=scores.__getitem__)
                messages.append({"role": "assistant", "content": turn.contents[best]})
                game, held = tried[best][0], turn.nodes[best]
        self._rewards.append(game.reward)
        return groups, []


_demo_calls = itertools.count()
_STATE = re.compile(r"Your hand sum: (\d+)\. Dealer's showing card: (\d+).*?Usable ace: (yes|no)")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a Blackjack prompt, a call with
    the optimal move on two calls in three and the other move on the third (so groups are
    mixed); under the thinking rules a short `<think>` block first, left out on every fourth
    call. None (random text) for any other prompt."""
    found = _STATE.findall(prompt_text)
    if not found:
        return None
    total, dealer, ace = found[-1]
    best = best_action(int(total), int(dealer), ace == "yes")
    n = next(_demo_calls)
    action = best if n % 3 != 2 else ("hit" if best == "stick" else "stick")
    arguments = json.dumps({"name": "take_action", "arguments": {"action": action}})
    call = f"<tool_call>\n{arguments}\n</tool_call>"
    if THINK_INSTRUCTION not in prompt_text or n % 4 == 3:
        return call
    return f"<think>I hold {total} against a {dealer}, so I {action}.</think>\n{call}"
