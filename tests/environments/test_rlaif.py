"""The `rlaif` environment: prompts, injection, truncation rules, judge votes, data, end to end."""

from __future__ import annotations

import asyncio
import html
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.rlaif import (
    DEFAULT_PREFERENCE,
    RLAIF,
    STEER_PREFIX,
    RLAIFConfig,
    demo_responder,
    judge_messages,
    prompt_turns,
    to_item,
    truncation_scores,
)
from atropos.envs import registry
from atropos.envs.cli import parse
from atropos.envs.config import BaseEnvConfig, ConfigError
from atropos.envs.judge import JudgeConfig
from atropos.envs.types import Message
from atropos.inference.tokenize import template_ids
from atropos.testing import FakeInferenceServer

from .helpers import check_against, collect, env_defaults, fake_hub, make_env, process_with_runner

SYSTEM: Message = {"role": "system", "content": "You are a terse dataset assistant."}
USER: Message = {"role": "user", "content": "Describe the sea at night."}
ITEM = {"messages": [SYSTEM, USER]}
FOGGY, PLAIN = "The fog rolls in, and the lamp remembers you.", "The sea is dark at night."


def replies(prompt: str) -> tuple[str, str]:
    """Response A and B of a rendered judge prompt."""
    body = prompt.rsplit("[Response A]", 1)[1]
    first, rest = body.split("[Response B]", 1)
    return first, rest.split("[Preference]", 1)[0]


def foggy_judge(prompt: str) -> str:
    """Prefers the reply that mentions fog; unparseable when neither or both do."""
    first, second = replies(prompt)
    if ("fog" in first) == ("fog" in second):
        return "I cannot tell them apart."
    return "Thinking... \\boxed{A}" if "fog" in first else "Thinking... \\boxed{B}"


def policy(judge: Callable[[str], str] = foggy_judge, long: bool = False) -> Any:
    """A responder: judge prompts go to `judge`; steered prompts get a foggy reply; plain ones
    alternate foggy and plain (so an unsteered pair differs), or long and short with `long`."""
    turn = itertools.count()
    seen: list[str] = []

    def respond(prompt: str) -> str:
        if "[Response A]" in prompt:
            return judge(prompt)
        seen.append(prompt)
        if long:
            return "word " * 200 if next(turn) % 2 else "short"
        if STEER_PREFIX.strip() in prompt:
            return FOGGY
        return PLAIN if next(turn) % 2 == 0 else FOGGY

    respond.seen = seen  # type: ignore[attr-defined]
    return respond


def make(url: str, mode: str = "process", group_size: int | None = None, **env: object) -> RLAIF:
    """The env with its defaults (groups are pairs) and `env` on top."""
    return make_env(RLAIF, url, mode, group_size=group_size, **env)


def run(env: RLAIF, items: list[dict[str, Any]]) -> list[Any]:
    """The group of each item (set up first; the env and its judge closed after)."""
    return [group for group, _ in collect(env, *items)]


# ----- data -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("roles", "kept"),
    [
        (["user"], ["user"]),  # no trailing assistant turn
        (["user", "assistant"], ["user"]),
        (["user", "assistant", "assistant"], ["user"]),  # two trailing turns: both go
        (
            ["system", "user", "assistant", "user", "assistant"],
            ["system", "user", "assistant", "user"],
        ),
        (["user", "assistant", "assistant", "assistant"], None),  # at most two are stripped
        (["assistant"], None),
        ([], None),
    ],
)
def test_trailing_assistant_turns_are_stripped(roles: list[str], kept: list[str] | None) -> None:
    conversation = [
        {"role": r, "content": f"{r} {i}", "turn_identifier": i} for i, r in enumerate(roles)
    ]
    item = to_item({"conversation": conversation}, "row")
    assert (None if item is None else [m["role"] for m in item["messages"]]) == kept
    if item is not None:
        assert all(set(m) == {"role", "content"} for m in item["messages"])
        assert item["messages"] == prompt_turns(conversation)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"conversations": []}, "expected a 'conversation' list"),
        ({"conversation": [{"role": "human", "content": "hi"}]}, "needs a role"),
        ({"conversation": [{"role": "user", "content": None}]}, "must be a string"),
    ],
)
def test_malformed_rows_are_errors_naming_the_row(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"row 7: .*{message}|{message}"):
        to_item(row, "row 7")


