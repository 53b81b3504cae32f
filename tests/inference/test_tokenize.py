"""tokenize_for_trainer: upstream masking semantics, both apply_chat_template return types, and
dropping every kind of end-of-turn token on finish_reason "length"."""

from __future__ import annotations

from typing import Any

import pytest

from atropos.inference.tokenize import (
    as_token_ids,
    end_of_turn_ids,
    template_ids,
    tokenize_for_trainer,
    trailing_end_of_turn,
)
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
EOS = TOK.eos_token_id
NL = TOK.encode("\n")


class Wrapper:
    """A tokenizer whose `apply_chat_template(tokenize=True)` returns `kind`: list, dict or the
    real return value (a transformers 5 `BatchEncoding`)."""

    def __init__(self, kind: str, template: str | None = None) -> None:
        self.kind = kind
        self.tok = load_tokenizer()
        if template is not None:
            self.tok.chat_template = template

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def apply_chat_template(self, conversation: Any, tokenize: bool = True, **kw: Any) -> Any:
        if not tokenize or self.kind == "native":
            return self.tok.apply_chat_template(conversation, tokenize=tokenize, **kw)
        text = self.tok.apply_chat_template(conversation, tokenize=False, **kw)
        ids = self.tok.encode(text, add_special_tokens=False)
        return ids if self.kind == "list" else {"input_ids": ids, "attention_mask": [1] * len(ids)}


KINDS = ["list", "dict", "native"]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "The answer is 4."},
]
MULTI = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
]


def trained(out: dict[str, Any]) -> str:
    return TOK.decode([t for t in out["masks"] if t != -100])


def test_native_return_type_follows_the_transformers_version():
    # the regression upstream hit: transformers 5 returns a BatchEncoding, 4.x a list
    import transformers

    raw = TOK.apply_chat_template(CHAT, tokenize=True)
    assert isinstance(raw, list) == (int(transformers.__version__.split(".")[0]) < 5)
    text = TOK.apply_chat_template(CHAT, tokenize=False)
    assert as_token_ids(raw) == TOK.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("kind", KINDS)
def test_last_turn_only_is_trained(kind):
    out = tokenize_for_trainer(Wrapper(kind), CHAT)
    text = TOK.apply_chat_template(CHAT, tokenize=False)
    assert out["tokens"] == TOK.encode(text, add_special_tokens=False)
    assert len(out["masks"]) == len(out["tokens"])
    assert trained(out) == "The answer is 4.<|im_end|>\n"
    prefix = TOK.apply_chat_template(CHAT[:-1], tokenize=False, add_generation_prompt=True)
    n = len(TOK.encode(prefix, add_special_tokens=False))
    assert out["masks"][:n] == [-100] * n and out["masks"][n:] == out["tokens"][n:]
    assert out["token_source"] == "retokenized" and "messages" not in out


@pytest.mark.parametrize("kind", KINDS)
def test_all_assistant_turns(kind):
    out = tokenize_for_trainer(Wrapper(kind), MULTI, train_on_all_assistant_turns=True)
    assert trained(out) == "Hello there.<|im_end|>\n4<|im_end|>\n"
    last_only = tokenize_for_trainer(Wrapper(kind), MULTI)
    assert trained(last_only) == "4<|im_end|>\n"


@pytest.mark.parametrize("kind", KINDS)
def test_length_drops_im_end_and_its_newline(kind):
    out = tokenize_for_trainer(Wrapper(kind), CHAT, finish_reason="length")
    full = tokenize_for_trainer(Wrapper(kind), CHAT)
    assert out["tokens"] == full["tokens"][:-2] and out["masks"] == full["masks"][:-2]
    assert full["tokens"][-2:] == [EOS, *NL]
    assert trained(out) == "The answer is 4."


@pytest.mark.parametrize("kind", KINDS)
def test_all_turns_with_length_drops_only_the_final_end_of_turn(kind):
    out = tokenize_for_trainer(
        Wrapper(kind), MULTI, train_on_all_assistant_turns=True, finish_reason="length"
    )
    assert trained(out) == "Hello there.<|im_end|>\n4"


def test_stop_keeps_the_end_of_turn():
    out = tokenize_for_trainer(TOK, CHAT, finish_reason="stop")
    assert out["tokens"][-2:] == [EOS, *NL]


def test_include_messages():
    out = tokenize_for_trainer(TOK, CHAT, include_messages=True)
    assert out["messages"] == CHAT


def test_last_message_of_any_role_is_trained_from_its_turn_start():
    # upstream cut at the length of "...<|im_start|>assistant\n", one token into "tool\nok"
    chat = [*CHAT, {"role": "tool", "content": "ok"}]
    assert trained(tokenize_for_trainer(TOK, chat)) == "<|im_start|>tool\nok<|im_end|>\n"


def test_a_single_message_is_all_trained():
    out = tokenize_for_trainer(TOK, [{"role": "assistant", "content": "hi"}])
    assert out["masks"] == out["tokens"]


# --- end-of-turn detection on other template styles ------------------------------------------

EOS_AFTER = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_SPECIAL_SUFFIX = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_template_ending_in_eos_only():
    tok = Wrapper("native", EOS_AFTER)
    assert end_of_turn_ids(tok) == [EOS]
    out = tokenize_for_trainer(tok, CHAT, finish_reason="length")
    assert TOK.decode([t for t in out["masks"] if t != -100]) == "The answer is 4."


def test_template_without_special_suffix_drops_nothing_but_a_final_eos():
    tok = Wrapper("native", NO_SPECIAL_SUFFIX)
    assert end_of_turn_ids(tok) == []
    out = tokenize_for_trainer(tok, CHAT, finish_reason="length")
    assert out["tokens"] == tokenize_for_trainer(tok, CHAT)["tokens"]  # "\n\n" is content
    assert trailing_end_of_turn([5, 6, EOS], tok) == 1


def test_trailing_end_of_turn_matches_partial_suffixes():
    assert trailing_end_of_turn([5, EOS, *NL], TOK) == 2
    assert trailing_end_of_turn([5, EOS], TOK) == 1
    assert trailing_end_of_turn([5, *NL], TOK) == 0  # a bare newline is content
    assert trailing_end_of_turn([], TOK) == 0


# --- helpers ----------------------------------------------------------------------------------


def test_as_token_ids_shapes():
    assert as_token_ids([1, 2]) == [1, 2]
    assert as_token_ids([[1, 2]]) == [1, 2]
    assert as_token_ids({"input_ids": [[3]]}) == [3]
    assert as_token_ids([]) == []

    class Tensor:
        def tolist(self):
            return [[7, 8]]

    assert as_token_ids(Tensor()) == [7, 8]
    with pytest.raises(TypeError, match="batch of 2"):
        as_token_ids([[1], [2]])
    with pytest.raises(TypeError, match="input_ids"):
        as_token_ids({"ids": [1]})
    with pytest.raises(TypeError):
        as_token_ids("abc")
    with pytest.raises(TypeError):
        as_token_ids([1.5])


@pytest.mark.parametrize("kind", KINDS)
def test_template_ids_matches_text_rendering(kind):
    ids = template_ids(Wrapper(kind), CHAT, add_generation_prompt=True)
    text = TOK.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert ids == TOK.encode(text, add_special_tokens=False)
