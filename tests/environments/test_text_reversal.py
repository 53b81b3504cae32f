"""The `text_reversal` environment: format rules, scoring, data sources, and runs against the
fake inference server."""

from __future__ import annotations

import asyncio
import re
from functools import partial

import pytest

from atropos.environments import text_reversal
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.text_reversal import (
    THINKING_PROMPT,
    TextReversal,
    TextReversalConfig,
    extract_reversal,
    instruction,
    load_texts,
    score_reversal,
)
from atropos.envs import registry

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>Reading from the end.</think>\n"


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, TextReversal)


def block(text: str) -> str:
    return f"<reversed_text>{text}</reversed_text>"


# ----- scoring ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        (THINK + block("!dlrow olleH"), 1.0),
        (THINK + "Here you go:\n" + block("\n  !dlrow olleH  \n") + "\nDone.", 1.0),  # stripped
        (THINK + block("!dlrow olleh"), 0.0),  # case matters
        (THINK + block("!dlrowolleH"), 0.0),  # so does every space
        (THINK + block("Hello world!"), 0.0),  # not reversed
        (block("!dlrow olleH"), 0.0),  # no think block
        ("<think>a</think><think>b</think>" + block("!dlrow olleH"), 0.0),  # two think blocks
        ("<think>never closed " + block("!dlrow olleH"), 0.0),
        ("</think>backwards<think>" + block("!dlrow olleH"), 0.0),
        ("<think>" + block("!dlrow olleH") + "</think>", 0.0),  # only inside thinking
        (THINK + block("!dlrow olleH") + block("!dlrow olleH"), 0.0),  # two blocks
        (THINK + block("!dlrow olleH") + "<reversed_text>", 0.0),  # a stray open tag
        (THINK + "<reversed_text>!dlrow olleH", 0.0),  # unclosed
        (THINK + "!dlrow olleH", 0.0),  # no tags
    ],
)
def test_score_with_thinking(completion, score):
    assert score_reversal(completion, "Hello world!") == score


def test_without_thinking_the_whole_completion_is_read():
    assert score_reversal(block("cba"), "abc", thinking=False) == 1.0
    assert score_reversal(THINK + block("cba"), "abc", thinking=False) == 1.0
    assert score_reversal("<think>" + block("cba") + "</think>", "abc", thinking=False) == 1.0
    assert extract_reversal(block("cba") + block("cba"), thinking=False) is None
    env = make(thinking_mode=False)
    assert env.score({"text": "abc"}, block("cba")) == 1.0
    assert make().score({"text": "abc"}, block("cba")) == 0.0


def test_score_group_rules():
    env = make()
    mixed = [1.0, 0.0, 0.0, 1.0]
    assert env.score_group({"text": "t"}, [rollout()] * 4, mixed) == mixed
    assert env.score_group({"text": "t"}, [rollout(9)] + [rollout()] * 3, mixed) is None
    assert env.score_group({"text": "t"}, [rollout()] * 4, [1.0] * 4) is None  # all equal
    keep = make(ensure_scores_are_not_same=False)
    assert keep.score_group({"text": "t"}, [rollout()] * 4, [0.0] * 4) == [0.0] * 4
    # no length penalty: long right answers keep 1.0
    long = make(max_token_length=30)
    assert long.score_group({"text": "t"}, [rollout(25), rollout(25)], [1.0, 0.0]) == [1.0, 0.0]


def test_train_metrics():
    env = make()
    rollouts = [rollout(text=THINK + block("a")), rollout(text="no tags"), rollout(), rollout()]
    env.score_group({"text": "a"}, rollouts, [1.0, 0.0, 0.0, 0.0])
    asyncio.run(env.wandb_log())
    assert env.metrics == {"train/percent_correct": 0.25, "train/format_compliance": 0.25}


# ----- prompt and data ----------------------------------------------------------------------


