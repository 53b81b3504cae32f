"""What the four multimodal environments share: reading and comparing answers, images (hub
forms, the text-only copy), items made again from a seed, the prompt, `check_env`,
groups with their pictures, `process` through the command line, evaluation, and the demo
responder; all against the fake inference server. Each env's own pictures and rules:
test_multimodal_<env>.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")

from atropos import wire  # noqa: E402
from atropos.environments.common.vision import (  # noqa: E402
    IMAGE_PLACEHOLDER,
    png_base64,
)
from atropos.environments.multimodal.answers import (  # noqa: E402
    dial_minutes,
    minutes_apart,
    read_answer,
    same_answer,
)
from atropos.environments.multimodal.base import EVAL_SEEDS, VisionEnv  # noqa: E402
from atropos.environments.multimodal.clevr import SYNONYMS, Clevr  # noqa: E402
from atropos.environments.multimodal.clock_reading import ClockReading  # noqa: E402
from atropos.environments.multimodal.demo import demo_responder  # noqa: E402
from atropos.environments.multimodal.ocr_vqa import OCRVQA  # noqa: E402
from atropos.environments.multimodal.pixmo_count import PixmoCount  # noqa: E402
from atropos.envs import registry  # noqa: E402
from atropos.envs.cli import main as env_cli  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

from .helpers import (  # noqa: E402
    check_against,
    decode_png,
    env_defaults,
    evaluate_against,
    image_group,
    make_env,
    read_jsonl,
    rollout,
)

ENVS: list[type[VisionEnv[Any]]] = [OCRVQA, Clevr, ClockReading, PixmoCount]


def make(
    cls: type[VisionEnv[Any]], url: str = "http://127.0.0.1:9/v1", mode: str = "process", **env: Any
) -> Any:
    """`cls` with 20 generated training pictures and 4 held out, groups of 4, unless `env`
    says otherwise."""
    return make_env(
        cls, url, mode, **{"server_type": "vllm", "train_size": 20, "eval_size": 4, **env}
    )


class Always:
    """Right on every call: the demo responder's item, its answer in the asked form."""

    def __call__(self, prompt: str) -> str:
        from atropos.environments.multimodal import demo

        item_id = demo._TAG.findall(prompt)[-1]
        found = demo._find(item_id)
        assert found is not None, item_id
        answer = str(found[1]["answer"])
        return f"\\boxed{{{answer}}}" if "\\boxed{" in prompt else f"<answer>{answer}</answer>"


# ----- answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "style", "expected"),
    [
        ("<answer>3</answer>", "tags", "3"),
        ("<ANSWER>\n 3 \n</Answer>", "tags", "3"),
        ("<think>maybe <answer>2</answer></think> <answer>3</answer>", "tags", "3"),
        ("<answer>\\boxed{3}</answer>", "tags", "3"),  # a box inside the block is read through
        ("<answer>3</answer><answer>3</answer>", "tags", None),  # several: no hedging
        ("<answer>3", "tags", None),  # never closed
        ("<think>it is <answer>3</answer>", "tags", None),  # thinking never closed
        ("The answer is 3.", "tags", None),
        ("\\boxed{3}", "tags", None),  # tags asked, a box given
        ("So it is \\boxed{yes}.", "boxed", "yes"),
        ("\\boxed{\\text{2}}", "boxed", "\\text{2}"),  # braces matched
        ("\\boxed{2} or \\boxed{3}", "boxed", None),
        ("<answer>3</answer>", "boxed", None),
        ("\\boxed{4}", "either", "4"),
        ("<answer>5</answer> \\boxed{4}", "either", "5"),  # tags first when there are any
        ("", "either", None),
    ],
)
def test_reading_the_answer(completion, style, expected):
    assert read_answer(completion, style) == expected


@pytest.mark.parametrize(
    ("answer", "gold", "same"),
    [
        ("3", "3", True),
        ("03", "3", True),  # numbers compare numerically
        ("3.0", "3", True),
        ("three", "3", True),
        ("Three.", "3", True),
        ("4", "3", False),
        ("3 cubes", "3", False),  # a number and more is not the number
        ("Yes", "yes", True),
        ("yes.", "yes", True),
        ("yes, there is", "yes", False),
        (' "The  Silent\nRiver" ', "The Silent River", True),
        ("The Silent", "The Silent River", False),
        ("1987", "1987", True),
        ("", "1987", False),
    ],
)
def test_normalised_comparison(answer, gold, same):
    assert same_answer(answer, gold) is same


