"""The shipped tiny tokenizer: offline loading, round trips, chat template, exact rebuild."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atropos.inference.tokenize import as_token_ids, end_of_turn_ids
from atropos.testing import load_script, tiny_tokenizer_path
from atropos.testing.fake_engine import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TOK = load_tokenizer()


def test_files_are_small_and_shipped():
    files = sorted(p.name for p in Path(tiny_tokenizer_path()).iterdir())
    assert files == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert sum(p.stat().st_size for p in Path(tiny_tokenizer_path()).iterdir()) < 1_000_000


def test_special_tokens_and_vocabulary():
    assert 300 <= len(TOK) <= 2100
    assert TOK.eos_token == "<|im_end|>" and TOK.pad_token == "<|pad|>"
    assert TOK.bos_token is None
    ids = TOK.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"])
    assert ids == [0, 1, 2, 3]
    assert set(ids) <= set(TOK.all_special_ids)
    # think and tool-call tags are single, non-special tokens: they survive skip_special_tokens
    think = TOK.encode("<think>x</think>", add_special_tokens=False)
    assert len(think) == 3 and TOK.decode(think, skip_special_tokens=True) == "<think>x</think>"


def test_encode_adds_no_special_tokens():
    assert TOK.encode("hello", add_special_tokens=True) == TOK.encode(
        "hello", add_special_tokens=False
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips(text):
    assert TOK.decode(TOK.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_chatml_for_every_role():
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "tool", "content": "ok"},
    ]
    text = TOK.apply_chat_template(chat, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>tool\nok<|im_end|>\n"
    )
    prompt = TOK.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    ids = as_token_ids(TOK.apply_chat_template(chat, tokenize=True))
    assert ids == TOK.encode(text, add_special_tokens=False)


def test_chat_template_content_parts_and_tools():
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert TOK.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nab<|im_end|>\n"
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = TOK.apply_chat_template(chat, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "add", "parameters": {}}}' in text
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        "<|im_end|>\n"
    )


def test_end_of_turn_is_im_end_and_newline():
    assert end_of_turn_ids(TOK) == [TOK.eos_token_id, *TOK.encode("\n")]


def test_loads_with_the_tokenizers_library_alone():
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(os.path.join(tiny_tokenizer_path(), "tokenizer.json"))
    assert raw.encode("What is 2 + 2?").ids == TOK.encode("What is 2 + 2?")


def test_offline_load_prints_nothing():
    code = "from atropos.testing.fake_engine import load_tokenizer; print(len(load_tokenizer()))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(TOK)) and out.stderr == ""


def test_the_script_rebuilds_the_shipped_files_exactly(tmp_path):
    written = load_script(ROOT / "scripts/make_tiny_tokenizer.py").build(tmp_path)
    for path in written:
        assert path.read_bytes() == (Path(tiny_tokenizer_path()) / path.name).read_bytes(), (
            path.name
        )


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_shipped_files_are_json(name):
    import json

    assert json.loads((Path(tiny_tokenizer_path()) / name).read_text())
