"""`textworld` on real TextWorld games: generated with a fixed seed (once per session, into a
temporary cache), played by the walkthrough and by bad players, token-exact groups with
per-turn advantages, check_env, `atropos env process` against the fake server and the CPU
server, evaluation, and jericho refusing a game it does not know."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textworld")

from atropos.cli.main import main as atropos_main  # noqa: E402
from atropos.environments.textworld import RULES, TextGame, TextWorld  # noqa: E402
from atropos.environments.textworld.demo import demo_responder, next_command  # noqa: E402
from atropos.environments.textworld.game import UnsupportedGame, open_backend  # noqa: E402
from atropos.environments.textworld.generate import (  # noqa: E402
    GameSpec,
    cached_game,
    default_cache_dir,
    ensure_game,
    make_game_file,
    walkthrough,
)
from atropos.testing import FakeInferenceServer  # noqa: E402

from .games.helpers import assistant_turns, collect, trained_spans  # noqa: E402
from .helpers import OFFLINE, check_against, evaluate_against, make_env, read_jsonl  # noqa: E402

SPEC = GameSpec.of("easy", quests=2)  # two rooms, two 2-step quests: a point each
SETTINGS = {"difficulty": "easy", "nb_quests": 2, "num_games": 1, "first_seed": 0}
TARGET = "atropos.environments.textworld:TextWorld"


@pytest.fixture(scope="session")
def xdg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An `XDG_CACHE_HOME` whose default game cache holds the game of seed 0, generated once
    for the session."""
    root = tmp_path_factory.mktemp("xdg")
    asyncio.run(ensure_game(root / "atropos" / "textworld", SPEC, 0))
    return root


@pytest.fixture(autouse=True)
def cache(xdg: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default cache, pointed at the session's (the demo responder reads it too)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    return default_cache_dir()


@pytest.fixture(scope="session")
def game_file(xdg: Path) -> Path:
    return cached_game(xdg / "atropos" / "textworld", SPEC, 0)


@pytest.fixture(scope="session")
def solution(game_file: Path) -> list[str]:
    commands = walkthrough(game_file)
    assert commands is not None and len(commands) == 4
    return commands


def make(url: str, mode: str = "process", **env: Any) -> Any:
    settings = {**SETTINGS, "max_turns": 6, "eval_seed": 0, **env}
    return make_env(TextWorld, url, mode, validate=True, **settings)


_REPLIES = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)


def walker(prompt: str) -> str:
    """Plays the walkthrough of the prompt's game, thinking first, in every episode."""
    solution = walkthrough(next(default_cache_dir().glob("*/*/0.z8")))
    assert solution is not None
    return f"<think>on with the quest</think>\n{next_command(_REPLIES.findall(prompt), solution)}"


# ----- generation and the game itself -------------------------------------------------------


def test_a_seed_makes_the_same_game_and_the_cache_is_reused(cache, game_file, tmp_path):
    assert game_file.exists() and game_file.with_suffix(".json").exists()
    again = make_game_file(SPEC, 0, tmp_path / "again.z8")
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (game_file, again)]
    assert digest[0] == digest[1]
    before = game_file.stat().st_mtime_ns
    assert asyncio.run(ensure_game(cache, SPEC, 0)) == game_file
    assert game_file.stat().st_mtime_ns == before  # found, not made again
    assert not [p for p in game_file.parent.iterdir() if p.name.startswith(".making-")]


def test_a_failed_generation_names_the_game_and_leaves_nothing(monkeypatch, tmp_path):
    import textworld.generator

    def fail(options: Any) -> Any:
        raise ValueError("no quest fits")

    monkeypatch.setattr(textworld.generator, "make_game", fail)
    with pytest.raises(RuntimeError, match="make the game rooms2-objects4-length2-quests2, seed 7"):
        make_game_file(SPEC, 7, tmp_path / "games" / "7.z8")
    assert list((tmp_path / "games").iterdir()) == []