def test_the_fixture_has_every_shape_of_conversation() -> None:
    rows = [r["conversation"] for r in read_jsonl(data_path("rlaif", "train.jsonl"))]
    assert len(rows) >= 50
    assert sum(r[0]["role"] == "system" for r in rows) >= 3
    assert sum(r[-1]["role"] == "user" for r in rows) >= 3  # nothing to strip
    assert sum([t["role"] for t in r[-2:]] == ["assistant"] * 2 for r in rows) >= 3
    assert sum(sum(t["role"] == "user" for t in r) >= 2 for r in rows) >= 10  # multi-turn
    env = make("http://127.0.0.1:9/v1")
    items = env.load()
    assert len(items) == len(rows) and all(i["messages"][-1]["role"] == "user" for i in items)


def test_hub_rows_keep_role_and_content_and_skip_bad_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    turn = {"role": "user", "content": "hola", "language": "Spanish", "toxic": False}
    rows = [
        {
            "conversation_id": "a",
            "model": "gpt-4",
            "conversation": [turn, {"role": "assistant", "content": "¡Hola!"}],
        },
        {"conversation_id": "b", "conversation": None},  # malformed: skipped
        {
            "conversation_id": "c",
            "conversation": [{"role": "assistant", "content": "?"}],
        },  # nothing to answer
    ]
    calls = fake_hub(monkeypatch, rows)
    resolved = parse(RLAIF, "process", ["--env.dataset_name", "allenai/WildChat"])
    env = RLAIF(resolved.env, resolved.servers, manager=resolved.manager)
    assert env.load() == [{"messages": [{"role": "user", "content": "hola"}]}]
    assert calls == [("allenai/WildChat", None, "train")]


# ----- config -----------------------------------------------------------------------------------


def test_defaults_and_flags() -> None:
    config, [server] = env_defaults(RLAIF)
    assert (config.group_size, config.tokenizer_name, server.server_type) == (2, "tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert config.injection_rate == 0.05 and config.preference == DEFAULT_PREFERENCE
    assert config.judge.votes == 3 and not config.judge.base_url  # 6 votes; the policy judges
    resolved = parse(RLAIF, "process", ["--env.injection_rate", "0.5", "--judge.votes", "2"])
    assert resolved.env.injection_rate == 0.5 and resolved.env.judge.votes == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="group_size"):
        parse(RLAIF, "process", ["--env.group_size", "4"])
    with pytest.raises(ConfigError, match="injection_rate"):
        parse(RLAIF, "process", ["--env.injection_rate", "1.5"])
    with pytest.raises(ValueError, match="group_size must be 2"):
        RLAIFConfig(group_size=3)


def test_a_plain_config_takes_the_pair_default_but_a_group_size_set_to_more_is_refused() -> None:
    _, servers = RLAIF.config_init()
    env = RLAIF(BaseEnvConfig(tokenizer_name="tiny", use_wandb=False), servers)
    assert isinstance(env.config, RLAIFConfig) and env.config.group_size == 2
    assert env.config.tokenizer_name == "tiny" and env.config.preference == DEFAULT_PREFERENCE
    with pytest.raises(ValueError, match="group_size must be 2"):
        RLAIF(BaseEnvConfig(group_size=4), servers)


def test_is_registered_under_its_name() -> None:
    assert registry.get("rlaif") is RLAIF


# ----- injection --------------------------------------------------------------------------------


