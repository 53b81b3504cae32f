"""Decoding a byte-level BPE tokenizer's ids by a table of each id's bytes.

A byte-level tokenizer (GPT-2's scheme: Qwen, Llama 3, the shipped tiny one) spells every byte
as one printable character; its Rust `decode(ids, skip_special_tokens=True)` looks up each id's
token, drops special tokens, maps each token's characters back to bytes (a token with a
character outside the byte alphabet, such as an added token's plain text, gives its UTF-8 bytes
instead), joins the bytes and reads them as UTF-8 with every invalid sequence replaced by U+FFFD
(`String::from_utf8_lossy`). `ByteTable` does the same with the bytes of every id worked out
once: a row is one join of table entries and one `bytes.decode("utf-8", "replace")`, which
replaces invalid sequences the same way (the Unicode "maximal subpart" practice, both sides). About
2-3x faster than the Rust call for a group's rows (a completion of 256 ids: ~20 us against ~7).

Used only where it is exact: the backend's decoder is `ByteLevel` itself (no `Sequence`, no
`Metaspace`), and every added token and a probe of byte sequences decode the same both ways
(`ByteTable.of` returns None otherwise). A row it cannot read (an id past the table, a
negative id) is decoded by the Rust call, which says what it says for it.
"""

from __future__ import annotations

import functools
from operator import itemgetter
from typing import Any


@functools.cache
def _char_bytes() -> dict[str, int]:
    """GPT-2's byte alphabet reversed: each character a byte is spelt as, to that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@functools.cache
def ascii_spelling() -> dict[int, str]:
    """A `str.translate` table spelling ASCII text in the byte alphabet (an ASCII character
    is its one UTF-8 byte): `" x\\n"` -> `"\\u0120x\\u010a"`."""
    return {b: c for c, b in _char_bytes().items() if b < 128}


class ByteTable:
    """The bytes of every id of one byte-level tokenizer (special tokens empty)."""

    def __init__(self, entries: tuple[bytes, ...]) -> None:
        self.entries = entries

    @classmethod
    def of(cls, backend: Any) -> ByteTable | None:
        """The table of a Rust `tokenizers.Tokenizer`, or None where it would not be exact."""
        try:
            from tokenizers import decoders

            if type(backend.decoder) is not decoders.ByteLevel:
                return None
            vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
            added = backend.get_added_tokens_decoder()
        except (ImportError, AttributeError, TypeError):
            return None
        special = {t.content for t in added.values() if t.special}
        alphabet = _char_bytes()

        def spell(token: str) -> bytes:
            if token in special:
                return b""
            try:
                return bytes([alphabet[c] for c in token])
            except KeyError:
                return token.encode()

        size = max([*vocab.values(), *added, -1]) + 1
        entries = [b""] * size  # an id with no token is skipped, as Rust skips it
        for token, i in vocab.items():
            entries[i] = spell(token)
        for i in set(range(size)).difference(vocab.values()):
            token = backend.id_to_token(i)
            entries[i] = spell(token) if token is not None else b""
        for i, added_token in added.items():  # an added token's text wins over the model's
            entries[i] = spell(added_token.content)
        table = cls(tuple(entries))
        return table if table._agrees(backend, list(added)) else None

    def _agrees(self, backend: Any, added: list[int]) -> bool:
        """Added tokens, and byte sequences cut mid-character, decode the same both ways."""
        singles = [i for i in (backend.token_to_id(c) for c in _char_bytes()) if i is not None]
        probes = [[i] for i in added] + [singles[k : k + 3] for k in range(0, len(singles), 3)]
        probes.append(singles[::-1])
        return all(self.decode(p) == backend.decode(p, skip_special_tokens=True) for p in probes)

    def decode(self, row: list[int]) -> str | None:
        """The text of `row`, special tokens skipped; None when the table cannot read it."""
        n = len(row)
        try:
            if n > 1:
                if min(row) < 0:
                    return None
                data = b"".join(itemgetter(*row)(self.entries))
            elif n:
                if row[0] < 0:
                    return None
                data = self.entries[row[0]]
            else:
                return ""
        except (IndexError, TypeError):
            return None
        return data.decode("utf-8", "replace")
