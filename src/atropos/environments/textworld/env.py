"""`TextWorld`: the environment, its config, and the groups of whole game episodes.

Items are game seeds (`{"seed": n}`), or with `--env.game_files` the user's game files
(`{"game": path}`) in turn. A group is `group_size` episodes of one game, each played with
`episodes.play` in its own token-exact session; the score of an episode is the game's points
over its maximum (0 to 1). With `--env.advantages turn` the group also carries per-token
advantages from each turn's score change (`credit.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from atropos.environments.games.episodes import (
    Episode,
    GameConfig,
    episode_group,
    outcome_entries,
    play,
)
from atropos.environments.textworld.credit import TurnRecorder, turn_rows
from atropos.environments.textworld.game import TextGame, is_story_file, open_backend
from atropos.environments.textworld.generate import (
    GameSpec,
    default_cache_dir,
    ensure_game,
    require_textworld,
)
from atropos.envs.base import BaseEnv
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.outcome import with_outcomes
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.sequence import SequenceNode

__all__ = ["RULES", "Played", "TextWorld", "TextWorldConfig"]

RULES = (
    "You are playing a text adventure game. Each turn you read what happens and answer with one"
    " command for the game, in the imperative, as a player types it: for example 'go north',"
    " 'take the key', 'open the chest', 'unlock the door with the key', 'put the apple on the"
    " table', 'examine the desk', 'look' or 'inventory'. The game's opening text says what you"
    " have to do. You may think first inside <think> </think>; the last line of your reply"
    " after it is sent to the game as the command, so put nothing after the command. You score"
    " points by completing the game's goals; win by completing all of them in as few turns as"
    " you can."
)


class TextWorldConfig(GameConfig):
    """`textworld`'s settings (beside the game loop's, `GameConfig`)."""

    difficulty: Literal["easy", "medium", "hard"] = Field(
        default="easy", description="preset of the generated games (generate.PRESETS)"
    )
    world_size: int | None = Field(default=None, ge=1, description="rooms (unset: the preset's)")
    nb_objects: int | None = Field(
        default=None, ge=1, description="objects in the world (unset: the preset's)"
    )
    quest_length: int | None = Field(
        default=None, ge=1, description="actions in each quest's solution (unset: the preset's)"
    )
    nb_quests: int | None = Field(
        default=None, ge=1, description="quests, a point each (unset: the preset's)"
    )
    num_games: int = Field(
        default=1000, ge=0, description="training games, seeds first_seed on, reused in turn"
        " (0: a new game for every item)",
    )  # fmt: skip
    cache_dir: str | None = Field(
        default=None,
        description="where generated games are kept (unset: ~/.cache/atropos/textworld)",
    )
    game_files: list[str] | str = Field(
        default_factory=list,
        description="your own .z5/.z8 games or folders of them, comma-separated: played instead"
        " of generated games (jericho's supported games, or TextWorld games with their .json)",
    )
    list_commands: bool = Field(
        default=False, description="list the commands that make sense after each observation"
        " (TextWorld games only)",
    )  # fmt: skip
    advantages: Literal["episode", "turn"] = Field(
        default="episode",
        description="episode: the trainer spreads each episode's score; turn: per-token"
        " advantages from each turn's score change (credit.py)",
    )
    discount: float = Field(
        default=1.0, ge=0, le=1, description="discount of later rewards in a turn's return"
    )

    def spec(self) -> GameSpec:
        """The generated games' spec: the preset with the sizes given here."""
        return GameSpec.of(
            self.difficulty,
            rooms=self.world_size,
            objects=self.nb_objects,
            quest_length=self.quest_length,
            quests=self.nb_quests,
        )


@dataclass
class Played:
    """One episode and the node of each of its turns (where each reply starts and ends)."""

    episode: Episode
    turns: list[tuple[int, SequenceNode]]

    @property
    def game(self) -> TextGame:
        game: TextGame = self.episode.game
        return game


def game_files(entries: list[str] | str) -> list[Path]:
    """The z-machine files named by `entries` (a list, or a comma-separated string, of files and
    of folders searched for `*.z1` to `*.z8`), sorted within each folder."""
    if isinstance(entries, str):
        entries = [entry.strip() for entry in entries.split(",") if entry.strip()]
    found: list[Path] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if path.is_dir():
            found += sorted(p for p in path.iterdir() if is_story_file(p))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"--env.game_files: no file or folder at {path}")
    if entries and not found:
        raise FileNotFoundError(f"--env.game_files: no .z1 to .z8 games in {entries}")
    return found