def test_injection_replaces_the_system_turn_and_each_sequence_keeps_its_own_prompt() -> None:
    with FakeInferenceServer(responder=policy()) as fake:
        env = make(fake.base_url, injection_rate=1.0)
        [group] = run(env, [ITEM])
    steered, plain = (m[:-1] for m in group["messages"])
    assert steered == [{"role": "system", "content": STEER_PREFIX + DEFAULT_PREFERENCE}, USER]
    assert plain == [USER]  # the dataset's system turn is gone from both
    tok = env.tokenizer
    for prompt, tokens, masks in zip(
        (steered, plain), group["tokens"], group["masks"], strict=True
    ):
        ids = template_ids(tok, prompt, add_generation_prompt=True)
        assert tokens[: len(ids)] == ids and set(masks[: len(ids)]) == {-100}
    assert [m[-1]["content"] for m in group["messages"]] == [FOGGY, PLAIN]
    assert group["scores"] == [0.5, -0.5]  # the judge preferred the steered (foggy) reply
    assert len(group["inference_logprobs"]) == 2 and group["token_source"] == "server"
    metrics = env.judge_metrics()
    assert metrics["train/rlaif/steered_pairs"] == metrics["train/rlaif/steered_preferred"] == 1


def test_without_injection_both_completions_share_the_dataset_prompt() -> None:
    with FakeInferenceServer(responder=policy()) as fake:
        env = make(fake.base_url, injection_rate=0.0)
        [group] = run(env, [ITEM])
    first, second = (m[:-1] for m in group["messages"])
    assert first == second == [SYSTEM, USER]
    ids = template_ids(env.tokenizer, [SYSTEM, USER], add_generation_prompt=True)
    assert all(tokens[: len(ids)] == ids for tokens in group["tokens"])
    by_text = {m[-1]["content"]: s for m, s in zip(group["messages"], group["scores"], strict=True)}
    assert by_text == {FOGGY: 0.5, PLAIN: -0.5}
    assert env.judge_metrics()["train/rlaif/steered_pairs"] == 0


# ----- scoring ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "scores"),
    [
        (["stop", "length"], [1.0, -1.0]),
        (["length", "stop"], [-1.0, 1.0]),
        (["stop", "stop"], None),
        (["length", "length"], None),
    ],
)
def test_truncation_scores(reasons: list[str], scores: list[float] | None) -> None:
    assert truncation_scores(reasons) == scores


def test_one_truncated_completion_decides_the_pair_without_the_judge() -> None:
    respond = policy(long=True)
    with FakeInferenceServer(responder=respond) as fake:
        env = make(fake.base_url, max_token_length=48, injection_rate=0.0)
        [group] = run(env, [{"messages": [USER]}])
        assert fake.requests["/v1/chat/completions"] == 0  # no judge call
    by_text = {m[-1]["content"]: s for m, s in zip(group["messages"], group["scores"], strict=True)}
    assert by_text["short"] == 1.0 and sorted(group["scores"]) == [-1.0, 1.0]
    assert all(
        len(t) - sum(m == -100 for m in masks) <= 16
        for t, masks in zip(group["tokens"], group["masks"], strict=True)
    )
    assert env.judge_metrics()["train/rlaif/truncation_decided"] == 1


def test_two_truncated_completions_drop_the_group() -> None:
    with FakeInferenceServer(responder=lambda prompt: "word " * 200) as fake:
        env = make(fake.base_url, max_token_length=48)
        assert run(env, [{"messages": [USER]}]) == [None]
    metrics = env.judge_metrics()
    assert (
        metrics["train/rlaif/dropped_both_truncated"] == metrics["train/rlaif/dropped_groups"] == 1
    )
    assert metrics["train/rlaif/judged_pairs"] == 0