def test_the_walkthrough_wins_with_a_reward_at_each_quest(game_file, solution):
    game = TextGame(open_backend(game_file))
    try:
        opening = game.observation()
        assert "$$" not in opening and "-= " in opening and not opening.endswith(">")
        for command in solution:
            game.act(command)
        assert game.done and game.won and game.score == 1.0
        assert sorted(game.rewards) == [0.0, 0.0, 0.5, 0.5] and sum(game.rewards) == 1.0
    finally:
        game.close()


def test_invalid_commands_get_the_games_own_answers_and_score_nothing(game_file):
    game = TextGame(open_backend(game_file, list_commands=True), list_commands=True)
    try:
        assert "Commands that make sense here: " in game.observation()
        answers = {}
        for command in ("dance", "take the moon", "go up", "", "quit"):
            game.act(command)
            answers[command] = game.text
        assert answers["dance"] == "That's not a verb I recognise."
        assert answers["take the moon"] == "You can't see any such thing."
        assert answers["go up"] == "You can't go that way."
        assert answers[""] == "I beg your pardon?"
        assert answers["quit"].startswith("[That command is not available")
        assert game.score == 0.0 and not game.done and game.rewards == [0.0] * 5
    finally:
        game.close()


def test_jericho_refuses_a_game_it_cannot_score(game_file, tmp_path):
    alone = tmp_path / "homebrew.z8"
    shutil.copy(game_file, alone)  # without its .json: a plain z-machine file
    with pytest.raises(UnsupportedGame, match="jericho does not know this game"):
        open_backend(alone)


# ----- groups -------------------------------------------------------------------------------


@pytest.mark.parametrize(("player", "score"), [("walker", 1.0), ("bad", 0.0)])
def test_groups_score_the_game_and_are_token_exact(player, score):
    responder = walker if player == "walker" else (lambda prompt: "dance")
    with FakeInferenceServer(responder=responder) as fake:
        env = make(fake.base_url)
        [group] = collect(env)
        tok = fake.tokenizer
    assert group["scores"] == [score] * 4 and group["token_source"] == "server"
    assert "advantages" not in group
    # the bad player is cut by max_turns (6): truncated/turns, scored as it stands
    cut = [{"outcome": "truncated/turns"}] * 4
    assert group.get("overrides") == (None if player == "walker" else cut)
    for tokens, masks, logprobs, messages in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
    ):
        assert messages[0] == {"role": "system", "content": RULES}
        assert [m["role"] for m in messages[1:3]] == ["user", "assistant"]
        assert "$$" not in messages[1]["content"]  # the banner is not an observation
        spans = [tok.decode(s, skip_special_tokens=True) for s in trained_spans(tokens, masks)]
        assert spans == assistant_turns(messages)
        assert len(spans) == (4 if player == "walker" else 6)
        assert len(logprobs) == len(tokens)
        assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == -100)
        assert all(lp < 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)


def runs(masks: list[int]) -> list[list[int]]:
    """The positions of each maximal run of trained tokens."""
    out: list[list[int]] = []
    for i, m in enumerate(masks):
        if m != -100:
            if out and out[-1][-1] == i - 1:
                out[-1].append(i)
            else:
                out.append([i])
    return out


def test_turn_advantages_credit_each_turns_score_change():
    with FakeInferenceServer(responder=demo_responder) as fake:
        [group] = collect(make(fake.base_url, advantages="turn"))
    assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
    for score, masks, row in zip(group["scores"], group["masks"], group["advantages"], strict=True):
        assert len(row) == len(masks)
        assert all(a == 0.0 for a, m in zip(row, masks, strict=True) if m == -100)
        per_turn = [{row[i] for i in run} for run in runs(masks)]
        # returns: winners 1, 1, 0.5, 0.5 (a point at turns 2 and 4); losers 0 for 6 turns
        expected = [0.5, 0.5, 0.25, 0.25] if score == 1.0 else [-0.5, -0.5, -0.25, -0.25, 0, 0]
        assert per_turn == [{a} for a in expected]


