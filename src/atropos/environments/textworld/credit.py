"""Per-turn credit for whole episodes: score changes per turn become token-level advantages.

With `--env.advantages turn`, a group of G episodes of one game gets an `advantages` row per
sequence instead of leaving the trainer to spread one episode score over every token:

1. each turn's reward is the score it gained, over the game's maximum;
2. each turn's return is its reward plus the (discounted) rewards of the turns after it;
3. the advantage of turn k is its return minus the mean return at turn k of the group's
   episodes that played a turn k (an episode that already ended is no baseline for later turns);
4. every trained token of turn k's reply gets that advantage; masked positions get 0.0.

A turn's reply is found from `TurnRecorder`: the sequence node of each turn, whose prompt ends
where the reply starts. When the final sequence does not extend every turn's node (the chat
template rewrote history, a `FORK`), the positions are unknown and the group keeps the plain
episode scores (`turn_rows` returns None).

>>> returns_to_go([0.0, 0.5, 0.0, 0.5], discount=1.0)
[1.0, 1.0, 0.5, 0.5]
>>> turn_advantages([[1.0, 1.0], [0.0, 0.0, 0.0]])
[[0.5, 0.5], [-0.5, -0.5, 0.0]]
"""

from __future__ import annotations

from typing import Any

from atropos.environments.games.episodes import token_advantages
from atropos.inference.managed import ChatTurn
from atropos.inference.sequence import SequenceNode

__all__ = ["TurnRecorder", "returns_to_go", "turn_advantages", "turn_rows"]


class TurnRecorder:
    """A `ManagedServer` for `episodes.play` that keeps where each turn's reply starts and the
    node it ends in."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.tokenizer = session.tokenizer
        self.turns: list[tuple[int, SequenceNode]] = []  # (reply start, node) per turn

    async def chat_turn(self, **kwargs: Any) -> ChatTurn:
        turn: ChatTurn = await self.session.chat_turn(**kwargs)
        self.turns.append((len(turn.prompt_tokens), turn.nodes[0]))
        return turn


def returns_to_go(rewards: list[float], discount: float) -> list[float]:
    """Each turn's reward plus the discounted rewards of the turns after it."""
    out: list[float] = []
    running = 0.0
    for reward in reversed(rewards):
        running = reward + discount * running
        out.append(running)
    return out[::-1]


def turn_advantages(returns: list[list[float]]) -> list[list[float]]:
    """Each episode's per-turn returns minus the mean return at that turn over the episodes
    that played it."""
    longest = max((len(r) for r in returns), default=0)
    baselines = []
    for k in range(longest):
        played = [r[k] for r in returns if len(r) > k]
        baselines.append(sum(played) / len(played))
    return [[g - baselines[k] for k, g in enumerate(r)] for r in returns]


def _spans(final: SequenceNode, turns: list[tuple[int, SequenceNode]]) -> list[tuple[int, int]]:
    """Each turn's reply as positions of `final`; [] when `final` does not extend a turn."""
    spans = []
    for start, node in turns:
        end = len(node.tokens)
        if final.tokens[:end] != node.tokens:
            return []
        spans.append((start, end))
    return spans


def turn_rows(
    finals: list[SequenceNode],
    turns: list[list[tuple[int, SequenceNode]]],
    rewards: list[list[float]],
    discount: float,
) -> list[list[float]] | None:
    """The `advantages` rows of a group of episodes (one per final sequence, as long as its
    tokens), or None when some episode's turns cannot be placed in its sequence."""
    advantages = turn_advantages([returns_to_go(r, discount) for r in rewards])
    rows = []
    for final, episode_turns, episode_advantages in zip(finals, turns, advantages, strict=True):
        spans = _spans(final, episode_turns)
        if len(spans) != len(episode_advantages):
            return None
        row = [0.0] * len(final.tokens)
        for (start, end), advantage in zip(spans, episode_advantages, strict=True):
            row[start:end] = token_advantages(final.masked_tokens[start:end], advantage)
        rows.append(row)
    return rows