def test_a_judge_that_always_answers_a_scores_the_pair_even() -> None:
    with FakeInferenceServer(responder=policy(judge=lambda prompt: "\\boxed{A}")) as fake:
        env = make(fake.base_url, injection_rate=1.0)
        [group] = run(env, [ITEM])
    assert group["scores"] == [0.0, 0.0]  # left for ensure_scores_are_not_same to drop
    assert env.judge_metrics()["train/rlaif/votes_parsed"] == 6


def test_unparseable_verdicts_drop_the_group_and_are_counted() -> None:
    with FakeInferenceServer(responder=policy(judge=lambda prompt: "Both are lovely.")) as fake:
        env = make(fake.base_url, injection_rate=1.0)
        assert run(env, [ITEM]) == [None]
        asyncio.run(env.wandb_log({"other": 1.0}))
    assert env.metrics["train/rlaif/votes_unparsed"] == 6 and env.metrics["other"] == 1.0
    assert (
        env.metrics["train/rlaif/judged_pairs"] == env.metrics["train/rlaif/dropped_unparsed"] == 1
    )
    assert env.metrics["train/rlaif/dropped_groups"] == 1


def test_prompts_of_one_and_a_half_max_token_lengths_are_skipped() -> None:
    with FakeInferenceServer(responder=policy()) as fake:
        env = make(fake.base_url, max_token_length=48)
        long_item = {"messages": [{"role": "user", "content": "tell me more " * 20}]}
        assert run(env, [long_item]) == [None]
        assert sum(fake.requests.values()) <= 1  # a health check at most: nothing generated
    assert env.judge_metrics()["train/rlaif/skipped_long_prompts"] == 1


def test_the_judge_uses_its_own_server_when_configured() -> None:
    respond = policy(judge=lambda prompt: pytest.fail("the policy server was asked to judge"))
    with (
        FakeInferenceServer(responder=respond) as srv,
        FakeInferenceServer(responder=foggy_judge) as judge_srv,
    ):
        env = make(srv.base_url, injection_rate=1.0, judge=JudgeConfig(base_url=judge_srv.base_url))
        [group] = run(env, [ITEM])
        assert judge_srv.requests["/v1/chat/completions"] == 2  # forward and swapped
        assert srv.requests["/v1/chat/completions"] == 0 and respond.seen
    assert env.judge.separate and group["scores"] == [0.5, -0.5]


def test_the_judge_sees_the_conversation_both_replies_and_the_preference() -> None:
    [system, user] = judge_messages([USER], "reply one", "reply two", "be foggy")
    assert system["role"] == "system" and "\\boxed{A}" in system["content"]
    text = user["content"]
    assert (
        text.index(USER["content"])
        < text.index("[Response A]\nreply one")
        < text.index("[Response B]\nreply two")
    )
    assert "be foggy" in text and "\\boxed{A} or \\boxed{B}" in text


def test_demo_responder_answers_judge_prompts_only() -> None:
    [_, user] = judge_messages(
        [USER], "plain words", "the lighthouse keeper's ghost", DEFAULT_PREFERENCE
    )
    assert (demo_responder(user["content"]) or "").endswith("\\boxed{B}")
    assert demo_responder("Describe the sea at night.") is None


# ----- end to end -------------------------------------------------------------------------------


def test_check_env_passes() -> None:
    report = check_against(make, demo_responder, injection_rate=0.5)
    assert report.groups >= 1 and report.token_sources == {"server"}


def test_process_writes_jsonl_and_html_with_both_conversations(tmp_path: Path) -> None:
    out = tmp_path / "rlaif.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make(
            fake.base_url, total_steps=3, data_path_to_save_groups=str(out), injection_rate=0.5
        )
        written = process_with_runner(env)
    groups = written.groups
    assert len(groups) == 3
    for group in groups:
        assert len(group["tokens"]) == len(group["messages"]) == 2
        assert sorted(group["scores"]) == [-0.5, 0.5]
        assert all(m[-1]["role"] == "assistant" for m in group["messages"])
    assert html.escape(groups[0]["messages"][1][-2]["content"]) in written.page
