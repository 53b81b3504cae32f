"""`textworld`: text adventure games as token-exact multi-turn episodes.

Games are generated offline by Microsoft's TextWorld from a seed and a difficulty preset (rooms,
objects, quest length, quests; `generate.py`), once, into a cache directory; or they are the
user's own z-machine files (`--env.game_files`), played through jericho (`game.py`). Each
observation is a user turn and each command an assistant turn, through the games' shared loop
(`atropos.environments.games.episodes.play`); the score is the game's points over its maximum,
and `--env.advantages turn` turns each turn's score change into per-token advantages
(`credit.py`). Details: docs/textworld.md.

This package is `atropos.environments.textworld`; the library it drives is PyPI's `textworld`
(the `textworld` extra), always imported absolutely and only when an env is set up or a game is
made, never on import.
"""

from __future__ import annotations

from atropos.environments.textworld.env import RULES, Played, TextWorld, TextWorldConfig
from atropos.environments.textworld.game import TextGame, clean_text, parse_command
from atropos.environments.textworld.generate import PRESETS, GameSpec

__all__ = [
    "PRESETS",
    "RULES",
    "GameSpec",
    "Played",
    "TextGame",
    "TextWorld",
    "TextWorldConfig",
    "clean_text",
    "parse_command",
]
