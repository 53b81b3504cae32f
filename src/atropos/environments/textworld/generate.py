"""TextWorld games made offline from a seed, once, and kept in a cache directory.

A game is fixed by its `GameSpec` (rooms, objects, quest length, number of quests) and its seed:
`textworld.generator.make_game` with that seed, compiled by the Inform 7 tools the `textworld`
wheel bundles, gives the same `.z8` byte for byte every time. Generation takes 1 to 4 seconds,
so each game is made once and kept as `<cache>/<spec key>/<seed>.z8` with its `.json` (the
game's logic and walkthrough, which TextWorld reads to track the score) beside it. A game is
written to a temporary folder and moved into place, the `.z8` last: several processes may share
a cache, and a `.z8` in the cache is always complete.

>>> PRESETS["easy"].key
'rooms2-objects4-length2-quests1'
>>> GameSpec.of("medium", quest_length=6)
GameSpec(rooms=5, objects=10, quest_length=6, quests=2)
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from atropos.install import install_hint

__all__ = [
    "PRESETS",
    "GameSpec",
    "cached_game",
    "default_cache_dir",
    "ensure_game",
    "make_game_file",
    "require_jericho",
    "require_textworld",
    "walkthrough",
]

EXTRA = "textworld"  # the extra of atropos-rl that installs textworld and jericho


def _require(module: str, needed_by: str) -> ModuleType:
    """`import module` (absolute), or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{needed_by} needs {module}: {install_hint(EXTRA)}") from err


def require_textworld() -> ModuleType:
    """The TextWorld library (PyPI's `textworld`, which imports its generator; never this
    package, `atropos.environments.textworld`)."""
    return _require("textworld", "the textworld environment")


def require_jericho() -> ModuleType:
    """The `jericho` module: z-machine games through frotz."""
    return _require("jericho", "playing .z5/.z8 games")


@dataclass(frozen=True)
class GameSpec:
    """What a generated game is made of (TextWorld's `GameOptions`)."""

    rooms: int  # world size: rooms in the map
    objects: int  # objects placed in the world (beyond the rooms)
    quest_length: int  # actions in each quest's shortest solution
    quests: int  # quests in parallel; each completed one scores a point

    @property
    def key(self) -> str:
        """The cache folder of games of this spec."""
        return (
            f"rooms{self.rooms}-objects{self.objects}-length{self.quest_length}-quests{self.quests}"
        )

    @classmethod
    def of(cls, difficulty: str, **overrides: int | None) -> GameSpec:
        """The preset `difficulty` with the overrides that are not None."""
        if difficulty not in PRESETS:
            raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(PRESETS)}")
        return replace(PRESETS[difficulty], **{k: v for k, v in overrides.items() if v is not None})


PRESETS = {
    "easy": GameSpec(rooms=2, objects=4, quest_length=2, quests=1),
    "medium": GameSpec(rooms=5, objects=10, quest_length=4, quests=2),
    "hard": GameSpec(rooms=10, objects=20, quest_length=6, quests=3),
}


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/atropos/textworld` (`~/.cache/atropos/textworld` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "atropos" / "textworld"


def cached_game(cache_dir: Path, spec: GameSpec, seed: int) -> Path:
    """Where the game of `spec` and `seed` lives in `cache_dir` (made or not). The textworld
    version is part of the folder: another version may make other games from the same seed."""
    from importlib.metadata import version

    return cache_dir / f"textworld-{version('textworld')}" / spec.key / f"{seed}.z8"


# TextWorld's generator keeps module-level state (its knowledge base, the grammar cache):
# one game at a time per process.
_GENERATING = threading.Lock()


def make_game_file(spec: GameSpec, seed: int, path: Path) -> Path:
    """Generate and compile the game of `spec` and `seed` to `path` (a `.z8`, its `.json`
    beside it), through a temporary folder in the same directory."""
    textworld = require_textworld()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _GENERATING, tempfile.TemporaryDirectory(dir=path.parent, prefix=".making-") as tmp:
        options = textworld.GameOptions()
        options.seeds = seed
        options.nb_rooms = spec.rooms
        options.nb_objects = spec.objects
        options.quest_length = spec.quest_length
        options.nb_parallel_quests = spec.quests
        options.path = str(Path(tmp) / path.name)
        options.force_recompile = True
        try:
            game = textworld.generator.make_game(options)
            made = Path(textworld.generator.compile_game(game, options))
        except Exception as err:  # the generator's and Inform 7's errors, named
            raise RuntimeError(
                f"textworld could not make the game {spec.key}, seed {seed}: {err!r}"
            ) from err
        os.replace(made.with_suffix(".json"), path.with_suffix(".json"))
        os.replace(made, path)  # last: a .z8 in the cache is complete
    return path


_PENDING: dict[Path, asyncio.Future[Path]] = {}  # generations under way, by game file


def _forget(path: Path, done: asyncio.Future[Path]) -> None:
    if _PENDING.get(path) is done:
        del _PENDING[path]


async def ensure_game(cache_dir: Path, spec: GameSpec, seed: int) -> Path:
    """The cached game of `spec` and `seed`, generated first (in a worker thread) when it is
    not there; concurrent calls for the same game wait for one generation."""
    path = cached_game(cache_dir, spec, seed)
    if path.exists() and path.with_suffix(".json").exists():
        return path
    pending = _PENDING.get(path)
    if pending is None or pending.get_loop() is not asyncio.get_running_loop():
        pending = asyncio.ensure_future(asyncio.to_thread(make_game_file, spec, seed, path))
        _PENDING[path] = pending
        pending.add_done_callback(lambda done: _forget(path, done))
    return await asyncio.shield(pending)


def walkthrough(game_file: Path) -> list[str] | None:
    """The commands that win a generated game (its `.json`'s metadata), None without one."""
    info = Path(game_file).with_suffix(".json")
    if not info.exists():
        return None
    data: dict[str, Any] = json.loads(info.read_text())
    commands = data.get("metadata", {}).get("walkthrough")
    return list(commands) if commands else None
