"""`HeldTexts`: a continued chat gives the ids and drift a full tokenization gives, whether the
completion's text is taken as answered (canonical ids), decoded (another tokenization), or
neither matches (a special token inside the completion)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atropos.inference.managed import ManagedServer
from atropos.inference.sequence import DriftKind
from atropos.inference.tokenizer import TokenCodec, load_tokenizer

TOK = load_tokenizer("tiny")
EOS = TOK.eos_token_id
USER = [{"role": "user", "content": "What is 2 + 2?"}]


class Scripted:
    """An in-memory server answering fixed output ids, recording the ids it was sent."""

    def __init__(self, *outs: list[int]) -> None:
        self.outs = list(outs)
        self.sent: list[list[int]] = []

    async def tokens_and_logprobs_completion(self, *, input_ids: list[int], n: int = 1, **kw: Any):
        self.sent.append(list(input_ids))
        out = self.outs.pop(0)
        return input_ids, [out] * n, [[-0.5] * len(out)] * n, ["stop"] * n


def converse(out: list[int], held: bool) -> tuple[ManagedServer, Scripted]:
    """Two calls: the answer `out`, then a user turn after it; `held=False` tokenizes the
    second prompt whole (no added tokens known: `HeldTexts` notes nothing)."""
    server = Scripted(out, TOK.encode("bye", add_special_tokens=False) + [EOS])
    m = ManagedServer(server, TOK)
    if not held:
        m._held._added = {}
    first = asyncio.run(m.chat_turn(messages=USER))
    convo = [*USER, {"role": "assistant", "content": first.contents[0]}]
    asyncio.run(m.chat_turn(messages=[*convo, {"role": "user", "content": "x"}]))
    return m, server


@pytest.mark.parametrize(
    ("answer", "drift", "answered"),
    [
        (TOK.encode("It is 4.", add_special_tokens=False), DriftKind.CLEAN, list),
        ([TOK.convert_tokens_to_ids(c) for c in "hello"], DriftKind.REALIGN, str),
        (  # a special token inside: the answer's text skips it, the held ids do not
            TOK.encode("a<|im_start|>b", add_special_tokens=False),
            DriftKind.FORK,
            str,
        ),
    ],
)
def test_a_continued_chat_gives_the_full_tokenizations_ids(
    answer: list[int], drift: DriftKind, answered: type
) -> None:
    out = [*answer, EOS]
    held, sent = converse(out, held=True)
    whole, expected = converse(out, held=False)
    assert sent.sent == expected.sent
    assert held.drift_counts == whole.drift_counts and held.drift_counts[drift] == 1
    # which way the held path took: the answered text (canonical, no decode), else a decode
    m = ManagedServer(Scripted(out), TOK)
    first = asyncio.run(m.chat_turn(messages=USER))
    convo = [*USER, {"role": "assistant", "content": first.contents[0]}]
    text = m.render_whole([*convo, {"role": "user", "content": "x"}], None, {})
    node = first.nodes[0]
    found = m._held._answered(node, text, m._held._held[id(node)], TokenCodec.of(TOK))
    assert isinstance(found, answered)
