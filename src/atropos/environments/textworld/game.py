"""One episode of a z-machine text game: the observations, the policy's commands, the score.

Two backends play a `.z5`/`.z8` file, both through jericho's frotz:

- `TextWorldBackend`, for a game TextWorld generated (its `.json` beside it): `textworld.start`
  tracks the score, the win and the loss from the game's own logic, and can list the commands
  that make sense in the current state (`admissible`);
- `JerichoBackend`, for any other z-machine game: `jericho.FrotzEnv`, which reads the score,
  the win and the loss only for the games it knows (its supported list, identified by the
  file's hash); any other game is refused with `UnsupportedGame`.

A reply's command is its last non-empty line after its last `</think>` (`parse_command`). The
game answers every command the way it answers a player: an unknown verb or object gets its
parser's reply ("That's not a verb I recognise.") and costs a turn, nothing else. Interpreter
commands that would leave the game (`quit`, `restart`, `restore`, `save`, `undo`, ...) are not
sent; the turn gets `BLOCKED` instead.

>>> parse_command("<think>the key opens the chest</think>\\nunlock chest with key")
'unlock chest with key'
>>> parse_command("I will look around.\\n> look"), parse_command("<think>hmm")
('look', '')
>>> clean_text("\\nYou take the key.\\n\\n>      -= Attic =-0/2")
'You take the key.'
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from atropos.environments.textworld.generate import (
    require_jericho,
    require_textworld,
    walkthrough,
)

__all__ = [
    "BLOCKED",
    "MAX_COMMAND_BYTES",
    "Backend",
    "JerichoBackend",
    "TextGame",
    "TextWorldBackend",
    "UnsupportedGame",
    "clean_text",
    "is_story_file",
    "open_backend",
    "parse_command",
]

MAX_COMMAND_BYTES = 190  # frotz reads at most 198 bytes of input and warns when it cuts
BLOCKED = "[That command is not available here: it would leave the game.]"
META_COMMANDS = frozenset(
    {"quit", "q", "restart", "restore", "save", "undo", "script", "unscript", "noscript"}
)
_BANNER_LINE = re.compile(r"^[ \t_|\\/$<>-]*[_|\\/$][ \t_|\\/$<>-]*$", re.MULTILINE)
_STATUS = re.compile(r">?[ \t]*-= [^\n]*=-[-0-9]+/[0-9]+[ \t]*\Z")  # TextWorld's status line
_PROMPT = re.compile(r"\n?>[ \t]*\Z")
_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+\n")
_STORY = re.compile(r"\.z[1-8]")  # z-machine versions 1 to 8


class UnsupportedGame(ValueError):
    """jericho cannot read this game's score (it is not on jericho's supported list)."""


def clean_text(raw: str) -> str:
    """A game's output as an observation: TextWorld's ASCII-art banner lines, its status line
    (`-= Room =-score/moves`) and the `>` prompt removed, runs of blank lines made one."""
    text = _STATUS.sub("", raw.rstrip())
    text = _PROMPT.sub("", text.rstrip())
    text = _BANNER_LINE.sub("", text)
    return _BLANKS.sub("\n\n", text).strip()


def parse_command(reply: str) -> str:
    """The command in a reply: its last non-empty line after the last `</think>` (an unclosed
    `<think>` has none: ""), a leading `>` and surrounding quotes or backticks removed, cut to
    `MAX_COMMAND_BYTES` bytes of UTF-8."""
    if "</think>" in reply:
        reply = reply.rsplit("</think>", 1)[1]
    elif "<think>" in reply:
        return ""
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    command = lines[-1].lstrip(">").strip().strip("`'\"").strip() if lines else ""
    return command.encode()[:MAX_COMMAND_BYTES].decode(errors="ignore").strip()


class Backend(Protocol):
    """A running game (see the module docstring)."""

    max_score: int
    walkthrough: list[str] | None

    def start(self) -> str: ...  # the game's opening text

    def step(self, command: str) -> str: ...  # the game's reply to one command

    def score(self) -> int: ...

    def won(self) -> bool: ...

    def lost(self) -> bool: ...

    def admissible(self) -> list[str] | None: ...  # None: this backend cannot list them

    def close(self) -> None: ...


@contextlib.contextmanager
def _quiet_jericho() -> Iterator[None]:
    """Silence jericho's unsupported-game warning inside the block (textworld silences it only
    at import, which a `-W error` run overrides; every game TextWorld makes is "unsupported")."""
    jericho = require_jericho()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
        yield


_LOADING = threading.Lock()
"""TextWorld loads a game by parsing its logic with TatSu, whose parser state is shared: two
threads loading at once corrupt it (`IndexError: pop from empty list`, 8 of 8 games failed with
8 threads). Loads (`textworld.start` and the first `reset`) take turns; steps do not."""


class TextWorldBackend:
    """A TextWorld-generated game through `textworld.start` (score tracked from its `.json`)."""

    def __init__(self, path: Path, list_commands: bool = False) -> None:
        textworld = require_textworld()
        infos = textworld.EnvInfos(
            score=True, max_score=True, won=True, lost=True, admissible_commands=list_commands
        )
        with _LOADING, _quiet_jericho():
            self.env = textworld.start(str(path), request_infos=infos)
        self.walkthrough = walkthrough(path)
        self.max_score = 0
        self.state: Any = None

    def start(self) -> str:
        with _LOADING:
            self.state = self.env.reset()
        self.max_score = int(self.state["max_score"])
        return str(self.state.feedback)

    def step(self, command: str) -> str:
        self.state, _, _ = self.env.step(command)
        return str(self.state.feedback)

    def score(self) -> int:
        return int(self.state["score"])

    def won(self) -> bool:
        return bool(self.state["won"])

    def lost(self) -> bool:
        return bool(self.state["lost"])

    def admissible(self) -> list[str] | None:
        commands = self.state.get("admissible_commands")
        return list(commands) if commands is not None else None

    def close(self) -> None:
        self.env.close()


class JerichoBackend:
    """Any z-machine game jericho supports, through `jericho.FrotzEnv` (its walkthrough seed)."""

    def __init__(self, path: Path) -> None:
        jericho = require_jericho()
        with _quiet_jericho():
            self.env = jericho.FrotzEnv(str(path))
        if not self.env.is_fully_supported:
            self.env.close()
            raise UnsupportedGame(
                f"{path}: jericho does not know this game, so it cannot read its score; play"
                " one of jericho's supported games (the files of its game suite, matched by"
                " hash), or a TextWorld game with its .json beside it"
            )
        self.max_score = int(self.env.get_max_score())
        self.walkthrough: list[str] | None = list(self.env.get_walkthrough()) or None

    def start(self) -> str:
        text, _ = self.env.reset()
        return str(text)

    def step(self, command: str) -> str:
        text, _, _, _ = self.env.step(command)
        return str(text)

    def score(self) -> int:
        return int(self.env.get_score())

    def won(self) -> bool:
        return bool(self.env.victory())

    def lost(self) -> bool:
        return bool(self.env.game_over())

    def admissible(self) -> list[str] | None:
        return None

    def close(self) -> None:
        self.env.close()


def is_story_file(path: Path) -> bool:
    """Whether `path` is named as a z-machine game (`.z1` to `.z8`)."""
    return bool(_STORY.fullmatch(Path(path).suffix))


def open_backend(path: Path, list_commands: bool = False) -> Backend:
    """The backend for a game file: TextWorld's when its `.json` is beside it, else jericho's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no game file at {path}")
    if path.with_suffix(".json").is_file():
        return TextWorldBackend(path, list_commands)
    if not is_story_file(path):
        raise ValueError(f"{path}: expected a z-machine game (.z1 to .z8)")
    return JerichoBackend(path)


