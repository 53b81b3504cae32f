"""`bytelevel.ByteTable`: a byte-level tokenizer's ids decoded by a table give the Rust
decoder's texts exactly (broken UTF-8, special and added tokens included), and it stands aside
where it would not."""

from __future__ import annotations

import itertools
import random

import pytest
from tokenizers import Tokenizer, decoders, models

from atropos.inference.bytelevel import ByteTable, _char_bytes
from atropos.inference.tokenizer import TokenCodec, load_tokenizer
from atropos.testing.bpe import SHAPES, trained

TOK = load_tokenizer("tiny")
BACKEND = TOK.backend_tokenizer


def rust(row: list[int]) -> str:
    return str(BACKEND.decode(row, skip_special_tokens=True))


def test_every_pair_of_bytes_and_random_rows_decode_as_the_rust_decoder():
    table = ByteTable.of(BACKEND)
    assert table is not None
    singles = [BACKEND.token_to_id(c) for c in _char_bytes()]
    assert None not in singles and len(singles) == 256
    for pair in itertools.product(singles, repeat=2):  # every two-byte sequence, valid or not
        row = list(pair)
        assert table.decode(row) == rust(row), row
    size = BACKEND.get_vocab_size(with_added_tokens=True)
    rng = random.Random(7)
    for _ in range(3000):  # specials, added tokens, multi-byte tokens, cut characters
        row = [rng.randrange(size) for _ in range(rng.randrange(0, 40))]
        assert table.decode(row) == rust(row), row
    text = "Hello <think>漢字</think> é<|im_end|>\n\t x"
    row = BACKEND.encode(text, add_special_tokens=False).ids
    assert table.decode(row) == rust(row) == text.replace("<|im_end|>", "")


@pytest.mark.parametrize("shape", SHAPES)
def test_tokenizers_of_gpt2s_and_llama3s_shape_decode_as_their_rust_decoder(shape):
    """Trained here (no model's tokenizer can be downloaded): 2,000 ids of merged bytes, and
    the special tokens, each shape of pre-tokenizer."""
    tok = trained(shape)
    table = ByteTable.of(tok)
    assert table is not None
    size = tok.get_vocab_size(with_added_tokens=True)
    rng = random.Random(11)
    for _ in range(3000):
        row = [rng.randrange(size) for _ in range(rng.randrange(0, 40))]
        assert table.decode(row) == tok.decode(row, skip_special_tokens=True), row
    text = "def f(x):\n    return x  # <|im_end|> naïve 漢字 🙂"
    row = tok.encode(text, add_special_tokens=False).ids
    assert table.decode(row) == tok.decode(row, skip_special_tokens=True)
    assert table.decode(row) == text.replace("<|im_end|>", "")


def test_rows_the_table_cannot_read_go_to_the_rust_decoder():
    table = ByteTable.of(BACKEND)
    assert table is not None
    size = BACKEND.get_vocab_size(with_added_tokens=True)
    assert table.decode([5, size + 10]) is None and table.decode([-1]) is None
    assert table.decode([5, -2]) is None and table.decode([]) == ""
    codec = TokenCodec.of(TOK)
    rows = [[5, 6], [5, size + 10], [7]]
    assert codec.decode_all(rows) == [rust(r) for r in rows]  # the id past the vocab skipped
    assert codec.decode([5, size + 10]) == rust([5, size + 10])
    assert codec.decode([1, 5, 2], skip_special_tokens=False) == BACKEND.decode([1, 5, 2], False)


def test_other_decoders_get_no_table():
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    assert ByteTable.of(tok) is None  # no decoder: Rust joins tokens with spaces
    tok.decoder = decoders.Metaspace()
    assert ByteTable.of(tok) is None
    tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    assert ByteTable.of(tok) is None
    assert ByteTable.of(object()) is None