def test_prompt_has_the_thinking_system_prompt_when_thinking():
    system, user = make().prompt({"text": "abc"})
    assert system == {"role": "system", "content": THINKING_PROMPT}
    assert user == {"role": "user", "content": instruction("abc")}
    assert user["content"].endswith("The text to reverse:\nabc")
    assert "<reversed_text> </reversed_text>" in user["content"]
    both = make(custom_thinking_prompt="Think.", custom_base_system_prompt="Be exact.")
    assert both.prompt({"text": "abc"})[0]["content"] == "Think.\n\nBe exact."
    assert make(thinking_mode=False).prompt({"text": "abc"}) == [user]
    base_only = make(thinking_mode=False, custom_base_system_prompt="Be exact.")
    assert base_only.prompt({"text": "abc"})[0] == {"role": "system", "content": "Be exact."}


def test_the_fixture():
    train, test = load_texts(None, "train"), load_texts(None, "test")
    assert (len(train), len(test)) == (40, 12)
    assert not {i["text"] for i in train} & {i["text"] for i in test}
    assert train == [
        {"text": r["text"]} for r in read_jsonl(data_path("text_reversal", "train.jsonl"))
    ]


def test_a_local_jsonl_file_is_read(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "one"}\n{"text": ""}\n{"text": "two", "id": 2}\n')
    assert load_texts(str(path), "ignored") == [{"text": "one"}, {"text": "two"}]
    env = make(train_dataset=str(path), eval_dataset=str(path))
    assert env.load() == env.load_eval() == [{"text": "one"}, {"text": "two"}]


def test_a_hub_dataset_is_read_by_name(monkeypatch):
    calls = fake_hub(monkeypatch, lambda name, split: [{"text": f"{split} text"}])
    name = "NousResearch/TextReversalDataset"
    env = make(train_dataset=name, eval_dataset=name)
    assert env.load() == [{"text": "train text"}] and env.load_eval() == [{"text": "test text"}]
    assert [(c.name, c.split) for c in calls] == [(name, "train"), (name, "test")]


# ----- against a fake inference server ------------------------------------------------------


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, text_reversal.demo_responder)
    assert report.groups == 3 and report.token_sources == {"server"}


_TEXT = re.compile(r"The text to reverse:\n(.*?)<\|im_end\|>", re.DOTALL)


def test_evaluate_reports_accuracy_and_format_compliance(tmp_path):
    seen = []

    def responder(prompt: str) -> str:
        text = _TEXT.findall(prompt)[-1]
        seen.append(text)
        if len(seen) % 3 == 0:
            return "I will not use the tags: " + text[::-1]  # unformatted
        return THINK + block(text[::-1] if len(seen) % 3 == 1 else text)  # right, then wrong

    run = evaluate_against(make, responder, tmp_path)
    metrics = run.metrics
    assert sorted(seen) == sorted(i["text"] for i in load_texts(None, "test"))
    assert metrics["eval/percent_correct"] == pytest.approx(4 / 12)
    assert metrics["eval/format_compliance"] == pytest.approx(8 / 12)
    assert metrics["eval/avg_response_chars"] > 0
    assert run.temperature == 0.6


def test_process_end_to_end_writes_jsonl_and_html(tmp_path):
    run = process_through_cli(
        TextReversal, text_reversal.demo_responder, tmp_path / "reversal.jsonl"
    )
    groups = run.groups
    assert len(groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    assert groups[0]["messages"][0][0] == {"role": "system", "content": THINKING_PROMPT}
    assert "reversed_text" in run.page
    assert run.metrics["env"] == {
        "train/percent_correct": 0.5,
        "train/format_compliance": 1.0,
    }


def test_demo_responder_alternates_and_ignores_other_prompts():
    prompt = f"<|im_start|>user\n{instruction('Hello world')}<|im_end|>"
    answers = [text_reversal.demo_responder(prompt) or "" for _ in range(2)]
    assert sorted(score_reversal(a, "Hello world") for a in answers) == [0.0, 1.0]
    assert text_reversal.demo_responder("What is 2 + 2?") is None


def test_defaults_and_registration():
    config, [server] = env_defaults(TextReversal)
    assert isinstance(config, TextReversalConfig) and config.thinking_mode
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert config.train_dataset is None and (config.train_split, config.eval_split) == (
        "train",
        "test",
    )
    assert "text_reversal" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("text_reversal") is TextReversal
