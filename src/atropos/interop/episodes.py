"""An Atropos environment as a stepped episode: the one definition both protocols serve (ORS in
`interop.ors.server`, OpenEnv in `interop.openenv.serve`).

`adapter(env)` gives the `Adapter` of an environment's kind: its splits of items, the tools an
episode offers (ORS tool specs: `name`, `description`, `input_schema`) and `start(item)`, a new
`Episode`. An episode has its opening `messages` and is driven one of two ways:

- `call(name, arguments)`: one tool call (ORS's `/call`); ValueError for an unknown tool or
  bad arguments (the policy's mistake: the session goes on);
- `reply(text)`: the policy's whole reply (OpenEnv's `{"message": ...}` action).

Each gives a `Step`: the text the policy sees next, the reward (None: none) and whether the
episode finished. The kinds:

- **single-turn** (`envs.simple.Env`: gsm8k, tool_calling, ...): splits `train` (`load()`) and
  `test` (`load_eval()`, when it has items); the prompt is `prompt(item)`; one tool, `answer
  {"answer"}`; the answer (or the reply) is scored as the policy's whole completion would be,
  `score(item, text)`, and ends the episode.
- **games** (`GameEnv`: blackjack, taxi, ...): items are seeds, split `train` from
  `--env.first_seed` (`GAME_SEEDS` of them) and `test` (`--env.eval_episodes` from
  `--env.eval_seed`); the prompt is the rules and the game's first observation; one tool, `act
  {"command"}`, plays one reply (the move as the rules ask for it); the reward is 0 until the
  game is done, then `score(game)`; a game cut at `--env.max_turns` is scored as it stands (as
  `GameEnv` does).
- **textworld**: split `train` (the configured games); one tool, `act {"command"}`; each
  command's reward is the turn's score change over the maximum (`TextGame.rewards`), so an
  episode's rewards sum to its score; finished when the game ends or after `--env.max_turns`.
- **tool use** (`interop.tool_episodes`): `mcp_tools`, the tools its MCP servers list, run by
  the env's own servers, and `answer`, scored by the env; `tool_use_multiturn`, one `reply`
  per turn judged by the env against the recorded conversation, replayed between turns.

Anything else plays its episodes through its own loop against an inference server (a judge,
searches, an agent harness, credit over the whole group): `adapter` refuses it, naming why and
the kinds that can be published. An episode called after it finished answers `OVER`, finished.
Calls to one episode run one at a time (a game has one state). The parts (`Step`, `Episode`,
`Adapter`) are in `interop.stepped`, shared with the tool-use kinds' module.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.simple import Env
from atropos.interop.stepped import OVER, Adapter, Episode, OneTool, Step, tool_spec

__all__ = ["GAME_SEEDS", "OVER", "Adapter", "Episode", "Step", "adapter", "tool_spec"]

GAME_SEEDS = 2**20  # a game's train split: this many seeds from first_seed


# ----- single-turn ---------------------------------------------------------------------------


class SingleTurn(Adapter):
    """An `Env`: one `answer` (or reply) per episode, scored by the env."""

    tools = [tool_spec("answer", "Give your final answer; it ends the episode.", "answer", "it")]

    async def load(self) -> None:
        env: Any = self.env
        self.splits["train"] = list(env.items)
        test = list(await asyncio.to_thread(env.load_eval))
        if test:
            self.splits["test"] = test

    async def start(self, item: Any) -> Episode:
        return _Answer(self.env, item)


class _Answer(OneTool):
    def __init__(self, env: Any, item: Any) -> None:
        super().__init__()
        self.env, self.item = env, item
        self.messages = [dict(m) for m in env.prompt(item)]

    async def _reply(self, text: str) -> Step:
        value = self.env.score(self.item, text)
        score = float(await value if inspect.isawaitable(value) else value)
        return Step(f"score: {score:g}", score, True)


# ----- games ---------------------------------------------------------------------------------


class Game(Adapter):
    """A `GameEnv`: `act` per move until the game is done, scored by the env at the end."""

    tools = [tool_spec("act", "Play one move.", "command", "your reply, as the rules ask")]

    async def load(self) -> None:
        s: Any = self.env.config
        self.splits["train"] = range(s.first_seed, s.first_seed + GAME_SEEDS)
        self.splits["test"] = range(s.eval_seed, s.eval_seed + s.eval_episodes)

    async def start(self, item: Any) -> Episode:
        return _Move(self.env, int(item))


class _Move(OneTool):
    tool, field = "act", "command"

    def __init__(self, env: Any, seed: int) -> None:
        super().__init__()
        self.env, self.game = env, env.new_game(seed)
        self.max_turns = env.config.max_turns
        system = [{"role": "system", "content": env.rules}] if env.rules else []
        self.messages = [*system, {"role": "user", "content": self.game.observation()}]

    async def _reply(self, text: str) -> Step:
        self.game.act(text)
        if self.game.done:
            return Step("", float(self.env.score(self.game)), True)
        return Step(self.game.observation(), 0.0, False)

    def cut(self, step: Step) -> Step:
        return Step(step.text, float(self.env.score(self.game)), True)


# ----- textworld -----------------------------------------------------------------------------


class TextAdventure(Adapter):
    """`textworld`: one `act` per command until the game ends."""

    tools = [tool_spec("act", "Play one command.", "command", "e.g. 'open door', 'go east'")]

    async def load(self) -> None:
        env: Any = self.env
        s = env.config
        count = len(env.files) if env.files else (s.num_games or 100)
        self.splits["train"] = [env.item(i, s.first_seed, s.num_games) for i in range(count)]

    async def start(self, item: Any) -> Episode:
        from atropos.environments.textworld.game import TextGame, open_backend

        env: Any = self.env
        path = await env.game_file(item)
        lists = env.config.list_commands
        game = await asyncio.to_thread(lambda: TextGame(open_backend(path, lists), lists))
        return _Adventure(game, env.rules, env.config.max_turns)


class _Adventure(OneTool):
    tool, field = "act", "command"

    def __init__(self, game: Any, rules: str, max_turns: int) -> None:
        super().__init__()
        self.game, self.max_turns = game, max_turns
        self.messages = [
            {"role": "system", "content": rules},
            {"role": "user", "content": game.observation()},
        ]

    async def _reply(self, text: str) -> Step:
        await asyncio.to_thread(self.game.act, text)
        observation = await asyncio.to_thread(self.game.observation)
        return Step(observation, float(self.game.rewards[-1]), bool(self.game.done))

    async def close(self) -> None:
        await asyncio.to_thread(self.game.close)


# ----- which -------------------------------------------------------------------------------------

_PUBLISHABLE = (
    "single-turn environments (atropos.envs.Env: gsm8k, tool_calling, ...), games (GameEnv:"
    " blackjack, taxi, ...), textworld, mcp_tools and tool_use_multiturn"
)


def adapter(env: BaseEnv[Any]) -> Adapter:
    """The adapter of `env`'s kind (module docstring).

    Raises:
        ValueError: an environment that plays its own multi-turn loop (named, with why and the
            kinds that can be published).
    """
    module = type(env).__module__
    if isinstance(env, Env):
        return SingleTurn(env)
    if module.startswith("atropos.environments.textworld"):
        return TextAdventure(env)
    if hasattr(env, "new_game") and hasattr(env, "rules"):  # a GameEnv
        return Game(env)
    if module.startswith("atropos.environments.mcp_tools"):
        from atropos.interop.tool_episodes import ToolUse

        return ToolUse(env)
    if module.startswith("atropos.environments.tool_use_multiturn"):
        from atropos.interop.tool_episodes import Replayed

        return Replayed(env)
    name = env.name or type(env).__name__
    raise ValueError(
        f"{name} cannot be published: it plays its episodes through its own loop against an"
        f" inference server ({_why(module)}), so a remote policy cannot step it a turn at a"
        f" time. Publishable: {_PUBLISHABLE}"
    )


def _why(module: str) -> str:
    """What keeps an environment's loop whole, where we know it."""
    for part, why in _WHY.items():
        if f".{part}" in module:
            return why
    return "its rollout is one call: collect_trajectories"


_WHY = {
    "deep_research": "its searches and its judge run inside the loop",
    "agent_tools": "its agent harness runs the whole episode",
    "harness": "its agent harness runs the whole episode",
    "mt_grpo": "its turn credit is computed over the whole group",
    "evals": "an evaluation suite: it evaluates with its own loop and has no episodes to train",
    "sft_loader": "it serves recorded SFT data, not episodes",
    "verifiers": "the verifiers environment's own rollout runs the episode",
}