def test_check_env_passes():
    report = check_against(make, demo_responder, items=2)
    assert report.groups == 2 and report.token_sources == {"server"}


def process_argv(url: str, out: Path, *more: str, turns: int = 6, steps: int = 2) -> list[str]:
    argv = ["env", "process", TARGET, "--openai.base_url", url]
    argv += ["--env.nb_quests", "2", "--env.num_games", "1", "--env.max_turns", str(turns)]
    argv += ["--env.total_steps", str(steps), "--env.group_size", "2"]
    argv += ["--env.use_wandb", "false"]
    return [*argv, "--env.data_path_to_save_groups", str(out), *more]


def test_atropos_env_process_writes_mixed_groups(tmp_path):
    out = tmp_path / "textworld.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        argv = process_argv(fake.base_url, out, "--env.advantages", "turn")
        assert atropos_main(argv) == 0
    groups = read_jsonl(out)
    assert len(groups) == 2 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    assert all(len(g["advantages"]) == 2 for g in groups)
    assert "not a verb I recognise." in out.with_suffix(".html").read_text()
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert metrics["env"]["train/score"] == 0.5 and metrics["env"]["train/won"] == 0.5


def test_your_own_game_files_are_the_items(game_file, tmp_path):
    games = tmp_path / "my games"
    games.mkdir()
    for suffix in (".z8", ".json"):  # a TextWorld game: played with its score tracked
        shutil.copy(game_file.with_suffix(suffix), games / f"quest{suffix}")
    env = make(OFFLINE, game_files=f"{games}, {game_file}")

    async def items() -> list[Any]:
        await env.setup()
        return [await env.get_next_item() for _ in range(3)]

    assert asyncio.run(items()) == [
        {"game": str(games / "quest.z8")},
        {"game": str(game_file)},
        {"game": str(games / "quest.z8")},
    ]
    out = tmp_path / "mine.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        argv = process_argv(fake.base_url, out, "--env.game_files", str(games), steps=1)
        assert atropos_main(argv) == 0
    [group] = read_jsonl(out)
    assert sorted(group["scores"]) == [0.0, 1.0]


def test_evaluate_plays_the_eval_seeds(solution, tmp_path):
    run = evaluate_against(make, walker, tmp_path, setup=True, eval_episodes=1)
    assert run.metrics == {
        "textworld_eval/avg_score": 1.0,
        "textworld_eval/win_rate": 1.0,
        "textworld_eval/avg_turns": 4.0,
    }
    [sample] = run.samples
    assert sample["seed"] == 0 and sample["score"] == 1.0
    assert assistant_turns(sample["messages"]) == [
        f"<think>on with the quest</think>\n{c}" for c in solution
    ]


def test_process_runs_against_the_cpu_server(tmp_path):
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    out = tmp_path / "textworld.jsonl"
    with local_tiny_server() as url:
        argv = process_argv(url, out, "--openai.server_type", "vllm", turns=2, steps=1)
        argv += ["--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny"]
        argv += ["--env.reply_tokens", "8"]
        assert atropos_main(argv) == 0
    [group] = read_jsonl(out)
    assert len(group["tokens"]) == 2 and group["token_source"] == "server"
    assert [len(lp) for lp in group["inference_logprobs"]] == [len(t) for t in group["tokens"]]


LOAD_AT_ONCE = """
import sys, threading
from pathlib import Path
from atropos.environments.textworld.game import TextWorldBackend

errors = []

def load():
    try:
        TextWorldBackend(Path(sys.argv[1])).start()
    except Exception as err:
        errors.append(repr(err))

threads = [threading.Thread(target=load) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
"""


def test_games_loaded_by_many_threads_at_once_all_load(game_file):
    # in a fresh process: TextWorld parses its logic once per process, and TatSu's parser
    # state is shared, so 8 threads loading at once failed 8 of 8 games without a lock
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LOAD_AT_ONCE, str(game_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout[-2000:]
