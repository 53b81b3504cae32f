"""`textworld`'s parts that need no TextWorld install: commands read from replies, game text
cleaned, the game loop over a scripted backend, per-turn credit, the config, jericho's loader
over a stand-in `jericho` module, and the lazy imports."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.textworld import TextWorldConfig
from atropos.environments.textworld.credit import returns_to_go, turn_advantages, turn_rows
from atropos.environments.textworld.env import TextWorld, game_files
from atropos.environments.textworld.game import (
    BLOCKED,
    MAX_COMMAND_BYTES,
    JerichoBackend,
    TextGame,
    UnsupportedGame,
    clean_text,
    open_backend,
    parse_command,
)
from atropos.environments.textworld.generate import PRESETS, GameSpec
from atropos.envs.registry import missing_extras
from atropos.inference.sequence import MASKED, SequenceNode
from atropos.install import install_hint

from .helpers import make_env, modules_loaded_by


@pytest.mark.parametrize(
    ("reply", "command"),
    [
        ("go north", "go north"),
        ("  take key  \n", "take key"),
        ("I should look around first.\n\nlook", "look"),
        ("<think>the chest is locked</think>\nunlock chest with key", "unlock chest with key"),
        ("<think>a</think>x<think>b</think>\n> open door", "open door"),
        ("`inventory`", "inventory"),
        ('"examine desk"', "examine desk"),
        ("<think>still thinking", ""),
        ("", ""),
        ("\n \n", ""),
    ],
)
def test_parse_command(reply, command):
    assert parse_command(reply) == command


def test_a_long_command_is_cut_to_what_frotz_reads_without_warning():
    command = parse_command("take " + "é" * 200)
    assert len(command.encode()) <= MAX_COMMAND_BYTES and command.startswith("take é")


BANNER = (
    "\n\n\n                    ________  ________  __    __  ________        \n"
    "                   |        \\|        \\|  \\  |  \\|        \\       \n"
    "                    \\$$$$$$$$| $$$$$$$$| $$  | $$ \\$$$$$$$$       \n\n"
    "Welcome! Find the key.\n\n-= Attic =-\nAn attic.\n\n\n\n"
    "You can go west.\n\n>          "
)


def test_clean_text_drops_the_banner_the_status_line_and_the_prompt():
    assert (
        clean_text(BANNER) == "Welcome! Find the key.\n\n-= Attic =-\nAn attic.\n\nYou can go west."
    )
    status = "\nThat's not a verb I recognise.\n\n>" + " " * 80 + "-= Attic =-0/1"
    assert clean_text(status) == "That's not a verb I recognise."
    asked = "\nAre you sure you want to quit?" + " " * 40 + "-= Attic =-0/5"
    assert clean_text(asked) == "Are you sure you want to quit?"
    assert clean_text("\nYou can't go that way.\n\n>") == "You can't go that way."


class ScriptedBackend:
    """A two-point game: 'take key' scores a point, 'open chest' (with the key) wins."""

    walkthrough = ["take key", "open chest"]

    def __init__(self, max_score: int = 2) -> None:
        self.max_score = max_score
        self.points, self.has_key, self.sent, self.closed = 0, False, [], False

    def start(self) -> str:
        return "Get the key and open the chest.\n\n>"

    def step(self, command: str) -> str:
        self.sent.append(command)
        if command == "take key" and not self.has_key:
            self.has_key, self.points = True, self.points + 1
            return "\nTaken.\n\n>"
        if command == "open chest" and self.has_key:
            self.points += 1
            return "\nYou open the chest.\n\n    *** The End ***\n>"
        return "\nThat's not a verb I recognise.\n\n>"

    def score(self) -> int:
        return self.points

    def won(self) -> bool:
        return self.points == 2

    def lost(self) -> bool:
        return False

    def admissible(self) -> list[str] | None:
        return ["open chest", "take key"]

    def close(self) -> None:
        self.closed = True


def test_the_walkthrough_scores_every_point_with_a_reward_per_turn():
    game = TextGame(ScriptedBackend())
    assert game.observation() == "Get the key and open the chest." and not game.done
    game.act("<think>first the key</think>\ntake key")
    assert (game.text, game.score, game.rewards, game.done) == ("Taken.", 0.5, [0.5], False)
    game.act("open chest")
    assert game.done and game.won and game.score == 1.0 and game.rewards == [0.5, 0.5]


def test_unknown_and_interpreter_commands_cost_a_turn_and_score_nothing():
    backend = ScriptedBackend()
    game = TextGame(backend)
    game.act("dance")
    assert game.text == "That's not a verb I recognise." and game.rewards == [0.0]
    for meta in ("quit", "RESTART", "save game", "undo", "restore"):
        game.act(meta)
        assert game.text == BLOCKED
    assert backend.sent == ["dance"]  # interpreter commands never reach the game
    assert game.commands == ["dance", "quit", "RESTART", "save game", "undo", "restore"]
    assert game.rewards == [0.0] * 6 and game.score == 0.0 and not game.done


def test_listed_commands_follow_the_observation_when_asked():
    assert TextGame(ScriptedBackend()).observation().endswith("chest.")
    listed = TextGame(ScriptedBackend(), list_commands=True).observation()
    assert listed.endswith("Commands that make sense here: open chest, take key")


def test_a_game_without_points_is_refused_and_closed():
    backend = ScriptedBackend(max_score=0)
    with pytest.raises(ValueError, match="no points to score"):
        TextGame(backend)
    assert backend.closed


# ----- per-turn credit ----------------------------------------------------------------------


def test_returns_and_turn_baselines_on_hand_made_episodes():
    assert returns_to_go([0.0, 0.5, 0.5], discount=1.0) == [1.0, 1.0, 0.5]
    assert returns_to_go([1.0, 0.0, 1.0], discount=0.5) == [1.25, 0.5, 1.0]
    assert returns_to_go([], discount=1.0) == []
    # at turn 2 only the longer episodes are the baseline; a lone turn gets 0
    advantages = turn_advantages([[1.0, 1.0, 0.5], [0.0, 0.0], [1.0, 0.5, 0.5, 0.0]])
    expected = [[1 / 3, 0.5, 0.0], [-2 / 3, -0.5], [1 / 3, 0.0, 0.0, 0.0]]
    assert [pytest.approx(row) for row in expected] == advantages


def node(tokens: list[int], masks: list[int]) -> SequenceNode:
    return SequenceNode(tokens, masks, [0.0 if m != MASKED else 1.0 for m in masks])


def episode_nodes(prompt: int, replies: list[int], observation: int = 2) -> list[SequenceNode]:
    """The node after each turn of an episode whose turns reply `replies[k]` tokens, the first
    prompt `prompt` tokens and each later observation `observation` tokens."""
    tokens: list[int] = []
    masks: list[int] = []
    nodes = []
    for k, length in enumerate(replies):
        tokens += [1] * (prompt if k == 0 else observation)
        masks += [MASKED] * (prompt if k == 0 else observation)
        reply = list(range(10 + k * 10, 10 + k * 10 + length))
        tokens, masks = tokens + reply, masks + reply
        nodes.append(node(list(tokens), list(masks)))
    return nodes


def test_turn_rows_put_each_turns_advantage_on_its_reply_tokens():
    first, second = episode_nodes(3, [2, 1]), episode_nodes(3, [2])
    turns = [
        [(3, first[0]), (7, first[1])],
        [(3, second[0])],
    ]
    rows = turn_rows([first[-1], second[-1]], turns, [[0.0, 1.0], [0.0]], discount=1.0)
    assert rows == [
        [0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, -0.5, -0.5],
    ]


def test_turn_rows_give_up_when_the_final_sequence_does_not_extend_a_turn():
    nodes = episode_nodes(3, [2, 1])
    forked = node([9] * len(nodes[-1].tokens), nodes[-1].masked_tokens)
    turns = [[(3, nodes[0]), (7, nodes[1])]]
    assert turn_rows([forked], turns, [[0.0, 1.0]], discount=1.0) is None


# ----- config, presets, files ---------------------------------------------------------------


def test_presets_grow_and_overrides_apply():
    easy, medium, hard = (PRESETS[k] for k in ("easy", "medium", "hard"))
    assert easy.rooms < medium.rooms < hard.rooms and easy.quests < hard.quests
    config = TextWorldConfig(difficulty="hard", world_size=3, nb_quests=1)
    assert config.spec() == GameSpec(rooms=3, objects=20, quest_length=6, quests=1)
    with pytest.raises(ValueError, match="unknown difficulty 'harder'"):
        GameSpec.of("harder")


def test_game_files_take_a_comma_separated_list_and_folders(tmp_path):
    config = TextWorldConfig(game_files=f"{tmp_path / 'a.z5'}, {tmp_path / 'games'}")
    (tmp_path / "games").mkdir()
    for name in ("b.z8", "a.z5", "notes.txt"):
        (tmp_path / "games" / name).write_bytes(b"")
    (tmp_path / "a.z5").write_bytes(b"")
    found = game_files(config.game_files)
    assert [p.name for p in found] == ["a.z5", "a.z5", "b.z8"]
    assert game_files([str(tmp_path / "games")]) == found[1:]
    with pytest.raises(FileNotFoundError, match="no file or folder"):
        game_files([str(tmp_path / "missing.z5")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .z1 to .z8 games"):
        game_files([str(tmp_path / "empty")])


def test_open_backend_names_what_is_wrong_with_a_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no game file"):
        open_backend(tmp_path / "none.z8")
    (tmp_path / "story.gblorb").write_bytes(b"")
    with pytest.raises(ValueError, match="expected a z-machine game"):
        open_backend(tmp_path / "story.gblorb")


def test_items_are_seeds_from_a_pool_or_the_files_in_turn_and_survive_a_restart():
    env = make_env(TextWorld, num_games=3, first_seed=10)

    def items(n: int) -> list[Any]:
        return [asyncio.run(env.get_next_item()) for _ in range(n)]

    assert items(4) == [{"seed": 10}, {"seed": 11}, {"seed": 12}, {"seed": 10}]
    state = env.checkpoint_state()
    env = make_env(TextWorld, num_games=3, first_seed=10)
    env.restore_state(state)
    assert items(1) == [{"seed": 11}]
    assert [env.item(i, 5, 0) for i in (0, 7)] == [{"seed": 5}, {"seed": 12}]
    env.files = [Path("a.z5"), Path("b.z8")]
    assert [env.item(i, 5, 0)["game"] for i in range(3)] == ["a.z5", "b.z8", "a.z5"]


# ----- jericho's loader, over a stand-in module ---------------------------------------------


def fake_jericho(monkeypatch: pytest.MonkeyPatch, supported: bool) -> list[Any]:
    """A stand-in `jericho` whose FrotzEnv plays a one-room game worth 10 points."""
    made: list[Any] = []

    class FrotzEnv:
        def __init__(self, path: str, seed: int | None = None) -> None:
            self.is_fully_supported, self.points, self.closed = supported, 0, False
            made.append(self)

        def get_max_score(self) -> int:
            return 10

        def get_walkthrough(self) -> list[str]:
            return ["push button"]

        def reset(self) -> tuple[str, dict[str, int]]:
            return "A room with a button.\n\n>", {"moves": 0, "score": 0}

        def step(self, command: str) -> tuple[str, int, bool, dict[str, int]]:
            if command == "push button":
                self.points = 10
                return "\nClick. You have won.\n\n>", 10, True, {}
            return "\nNothing happens.\n\n>", 0, False, {}

        def get_score(self) -> int:
            return self.points

        def victory(self) -> bool:
            return self.points == 10

        def game_over(self) -> bool:
            return False

        def close(self) -> None:
            self.closed = True

    module = types.ModuleType("jericho")
    module.FrotzEnv = FrotzEnv  # type: ignore[attr-defined]
    module.UnsupportedGameWarning = type("UnsupportedGameWarning", (UserWarning,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jericho", module)
    return made


def test_a_supported_z_machine_game_is_played_through_jericho(monkeypatch, tmp_path):
    fake_jericho(monkeypatch, supported=True)
    story = tmp_path / "button.z5"
    story.write_bytes(b"")
    backend = open_backend(story)
    assert isinstance(backend, JerichoBackend) and backend.walkthrough == ["push button"]
    game = TextGame(backend)
    assert game.observation() == "A room with a button." and backend.admissible() is None
    game.act("wait")
    assert game.text == "Nothing happens." and not game.done
    game.act("push button")
    assert game.done and game.won and game.score == 1.0 and game.rewards == [0.0, 1.0]


def test_a_game_jericho_does_not_support_is_refused_by_name(monkeypatch, tmp_path):
    made = fake_jericho(monkeypatch, supported=False)
    story = tmp_path / "homebrew.z8"
    story.write_bytes(b"")
    with pytest.raises(UnsupportedGame, match="homebrew.z8: jericho does not know this game"):
        open_backend(story)
    assert made[0].closed


# ----- imports ------------------------------------------------------------------------------


def test_importing_the_env_loads_neither_textworld_nor_jericho():
    heavy = ["textworld", "jericho", "spacy", "numpy", "networkx"]
    assert modules_loaded_by("atropos.environments.textworld", heavy) == []


def test_a_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)
    message = missing_extras(TextWorld, "textworld")
    assert message == f"textworld needs textworld: {install_hint('textworld')}"


def test_the_package_does_not_shadow_the_library():
    pytest.importorskip("textworld")
    from atropos.environments.textworld.generate import require_textworld

    library = require_textworld()
    assert hasattr(library, "GameMaker") and "site-packages" in str(Path(library.__file__))