class TextGame:
    """An episode for `episodes.play`: `observation()` is the game's latest text, `act(reply)`
    plays the reply's command. `rewards` holds each turn's score change over the maximum."""

    def __init__(self, backend: Backend, list_commands: bool = False) -> None:
        self.backend = backend
        self.list_commands = list_commands
        self.text = clean_text(backend.start())
        if backend.max_score <= 0:
            backend.close()
            raise ValueError("the game reports no points to score (max score 0)")
        self.max_score = backend.max_score
        self.points = backend.score()
        self.commands: list[str] = []
        self.rewards: list[float] = []
        self.won = self.lost = self.done = False

    @property
    def score(self) -> float:
        """The points scored so far over the game's maximum (1.0: every point)."""
        return self.points / self.max_score

    def observation(self) -> str:
        commands = self.backend.admissible() if self.list_commands else None
        if not commands:
            return self.text
        return f"{self.text}\n\nCommands that make sense here: {', '.join(commands)}"

    def act(self, reply: str) -> None:
        command = parse_command(reply)
        self.commands.append(command)
        words = command.lower().split()
        if words and words[0] in META_COMMANDS:
            self.text = BLOCKED
            self.rewards.append(0.0)
            return
        self.text = clean_text(self.backend.step(command))
        before, self.points = self.points, self.backend.score()
        self.rewards.append((self.points - before) / self.max_score)
        self.won, self.lost = self.backend.won(), self.backend.lost()
        self.done = self.won or self.lost

    def close(self) -> None:
        self.backend.close()
