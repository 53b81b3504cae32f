"""The `dataset` environment: config and YAML files, data sources, rewards, and real runs."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.dataset import DatasetEnv, DatasetEnvConfig, read_dataset_file
from atropos.envs import cli, registry
from atropos.envs.config import ConfigError
from atropos.envs.simple import Env, Rollout
from atropos.testing import FakeInferenceServer

from .helpers import (
    OFFLINE,
    check_against,
    collect,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
)

TRAIN = read_jsonl(data_path("dataset", "train.jsonl"))
TEST = read_jsonl(data_path("dataset", "test.jsonl"))
GOLD = {row["prompt"]: row["answer"] for row in TRAIN + TEST}


def prompt_of(text: str) -> str:
    return next(p for p in GOLD if p in text)


def alternating(think: bool = False) -> object:
    """A responder right on every other choice (boxed answers; optionally after thinking)."""
    turn = itertools.count()

    def respond(text: str) -> str:
        gold = GOLD[prompt_of(text)]
        answer = gold if next(turn) % 2 == 0 else f"{gold}1"
        return ("<think>Working it out.</think> " if think else "") + f"\\boxed{{{answer}}}"

    return respond


def make(url: str, mode: str = "process", server_type: str = "vllm", **env: object) -> DatasetEnv:
    """Validated settings (rewards are normalised); groups of 4, equal scores kept."""
    env = {"ensure_scores_are_not_same": False, **env}
    return make_env(DatasetEnv, url, mode, server_type=server_type, validate=True, **env)


# ----- configuration and YAML files ---------------------------------------------------------------


def test_defaults_use_the_shipped_fixture_and_accuracy():
    config, [server] = env_defaults(DatasetEnv)
    assert config.rewards == [{"name": "accuracy", "weight": 1.0, "params": {}}]
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    env = make(OFFLINE)
    assert env.load() == TRAIN and env.load_eval() == TEST
    assert env.prompt(TRAIN[0]) == [{"role": "user", "content": TRAIN[0]["prompt"]}]


def test_unknown_rewards_fail_in_the_config_with_a_suggestion():
    with pytest.raises(
        ValueError, match=r"rewards\[0\].name: unknown reward 'acurracy'; did you mean 'accuracy'"
    ):
        DatasetEnvConfig(rewards=[{"name": "acurracy"}])
    with pytest.raises(ValueError, match="reward 'format' has no parameter 'tags'"):
        DatasetEnvConfig(rewards=[{"name": "format", "params": {"tags": ["think"]}}])


def test_the_shipped_example_files_are_valid():
    for name in ("local.yaml", "gsm8k.yaml"):
        config = DatasetEnvConfig(dataset_config_file=str(data_path("dataset", name)))
        assert config.rewards[0]["name"] == "accuracy"
    hub = DatasetEnvConfig(dataset_config_file=str(data_path("dataset", "gsm8k.yaml")))
    assert (hub.dataset_name, hub.prompt_field, hub.prefill) == ("gsm8k", "question", "<think>\n")
    assert hub.reward_normalization == "sum"


def test_a_file_fills_the_fields_left_at_their_defaults(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text(
        "dataset:\n  prompt_field: q\n  answer_field: a\n  temperature: 0.7\n"
        "rewards: [accuracy, {name: format, weight: 0.5}]\n"
    )
    config = DatasetEnvConfig(dataset_config_file=str(path), temperature=0.3)
    assert (config.prompt_field, config.answer_field) == ("q", "a")
    assert config.temperature == 0.3  # set explicitly: the file does not override it
    assert [r["name"] for r in config.rewards] == ["accuracy", "format"]


def test_a_file_through_the_command_line_and_a_flag_over_it(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text("prompt_field: q\ntop_p: 0.9\nrewards: [{name: reasoningsteps}]\n")
    argv = [f"--env.dataset_config_file={path}", "--env.top_p=0.5"]
    env = cli.parse(DatasetEnv, "process", argv).env
    assert isinstance(env, DatasetEnvConfig)
    assert (env.prompt_field, env.top_p) == ("q", 0.5)
    assert env.rewards == [{"name": "reasoning_steps", "weight": 1.0, "params": {}}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt_field: [unclosed", r"ds.yaml: not valid YAML"),
        ("- a list", r"ds.yaml: expected a mapping of dataset settings, got list"),
        ("promt_field: q", r"ds.yaml: unknown key 'promt_field'; did you mean 'prompt_field'\?"),
        ("group_size: 8", r"ds.yaml: 'group_size' is a run setting.*--env.group_size"),
        (
            "rewards: [{name: acuracy}]",
            r"ds.yaml: rewards\[0\].name: unknown reward 'acuracy'; did you mean 'accuracy'",
        ),
    ],
)
def test_bad_files_are_errors_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "ds.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_dataset_file(path)
    with pytest.raises(ConfigError, match=message):  # through the command line: exit status 2
        cli.parse(DatasetEnv, "process", [f"--env.dataset_config_file={path}"])


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(ValueError, match=r"dataset_config_file '.*nope.yaml': cannot read it"):
        DatasetEnvConfig(dataset_config_file=str(tmp_path / "nope.yaml"))
    assert cli.main(DatasetEnv, ["process", f"--env.dataset_config_file={tmp_path}/nope.yaml"]) == 2


# ----- data sources -----------------------------------------------------------------------------


def test_a_local_file_with_its_own_fields(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(
        json.dumps({"q": "What is 2 + 3?", "solution": "Add: \\boxed{5}", "gt": "5"}) + "\n"
    )
    env = make(OFFLINE, dataset_path=str(path), prompt_field="q", ground_truth_field="gt")
    [item] = env.load()
    assert env.gold(item) == "5" and env.load_eval() == []  # no eval file: no eval items
    assert env.score(item, "\\boxed{5}") == 1.0
    env = make(OFFLINE, dataset_path=str(path), prompt_field="q", answer_field="solution")
    assert env.score(item, "\\boxed{5}") == 1.0  # the answer field's own solution


def test_a_missing_field_names_the_setting_and_suggests_one(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"promt": "What is 2 + 3?", "answer": "5"}) + "\n")
    message = r"--env.prompt_field: row 0 of .*items.jsonl has no field 'prompt'; did you mean"
    with pytest.raises(ConfigError, match=message + " 'promt'"):
        make(OFFLINE, dataset_path=str(path)).load()
    with pytest.raises(ConfigError, match=r"--env.ground_truth_field: .* no field 'gold'"):
        make(
            OFFLINE, dataset_path=str(path), prompt_field="promt", ground_truth_field="gold"
        ).load()


def test_the_hub_dataset_and_its_eval_split(monkeypatch):
    calls = fake_hub(
        monkeypatch,
        lambda name, split: [{"question": f"{split} {i}", "answer": str(i)} for i in range(150)],
    )
    env = make(OFFLINE, dataset_name="org/math", dataset_config="easy", prompt_field="question")
    assert len(env.load()) == 150 and env.load_eval() == []  # no eval_split: no eval
    env = make(
        OFFLINE, dataset_name="org/math", split="tr", eval_split="te", prompt_field="question"
    )
    evals = env.load_eval()
    assert len(evals) == 100 and evals[0]["question"] == "te 0"  # the first 100
    assert calls == [("org/math", "easy", "train"), ("org/math", None, "te")]


# ----- scoring ----------------------------------------------------------------------------------


def test_weighted_rewards_and_minmax_per_group():
    rewards = [{"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": 2.0}]
    env = make(OFFLINE, rewards=rewards)
    item = {"prompt": "What is 6 * 7?", "answer": "42"}
    assert env.score(item, "<think>6 * 7</think> \\boxed{42}") == 3.0
    assert env.score(item, "<think>6 * 7</think> \\boxed{41}") == 2.0
    assert env.score(item, "\\boxed{42}") == 1.0
    rollouts = [Rollout("", [1], [1], None, "stop", "server")] * 3
    assert env.score_group(item, rollouts, [3.0, 2.0, 1.0]) == [3.0, 2.0, 1.0]
    env = make(OFFLINE, rewards=rewards, reward_normalization="minmax")
    assert env.score_group(item, rollouts, [3.0, 2.0, 1.0]) == [1.0, 0.5, 0.0]
    env = make(OFFLINE, rewards=rewards, reward_normalization="sum")
    assert env.score(item, "<think>6 * 7</think> \\boxed{41}") == pytest.approx(2 / 3)


def test_sampling_settings_reach_the_server(monkeypatch):
    seen = []

    async def fake_generate(self, messages, n, split="train", **sampling):
        seen.append((split, sampling))
        return [Rollout("\\boxed{42}", [1, 2], [-100, 2], None, "stop", "server")] * n

    monkeypatch.setattr(Env, "generate", fake_generate)
    env = make(OFFLINE, temperature=0.7, top_p=0.9, group_size=2)
    [(group, _)] = collect(env, {"prompt": "What is 6 * 7?", "answer": "42"})
    assert group["scores"] == [1.0, 1.0]
    assert seen == [("train", {"temperature": 0.7, "top_p": 0.9})]


# ----- against a fake inference server ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["serve", "process"])
def test_groups_are_scored_in_every_mode(mode):
    # upstream's serve path never called score(); ours scores every group
    with FakeInferenceServer(responder=alternating(think=True)) as fake:
        rewards = [{"name": "accuracy"}, {"name": "format", "weight": 0.5}]
        [(group, _)] = collect(make(fake.base_url, mode, rewards=rewards), TRAIN[0])
    assert sorted(group["scores"]) == [0.5, 0.5, 1.5, 1.5]
    assert len(group["tokens"]) == len(group["inference_logprobs"]) == 4


def test_check_env_passes():
    report = check_against(make, alternating(), system_prompt="Answer in \\boxed{}.")
    assert report.groups == 3 and report.token_sources == {"server"}


def test_prefill_starts_the_answer_and_is_not_trained():
    prompts: list[str] = []

    def respond(text: str) -> str:
        prompts.append(text)
        return f"Working it out.</think> \\boxed{{{GOLD[prompt_of(text)]}}}"

    with FakeInferenceServer(responder=respond) as fake:
        env = make(fake.base_url, prefill="<think>", group_size=2, rewards=["accuracy", "format"])
        [(group, _)] = collect(env, TRAIN[0])
        tokenizer = fake.tokenizer
    assert prompts and all(p.endswith("<think>") for p in prompts)
    assert group["scores"] == [2.0, 2.0]  # format sees the prefilled <think>
    assert all(m[-1]["content"].startswith("<think>Working") for m in group["messages"])
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        assert tokenizer.decode(trained, skip_special_tokens=True).startswith("Working")


def test_prefill_needs_token_ids_from_the_server():
    env = make(OFFLINE, server_type="openai", prefill="<think>")
    with pytest.raises(ConfigError, match="prefill needs a server that returns token ids"):
        asyncio.run(env.generate([{"role": "user", "content": "hi"}], 1))


def test_evaluate_reports_mean_max_and_min_over_the_first_items(tmp_path):
    seen: list[str] = []

    def respond(text: str) -> str:
        seen.append(prompt_of(text))
        return "\\boxed{" + GOLD[prompt_of(text)] + ("" if len(seen) % 2 else "9") + "}"

    run = evaluate_against(make, respond, tmp_path, eval_limit=6)
    assert sorted(seen) == sorted(row["prompt"] for row in TEST[:6])
    assert run.metrics == {"eval/mean_score": 0.5, "eval/max_score": 1.0, "eval/min_score": 0.0}
    assert run.temperature == 0.0
    assert len(run.samples) == 6


def test_process_end_to_end_writes_jsonl_and_html(tmp_path):
    run = process_through_cli(DatasetEnv, alternating(), tmp_path / "dataset.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in run.groups)
    assert "boxed" in run.page


def test_is_registered_under_its_name():
    assert "dataset" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("dataset") is DatasetEnv