class TextWorld(BaseEnv[TextWorldConfig]):
    """Text adventure games (generated by TextWorld, or your own z-machine files) as multi-turn
    chats; score = points over the maximum."""

    name = "textworld"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 8192, "max_turns": 30, "use_wandb": False
    }  # fmt: skip
    requires: ClassVar[dict[str, str]] = {"textworld": "textworld", "jericho": "textworld"}
    rules: ClassVar[str] = RULES

    async def setup(self) -> None:
        require_textworld()
        self.files = game_files(self.config.game_files)
        self.cache = Path(self.config.cache_dir or default_cache_dir()).expanduser()

    async def get_next_item(self) -> Item:
        index = self.__dict__.setdefault("_next_index", 0)
        self._next_index = index + 1
        return self.item(index, self.config.first_seed, self.config.num_games)

    def checkpoint_state(self) -> dict[str, Any]:
        """Where the items are: a restarted run goes on with the next game, not the first."""
        return {"next_index": self.__dict__.get("_next_index", 0)}

    def restore_state(self, state: dict[str, Any]) -> None:
        self._next_index = int(state.get("next_index", 0))

    def item(self, index: int, first_seed: int, pool: int) -> Item:
        """The `index`-th item: the user's files in turn, else seeds from `first_seed`, the
        first `pool` of them in turn (0: no reuse)."""
        files = self.__dict__.get("files") or []
        if files:
            return {"game": str(files[index % len(files)])}
        return {"seed": first_seed + (index % pool if pool else index)}

    async def game_file(self, item: Item) -> Path:
        """The game an item names, generated into the cache first when needed."""
        if "game" in item:
            return Path(item["game"])
        return await ensure_game(self.cache, self.config.spec(), int(item["seed"]))

    async def play_one(self, path: Path, split: str = "train", **sampling: Any) -> Played:
        """One episode of the game at `path`, in its own token-exact session."""
        s = self.config
        game = TextGame(open_backend(path, s.list_commands), s.list_commands)
        tokenizer = self.tokenizer  # before the servers, so they share it
        try:
            async with self.server.managed_server(tokenizer=tokenizer) as session:
                recorder = TurnRecorder(session)
                episode = await play(
                    recorder,
                    game,
                    self.rules,
                    limits=s.rollout_limits(max_turns=s.max_turns),
                    max_token_length=s.max_token_length,
                    reply_tokens=s.reply_tokens,
                    split=split,
                    **{"temperature": s.temperature, **sampling},
                )
        finally:
            game.close()
        return Played(episode, recorder.turns)

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup | None] | None, list[Item]]:
        path = await self.game_file(item)
        played = list(
            await asyncio.gather(*(self.play_one(path) for _ in range(self.config.group_size)))
        )
        group = episode_group([p.episode for p in played], [p.game.score for p in played])
        if self.config.advantages == "turn":
            rows = turn_rows(
                [p.episode.node for p in played],
                [p.turns for p in played],
                [p.game.rewards for p in played],
                self.config.discount,
            )
            if rows is not None:
                group["advantages"] = rows
            self.record_mean("train/turn_advantages_placed", [float(rows is not None)])
        self.record_mean("train/score", [p.game.score for p in played])
        self.record_mean("train/won", [float(p.game.won) for p in played])
        self.record_mean("train/turns", [float(p.episode.turns) for p in played])
        entries = outcome_entries([p.episode for p in played], self.config.truncated)
        return with_outcomes(group, entries), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """`eval_episodes` episodes, one sample each, at `eval_temperature`: the games of seeds
        `eval_seed` on (or the user's files in turn). Writes `metrics.json` and
        `samples.jsonl` to `data_dir_to_save_evals` (`envs.evaluation.evaluate_each`)."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.reply_tokens}
        items = [self.item(i, s.eval_seed, 0) for i in range(s.eval_episodes)]
        return await evaluate_each(self, items, self._eval_play, self._eval_report, params)

    async def _eval_play(self, item: Item) -> Played:
        path = await self.game_file(item)
        return await self.play_one(path, "eval", temperature=self.config.eval_temperature)

    def _eval_report(self, played: list[tuple[Item, Played]]) -> Report:
        n, prefix = len(played), f"{self.name}_eval"
        metrics = {
            f"{prefix}/avg_score": sum(p.game.score for _, p in played) / n,
            f"{prefix}/win_rate": sum(p.game.won for _, p in played) / n,
            f"{prefix}/avg_turns": sum(p.episode.turns for _, p in played) / n,
        }
        samples = [
            {**item, "messages": p.episode.node.messages, "score": p.game.score}
            for item, p in played
        ]
        return metrics, samples
