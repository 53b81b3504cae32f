"""`TokenCodec`: the direct Rust calls and the piece cache give the tokenizer's own answers."""

from __future__ import annotations

import copy
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from atropos.inference.tokenizer import TokenCodec, load_tokenizer

TOK = load_tokenizer("tiny")
ADDED = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"]
PARTS = st.sampled_from(
    [
        *ADDED,
        "<|im_",
        "_end|>",
        "<",
        ">",
        "|",
        "user",
        "\n",
        " ",
        "  ",
        "\t",
        "é",
        "漢字",
        "a1",
        "?!",
    ]
)


def test_the_shipped_tokenizer_gets_the_fast_paths():
    codec = TokenCodec.of(TOK)
    assert codec.direct and codec.pieces
    assert TokenCodec.of(TOK) is codec  # one per tokenizer


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(PARTS, st.text(max_size=8)), max_size=12))
def test_encode_and_decode_match_the_tokenizer(parts):
    text = "".join(parts)
    codec = TokenCodec.of(TOK)
    ids = TOK.encode(text, add_special_tokens=False)
    assert codec.encode(text) == ids
    assert codec.encode(text) == ids  # again, from the piece cache
    assert codec.decode(ids) == TOK.decode(ids, skip_special_tokens=True)


def test_rendered_chat_templates_match_and_reuse_their_pieces():
    codec = TokenCodec.of(TOK)
    rng = random.Random(0)
    for i in range(300):
        chat = [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": f"Question {i}: what comes after {rng.randrange(99)}?"},
        ]
        text = TOK.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert codec.encode(text) == TOK.encode(text, add_special_tokens=False)
    assert "system\nAnswer with one word." in codec._pieces  # kept: used on every call
    assert len(codec._pieces) <= TokenCodec.PIECES


def test_tokenizers_where_shortcuts_would_differ_use_their_own_methods():
    cleaning = copy.deepcopy(TOK)
    cleaning.clean_up_tokenization_spaces = True  # decode would change the text: no direct path
    assert not TokenCodec(cleaning).direct

    class Custom(type(TOK)):  # a class with its own decode
        def decode(self, *args, **kwargs):  # type: ignore[override]
            return "custom"

    custom = copy.deepcopy(TOK)
    custom.__class__ = Custom
    codec = TokenCodec(custom)
    assert not codec.direct and codec.decode([5, 6]) == "custom"

    class NotHF:
        def encode(self, text, add_special_tokens=False):
            return [len(text)]

        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    plain = TokenCodec(NotHF())
    assert not plain.direct and plain.encode("abc") == [3] and plain.decode([1, 2]) == "xx"


def test_pieces_are_off_for_added_tokens_that_strip_whitespace(tmp_path):
    stripping = copy.deepcopy(TOK)
    backend = stripping.backend_tokenizer
    from tokenizers import AddedToken

    backend.add_special_tokens([AddedToken("<strip>", lstrip=True, rstrip=True)])
    codec = TokenCodec(stripping)
    assert not codec.pieces
    text = "a <strip> b"
    assert codec.encode(text) == backend.encode(text, add_special_tokens=False).ids