def test_synonyms_map_both_sides():
    assert same_answer("Ball", "sphere", SYNONYMS) and same_answer("shiny", "metal", SYNONYMS)
    assert not same_answer("ball", "sphere")  # only with the env's synonyms
    assert not same_answer("cube", "sphere", SYNONYMS)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("3:05", 185),
        ("03:05", 185),
        ("15:05", 185),
        ("3:05 PM", 185),
        ("3:05 p.m.", 185),
        ("3.05", 185),
        ("12:00", 0),
        ("00:00", 0),
        ("11:59", 719),
        ("3:05:27", 185),  # seconds are dropped
        ("3:5", None),
        ("25:00", None),
        ("3:60", None),
        ("five past three", None),
    ],
)
def test_times_are_read_on_a_twelve_hour_dial(text, minutes):
    assert dial_minutes(text) == minutes


def test_minutes_apart_goes_the_short_way_round():
    assert minutes_apart(0, 719) == 1 and minutes_apart(185, 185) == 0
    assert minutes_apart(0, 360) == 360 and minutes_apart(10, 700) == 30


# ----- images ----------------------------------------------------------------------------------


def test_missing_pillow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="vision"):
        asyncio.run(make(Clevr).setup())


# ----- items and prompts -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_the_same_seed_gives_the_same_item_and_png(cls):
    config = cls.env_config_cls()
    first = [cls.generated_item(config, s) for s in range(8)]
    assert first == [cls.generated_item(config, s) for s in range(8)]
    assert len({png_base64(cls.draw(i)) for i in first}) == 8  # seeds differ
    assert png_base64(cls.draw(first[3])) == png_base64(cls.draw(cls.generated_item(config, 3)))
    for item in first:
        assert {"id", "seed", "question", "answer", "category"} <= set(item)
        assert item["id"] == f"{cls.kind}-{item['seed']}"


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_train_and_eval_pictures_come_from_disjoint_seeds(cls):
    env = make(cls, seed=7)
    assert [i["seed"] for i in env.load()] == list(range(7, 27))
    assert [i["seed"] for i in env.load_eval()] == list(range(EVAL_SEEDS + 7, EVAL_SEEDS + 11))


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_the_prompt_holds_the_picture_and_asks_for_the_answer_form(cls):
    env = make(cls)
    item = env.load()[2]
    system, user = env.prompt(item)
    asked = "\\boxed{" if cls is Clevr else "<answer>"
    assert system["role"] == "system" and asked in system["content"]
    image_part, text_part = user["content"]
    assert image_part["image_url"]["url"] == "data:image/png;base64," + env.image_base64(item)
    assert text_part == {"type": "text", "text": f"{item['question']}\n[item {item['id']}]"}
    assert (
        "<answer>"
        in env.__class__(
            env.config.model_copy(update={"answer_format": "tags"}), env.server_configs
        ).system_prompt_text()
    )


def test_defaults():
    for cls in ENVS:
        config, [server] = env_defaults(cls)
        assert config.dataset_name is None and config.group_size == 8
        assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert env_defaults(Clevr)[0].answer_format == "boxed"
    assert env_defaults(OCRVQA)[0].answer_format == "tags"


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_registered_by_name(cls):
    if cls.name not in registry.names():
        pytest.skip("the entry points are not installed yet: pip install -e .")
    assert registry.get(cls.name) is cls


# ----- runs against the fake server -----------------------------------------------------------


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_check_env_passes_with_retokenized_text(cls):
    report = check_against(lambda url, **env: make(cls, url, **env), demo_responder)
    assert report.groups == 3 and report.token_sources == {"retokenized"}


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_groups_carry_one_picture_per_sequence_and_text_only_messages(cls):
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make(cls, fake.base_url)
        item, group, backlog, sent = image_group(env)
    assert backlog == [] and group is not None
    assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
    assert group["token_source"] == "retokenized" and "inference_logprobs" not in group
    assert group["images"] == [env.image_base64(item)] * 4
    [messages] = sent  # the server got the picture; the group keeps the text-only copy
    assert messages[1]["content"][0]["image_url"]["url"].endswith(group["images"][0])
    for conversation, tokens in zip(group["messages"], group["tokens"], strict=True):
        assert all(isinstance(m["content"], str) for m in conversation)
        assert conversation[1]["content"].startswith(IMAGE_PLACEHOLDER + "\n")
        assert IMAGE_PLACEHOLDER in env.tokenizer.decode(tokens)
    assert wire.decode_group(wire.encode(group)).images == group["images"]


