"""NPCArena against fake servers: prompts and lore, the judge's view, scores, drops, metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

from atropos.environments.npc_arena import NPCArena, NPCArenaConfig, demo_responder
from atropos.envs import registry
from atropos.envs.cli import main, parse
from atropos.envs.config import ConfigError
from atropos.envs.judge import JudgeConfig
from atropos.testing import FakeInferenceServer

from ..helpers import Processed, check_against, env_defaults, fake_hub, modules_loaded_by
from .helpers import Script, make, one_group, pair_of, prefers

KAELEN = {"character": "kaelen", "line": "Where does mithril come from?"}
CRITERIA_LINES = "consistency: {pick}\nlore_accuracy: A\nengagingness: {other}\n"


def prompt_text(tokenizer, tokens, masks) -> str:
    return tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m == -100])


def test_retrieved_lore_is_in_the_prompt_the_policy_saw_and_the_trainer_gets():
    script = Script(["Mithril, surfacer? From the deep mines.", "Bah."])
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url)
        group = asyncio.run(one_group(env, KAELEN))
        tok = srv.tokenizer
    system = group["messages"][0][0]["content"]
    assert "## World knowledge" in system and "- Mithril: A pale, light" in system
    lore_line = next(line for line in system.splitlines() if line.startswith("- Mithril:"))
    assert lore_line in script.policy_prompts[0]  # what the policy saw...
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        trained_on = prompt_text(tok, tokens, masks)
        assert lore_line in trained_on and "Where does mithril come from?" in trained_on
    assert len(group["inference_logprobs"][0]) == len(group["tokens"][0])
    assert group["token_source"] == "server"


def test_the_judge_sees_the_whole_sheet_the_lore_the_line_and_both_orders():
    script = Script(["Mithril, surfacer!", "Bah."], prefers("Mithril"))
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url, judge=JudgeConfig(votes=2))
        group = asyncio.run(one_group(env, KAELEN))
    sheet = env.characters["kaelen"]
    assert len(script.judge_prompts) == 4  # 2 votes x 2 orders
    for prompt in script.judge_prompts:
        for value in (sheet.name, sheet.system_prompt, sheet.personality, sheet.speech_style):
            assert value in prompt
        assert sheet.backstory in prompt
        assert all(f in prompt for f in [*sheet.knowledge, *sheet.forbidden])
        assert "Mithril: A pale, light" in prompt and "Where does mithril come from?" in prompt
    assert {pair_of(p) for p in script.judge_prompts} == {
        ("Mithril, surfacer!", "Bah."),
        ("Bah.", "Mithril, surfacer!"),
    }
    texts = [m[-1]["content"] for m in group["messages"]]
    scores = dict(zip(texts, group["scores"], strict=True))
    assert scores == {"Mithril, surfacer!": 0.5, "Bah.": -0.5}  # mapped back in both orders
    assert env.counts["votes_parsed"] == 4 and env.counts["judged_groups"] == 1


def test_per_criterion_verdicts_are_tallied_in_the_original_order():
    script = Script(["Bah.", "Mithril, surfacer!"], prefers("Mithril", CRITERIA_LINES))
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url)
        asyncio.run(one_group(env, KAELEN))
        asyncio.run(env.wandb_log())
    m = {k.removeprefix("train/npc_arena/"): v for k, v in env.metrics.items()}
    assert m["consistency/winner_agreement"] == 1.0 and m["consistency/first_position"] == 0.5
    assert m["lore_accuracy/winner_agreement"] == 0.5 and m["lore_accuracy/first_position"] == 1.0
    assert m["engagingness/winner_agreement"] == 0.0 and m["engagingness/parsed"] == 1.0
    assert m["judged_groups"] == 1.0 and m["dropped_unparsed"] == 0.0


def test_unparsable_judge_answers_drop_the_group_and_are_counted():
    script = Script(["Bah.", "Hmph."], lambda prompt: "They are both fine. Maybe \\boxed{C}?")
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url)
        assert asyncio.run(one_group(env, KAELEN)) is None
    assert env.counts["dropped_unparsed"] == 1 and env.counts["votes_unparsed"] == 6
    assert env.counts["votes_parsed"] == 0
    metrics = env.arena_metrics()
    assert metrics["train/npc_arena/consistency/parsed"] == 0.0
    assert "train/npc_arena/consistency/winner_agreement" not in metrics


LONG = "word " * 60


@pytest.mark.parametrize(
    ("answers", "scores", "counter"),
    [
        (["Short.", LONG], [1.0, -1.0], "truncation_decided"),
        ([LONG, "Short."], [-1.0, 1.0], "truncation_decided"),
        ([LONG, LONG], None, "dropped_all_truncated"),
    ],
)
def test_truncation_decides_without_a_judge(answers, scores, counter):
    script = Script(answers, prefers("Short"))
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url, response_tokens=16)
        group = asyncio.run(one_group(env, KAELEN))
    assert (group["scores"] if group else None) == scores
    assert env.counts[counter] == 1 and script.judge_prompts == []


def rubric_judge(prompt: str) -> str:
    response = prompt.rsplit("[Response]", 1)[1].split("Rate the response", 1)[0]
    level = 10 if "Mithril" in response else 1 if "Bah" in response else 5.5
    return f"Consistency: {level}\nLore accuracy: {level}/10\nEngagingness: {level}"


def test_rubric_mode_rates_each_response_and_maps_the_mean_to_minus_one_one():
    script = Script(["Mithril!", "Bah.", "Hmm, well.", "Hmph."], rubric_judge)
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url, judge_mode="rubric", group_size=4, judge=JudgeConfig(votes=2))
        group = asyncio.run(one_group(env, KAELEN))
    scores = dict(zip([m[-1]["content"] for m in group["messages"]], group["scores"], strict=True))
    assert scores == {"Mithril!": 1.0, "Bah.": -1.0, "Hmm, well.": 0.0, "Hmph.": 0.0}
    assert len(script.judge_prompts) == 8 and all("[Response]" in p for p in script.judge_prompts)
    assert env.counts["votes_parsed"] == 8
    m = env.arena_metrics()
    assert m["train/npc_arena/consistency/mean_score"] == pytest.approx((10 + 1 + 5.5 + 5.5) / 4)


def test_rubric_mode_cut_responses_score_minus_one_unjudged_and_unparsed_drops():
    script = Script(["Mithril!", LONG, "Bah."], rubric_judge)
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url, judge_mode="rubric", group_size=3, response_tokens=16)
        group = asyncio.run(one_group(env, KAELEN))
        assert group["scores"] == [1.0, -1.0, -1.0] and len(script.judge_prompts) == 2 * 3
        script.judge = lambda p: (
            "Consistency: 7" if "Bah." in p.split("[Response]")[1] else (rubric_judge(p))
        )
        env = make(srv.base_url, judge_mode="rubric", group_size=3)
        assert asyncio.run(one_group(env, KAELEN)) is None  # one response got no usable rating
    assert env.counts["dropped_unparsed"] == 1 and env.counts["votes_unparsed"] == 3
    assert env.counts["votes_parsed"] == 6


def test_a_separate_judge_server_does_all_the_judging():
    policy, judge = Script(["Mithril!", "Bah."]), Script(judge=prefers("Mithril"))
    with FakeInferenceServer(responder=policy) as p, FakeInferenceServer(responder=judge) as j:
        env = make(p.base_url, judge=JudgeConfig(base_url=j.base_url, model_name="judge"))
        group = asyncio.run(one_group(env, KAELEN))
        assert env.judge.separate and j.requests["/v1/chat/completions"] == 2
    assert policy.judge_prompts == [] and len(judge.judge_prompts) == 6
    assert judge.policy_prompts == [] and len(policy.policy_prompts) == 2
    assert sorted(group["scores"]) == [-0.5, 0.5]


def test_an_event_appended_after_setup_reaches_the_next_prompt(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"text": "Harvest fair opened.", "title": "Fair"}) + "\n")
    script = Script(["Aye.", "Bah."], prefers("Aye"))
    item = {"character": "kaelen", "line": "Is it true about the dragon Cinderwing?"}
    with FakeInferenceServer(responder=script) as srv:
        env = make(srv.base_url, events_path=str(events), lore_k=2, recent_events=0)

        async def main():
            await env.setup()
            first, _ = await env.collect_trajectories(item)
            with open(events, "a") as f:
                f.write(json.dumps({"text": "The dragon Cinderwing burned the Millford mill."}))
                f.write("\n")
            second, _ = await env.collect_trajectories(item)
            await env.server.aclose()
            return first, second

        first, second = asyncio.run(main())
        tok = srv.tokenizer
    news = "- Event (recent event): The dragon Cinderwing burned the Millford mill."
    assert news not in first["messages"][0][0]["content"]
    assert news in second["messages"][0][0]["content"]
    assert news in prompt_text(tok, second["tokens"][0], second["masks"][0])
    assert env.arena_metrics()["train/npc_arena/events_indexed"] == 2.0


def test_lore_is_trimmed_to_fit_and_hopeless_prompts_are_skipped():
    with FakeInferenceServer(responder=Script(["Aye.", "Bah."])) as srv:
        env = make(srv.base_url, max_token_length=700, response_tokens=128, lore_k=5)
        group = asyncio.run(one_group(env, KAELEN))
        assert group is not None and env.counts["lore_trimmed"] == 1
        env = make(srv.base_url, max_token_length=300, response_tokens=128)
        assert asyncio.run(one_group(env, KAELEN)) is None
        assert env.counts["skipped_long_prompts"] == 1


def test_check_env_passes_in_both_modes():
    report = check_against(make, demo_responder)
    assert report.groups >= 1 and report.token_sources == {"server"}
    report = check_against(make, demo_responder, items=2, judge_mode="rubric", group_size=3)
    assert report.groups == 2


def test_process_end_to_end_from_the_command_line_writes_groups_and_the_html_page(tmp_path):
    out, events = tmp_path / "npc.jsonl", tmp_path / "events.jsonl"
    events.write_text(json.dumps({"text": "Wyverns were sighted over Highcrest."}) + "\n")
    with (
        FakeInferenceServer(responder=demo_responder) as policy,
        FakeInferenceServer(responder=demo_responder) as judge,
    ):
        argv = [
            "process",
            *("--openai.base_url", policy.base_url, "--judge.base_url", judge.base_url),
            *("--env.total_steps", "4", "--env.data_path_to_save_groups", str(out)),
            *("--env.events_path", str(events), "--judge.votes", "2"),
        ]
        assert main(registry.get("npc_arena"), argv) == 0
        assert judge.requests["/v1/chat/completions"] >= 8 and policy.requests
    written = Processed(out)
    groups = written.groups
    assert len(groups) == 4 and all(len(g["tokens"]) == 2 for g in groups)
    assert all(sorted(g["scores"]) in ([-0.5, 0.5], [-1.0, 1.0]) for g in groups)
    systems = [g["messages"][0][0]["content"] for g in groups]
    assert all("## World knowledge" in s and "Wyverns were sighted" in s for s in systems)
    assert "Wyverns were sighted" in written.page
    assert "judge:" in out.with_suffix(".config.yaml").read_text()


def test_player_lines_from_a_file_and_from_the_hub(tmp_path, monkeypatch):
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"line": "Hi!"}\n{"line": "Riddle me.", "character": "lyra"}\n')
    with FakeInferenceServer() as srv:
        env = make(srv.base_url, player_lines_path=str(lines))
        asyncio.run(env.setup())
    assert len(env.items) == len(env.characters) + 1
    assert {"character": "lyra", "line": "Riddle me."} in env.items

    rows = [{"text": "Sell me a hammer.", "npc": "kaelen"}, {"text": "Ahoy?", "npc": "redeye"}]
    asked = fake_hub(monkeypatch, rows)
    with FakeInferenceServer() as srv:
        env = make(
            srv.base_url,
            player_lines_dataset="someone/npc-lines",
            player_lines_split="validation",
            line_field="text",
            character_field="npc",
        )
        asyncio.run(env.setup())
    assert asked == [("someone/npc-lines", None, "validation")]
    assert sorted(i["character"] for i in env.items) == ["kaelen", "redeye"]


def test_lines_for_characters_not_loaded_are_skipped_with_a_hint(tmp_path, caplog):
    lines = tmp_path / "lines.jsonl"
    lines.write_text(
        '{"line": "Sing!", "character": "lyra"}\n{"line": "x", "character": "kaelan"}\n'
    )
    with FakeInferenceServer() as srv:
        env = make(srv.base_url, player_lines_path=str(lines))
        asyncio.run(env.setup())
    assert env.items == [{"character": "lyra", "line": "Sing!"}]
    assert "'kaelan' x1 (did you mean 'kaelen'?)" in caplog.text
    lines.write_text('{"line": ""}\n')
    with pytest.raises(ValueError, match=r"lines\.jsonl row 1: expected a non-empty string"):
        asyncio.run(env.setup())


def test_config_rules_and_defaults():
    config, [server] = env_defaults(NPCArena)
    assert (config.group_size, config.tokenizer_name, server.server_type) == (2, "tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1" and config.judge.max_tokens == 1024
    resolved = parse(NPCArena, "process", ["--judge.base_url", "http://127.0.0.1:9/v1"])
    assert resolved.env.judge.max_tokens == 1024  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="group_size must be 2"):
        parse(NPCArena, "process", ["--env.group_size", "4"])
    rubric = parse(NPCArena, "process", ["--env.judge_mode", "rubric", "--env.group_size", "4"])
    assert rubric.env.group_size == 4
    with pytest.raises(ValueError, match="leaves no room for the prompt"):
        NPCArenaConfig(response_tokens=512, max_token_length=512)


def test_is_registered_under_its_name():
    assert "npc_arena" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("npc_arena") is NPCArena


def test_importing_the_environment_pulls_in_nothing_heavy():
    heavy = {"torch", "transformers", "numpy", "datasets", "sentence_transformers"}
    assert modules_loaded_by("atropos.environments.npc_arena", heavy) == []