def test_trl_servers_are_refused():
    env = make(ClockReading, server_type="trl")
    with pytest.raises(ValueError, match="drop the image"):
        asyncio.run(env.setup())


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_process_through_the_command_line(cls, tmp_path: Path):
    out = tmp_path / f"{cls.name}.jsonl"
    target = f"{cls.__module__}:{cls.__name__}"
    with FakeInferenceServer(responder=demo_responder) as fake:
        argv = ["process", f"--openai.base_url={fake.base_url}", "--openai.server_type=vllm"]
        argv += ["--env.total_steps=2", "--env.group_size=2", "--env.train_size=10"]
        argv += [f"--env.data_path_to_save_groups={out}"]
        assert env_cli(registry.get(target), argv) == 0
    groups = read_jsonl(out)
    assert len(groups) == 2 and out.with_suffix(".html").exists()
    for group in groups:
        assert sorted(group["scores"]) == [-1.0, 1.0]
        assert len(group["images"]) == 2 and decode_png(group["images"][0]).format == "PNG"


def test_score_group_logs_correctness_per_category_and_measures():
    env = make(ClockReading, tolerance_minutes=2)
    item = {**env.load()[0], "answer": "03:10", "category": "roman"}
    texts = ["<answer>3:11</answer>", "<answer>3:40</answer>", "no answer", "<answer>3:10</answer>"]
    rollouts = [rollout(text=t) for t in texts]
    scores = [env.score(item, t) for t in texts]
    assert scores == [1.0, -1.0, -1.0, 1.0]
    assert env.score_group(item, rollouts, scores) == scores
    assert env.score_group(item, rollouts[:1], [1.0]) is None  # all equal: dropped
    asyncio.run(env.wandb_log({}))
    assert env.metrics["train/percent_correct"] == 0.6
    assert env.metrics["train/percent_correct_roman"] == 0.6
    assert env.metrics["train/answered"] == 0.8
    assert env.metrics["train/minute_error"] == (1 + 30 + 0 + 1) / 4


@pytest.mark.parametrize("cls", ENVS, ids=lambda c: c.name)
def test_evaluate_reports_per_category_accuracy(cls, tmp_path):
    run = evaluate_against(
        lambda url, mode, **env: make(cls, url, mode, **env), Always(), tmp_path, setup=True
    )
    assert run.metrics["eval/percent_correct"] == 1.0 and run.metrics["eval/mean_score"] == 1.0
    assert run.metrics["eval/answered"] == 1.0 and run.metrics["eval/images_unavailable"] == 0
    categories = {s["category"] for s in run.samples}
    assert {f"eval/percent_correct_{c}" for c in categories} <= set(run.metrics)
    assert [s["id"] for s in run.samples] == [f"{cls.kind}-{EVAL_SEEDS + n}" for n in range(4)]
    assert all(s["score"] == 1.0 and s["gold"] for s in run.samples)


def test_the_demo_responder_answers_right_every_other_call():
    item = ClockReading.generated_item(ClockReading.env_config_cls(), 987_654)  # never loaded
    prompt = f"{IMAGE_PLACEHOLDER}\n{item['question']}\n[item {item['id']}]"
    replies = [demo_responder(prompt) or "" for _ in range(4)]
    assert sorted(read_answer(r) == item["answer"] for r in replies) == [False, False, True, True]
    boxed = demo_responder(f"Use \\boxed{{}}.\n[item {item['id']}]") or ""
    assert read_answer(boxed, "boxed") is not None
    assert demo_responder("What is 2 + 2?") is None
    assert demo_responder("[item nowhere-1]") is None
    assert demo_responder("[item clock-test-1]") is None  # a hub item of another process
