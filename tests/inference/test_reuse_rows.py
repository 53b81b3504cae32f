"""A continued conversation without copies of it: `ManagedServer(reuse_rows=True)` and
`build_nodes(take_parent=True)` (the new node takes the replaced node's rows, and the nodes are
the same), and `prompt_json` (a call's ids spelt from the JSON the call before sent)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from atropos.inference.managed import ManagedServer
from atropos.inference.prompt_json import PROMPT_JSON, PromptJSON, ids_json
from atropos.inference.sequence import DriftKind, build_node, build_nodes
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
END = TOK.convert_tokens_to_ids("<|im_end|>")


class Scripted:
    """A token server answering "reply <k>" + <|im_end|> (canonical ids), the k-th call's; a
    call waits for `gate` when one is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def tokens_and_logprobs_completion(
        self, *, input_ids: list[int], n: int = 1, **kw: Any
    ) -> Any:
        self.calls += 1
        k = self.calls
        if self.gate is not None:
            await self.gate.wait()
        outs = [TOK.encode(f"reply {k}.{i}", add_special_tokens=False) + [END] for i in range(n)]
        lps = [[-0.25 * (j + 1) for j in range(len(out))] for out in outs]
        return input_ids, outs, lps, ["stop"] * n


LISTS: list[list[tuple[int, ...]]] = []  # per turn of `converse`, per node: its rows' ids


async def converse(managed: ManagedServer, turns: int, n: int = 1) -> list[Any]:
    """`turns` chat turns of one conversation (the first choice continued); each turn as
    returned (and the identities of its nodes' rows then, in `LISTS`)."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "begin " * 50}]
    seen = []
    LISTS.clear()
    for t in range(turns):
        turn = await managed.chat_turn(messages=msgs, n=n, max_tokens=8)
        seen.append(turn)
        LISTS.append([tuple(map(id, rows(node))) for node in turn.nodes])
        msgs = [*msgs, {"role": "assistant", "content": turn.contents[0]}]
        msgs.append({"role": "user", "content": f"step {t}"})
    return seen


def rows(node: Any) -> tuple[list[int], list[int], list[Any]]:
    return node.tokens, node.masked_tokens, node.logprobs


@pytest.mark.parametrize("n", [1, 3])
def test_a_conversation_gives_the_same_nodes_with_rows_reused_and_empties_the_replaced(n):
    kept, reused = ManagedServer(Scripted(), TOK), ManagedServer(Scripted(), TOK, reuse_rows=True)
    plain = asyncio.run(converse(kept, 6, n))
    taking = asyncio.run(converse(reused, 6, n))
    assert [x.to_dict() for x in reused.nodes] == [x.to_dict() for x in kept.nodes]
    assert reused.drift_counts == kept.drift_counts and kept.drift_counts[DriftKind.CLEAN] == 5
    for before, now in zip(plain, taking, strict=True):
        assert now.prompt_tokens == before.prompt_tokens and now.contents == before.contents
    for t in range(1, 6):  # each turn continued the last turn's first node...
        assert taking[t].extended is taking[t - 1].nodes[0]
        assert plain[t].extended is plain[t - 1].nodes[0]
        # ...which, reused, gave its rows (the same lists) to the turn's last node
        assert rows(taking[t - 1].nodes[0]) == ([], [], [])
        assert LISTS[t][-1] == LISTS[t - 1][0]
    # kept: every earlier node stays as it was returned
    assert len(plain[0].nodes[0].tokens) < len(plain[1].nodes[0].tokens)
    assert plain[0].nodes[0].tokens == plain[1].nodes[0].tokens[: len(plain[0].nodes[0].tokens)]
    every = [r for x in reused.nodes for r in rows(x)]
    assert len({id(r) for r in every}) == len(every)  # no two held nodes share a row


def test_taking_the_parent_gives_what_copying_gives_choice_by_choice():
    """`build_nodes(take_parent=True)`: the same nodes as with copies (end of turn and
    inserted ids too), the last node holding the parent's own lists, the prompt untouched."""

    def parent() -> Any:
        return build_node(
            prompt_tokens=[1, 2, 3], output=[4, 5], output_logprobs=[-0.1, -0.2],
            finish_reason="stop", parent=None, policy_version=3,
        )  # fmt: skip

    outs = [[8, 9, 10], [11], [12, 13]]
    lps = [[-0.3, -0.4, -0.5], [-0.6], [-0.7, -0.8]]
    for eots, spliced in (([1, 0, 0], [None, None, None]), (None, [None, None, (0, 1)])):
        made = []
        for take in (False, True):
            held = parent()
            lists = rows(held)
            prompt = [*held.tokens, 6, 7]
            group = build_nodes(
                prompt_tokens=prompt, outputs=outs, output_logprobs=lps,
                finish_reasons=["length", "stop", "stop"], full_texts=["a", "b", "c"],
                parent=held, prefixed=True, end_of_turn=eots, policy_version=5,
                unlearned=spliced, take_parent=take,
            )  # fmt: skip
            assert prompt == [1, 2, 3, 4, 5, 6, 7]
            made.append([x.to_dict() for x in group])
            if take:
                assert rows(held) == ([], [], [])
                assert group[-1].tokens is lists[0]  # taken, not copied
                if spliced[-1] is None:  # (an inserted id makes the rows anew)
                    assert group[-1].masked_tokens is lists[1]
            every = [r for x in group for r in rows(x)]
            assert len({id(r) for r in every}) == len(every)
        assert made[0] == made[1]


def test_a_prompt_that_is_the_parents_own_list_is_left_as_it_is():
    held = build_node(
        prompt_tokens=[1, 2], output=[3], output_logprobs=[-0.5], finish_reason="stop",
        parent=None,
    )  # fmt: skip
    prompt = held.tokens
    (node,) = build_nodes(
        prompt_tokens=prompt, outputs=[[4]], output_logprobs=[[-0.1]], finish_reasons=["stop"],
        full_texts=[""], parent=held, prefixed=True, take_parent=True,
    )  # fmt: skip
    assert prompt == [1, 2, 3] and node.tokens == [1, 2, 3, 4] and node.tokens is not prompt
    assert node.masked_tokens == [-100, -100, 3, 4]


def test_two_calls_continuing_one_node_at_once_copy_its_rows():
    """Reuse is skipped while another call continues the same node: both get whole rows, and
    the node stays as it was until both are done."""
    server = Scripted()
    managed = ManagedServer(server, TOK, reuse_rows=True)

    async def main() -> tuple[Any, Any, Any, tuple[Any, ...]]:
        (first,) = await converse(managed, 1)
        parent = first.nodes[0]
        before = tuple(list(r) for r in rows(parent))
        msgs = [
            {"role": "user", "content": "begin " * 50},
            {"role": "assistant", "content": first.contents[0]},
        ]
        server.gate = asyncio.Event()
        a = asyncio.ensure_future(
            managed.chat_turn(messages=[*msgs, {"role": "user", "content": "a"}], max_tokens=8)
        )
        b = asyncio.ensure_future(
            managed.chat_turn(messages=[*msgs, {"role": "user", "content": "b"}], max_tokens=8)
        )
        await asyncio.sleep(0.01)
        server.gate.set()
        return parent, await a, await b, before

    parent, a, b, before = asyncio.run(main())
    assert a.extended is parent and b.extended is parent
    assert rows(parent) == before  # neither took it: the other was continuing it
    for turn in (a, b):
        node = turn.nodes[0]
        assert node.tokens[: len(before[0])] == before[0]
        assert node.masked_tokens[: len(before[1])] == before[1]
    assert [x.tokens for x in managed.nodes] == [a.nodes[0].tokens, b.nodes[0].tokens]


def test_a_turn_not_held_leaves_the_parent_its_rows():
    managed = ManagedServer(Scripted(), TOK, reuse_rows=True)
    (first,) = asyncio.run(converse(managed, 1))
    parent = first.nodes[0]
    msgs = [
        {"role": "user", "content": "begin " * 50},
        {"role": "assistant", "content": first.contents[0]},
        {"role": "user", "content": "again"},
    ]
    turn = asyncio.run(managed.chat_turn(messages=msgs, max_tokens=8, hold=False))
    assert turn.extended is parent and managed.nodes == [parent]
    assert parent.tokens and turn.nodes[0].tokens[: len(parent.tokens)] == parent.tokens


class Spelling(Scripted):
    """`Scripted`, sending its ids as a token backend does (`ids_json`), and recording each
    call's JSON, whether it was made from a prefix, and the ids' own encoding."""

    def __init__(self, answers: list[list[int]] | None = None) -> None:
        super().__init__()
        self.sent: list[tuple[bytes, bool, bytes]] = []
        self.answers = answers

    async def tokens_and_logprobs_completion(
        self, *, input_ids: list[int], n: int = 1, **kw: Any
    ) -> Any:
        known = PROMPT_JSON.get()
        spelt = ids_json(input_ids)
        assert ids_json(input_ids) is spelt  # (a retry sends the same bytes)
        prefixed = known is not None and known.ids is input_ids and known.prefix is not None
        self.sent.append((spelt, prefixed, msgspec.json.encode(input_ids)))
        if self.answers is None:
            return await super().tokens_and_logprobs_completion(input_ids=input_ids, n=n, **kw)
        out = self.answers[len(self.sent) % len(self.answers)] + [END]
        return input_ids, [out] * n, [[-0.5] * len(out)] * n, ["stop"] * n


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("canonical", [True, False])
def test_a_continued_calls_ids_are_spelt_from_the_last_calls_json(reuse, canonical):
    """Every call's JSON is its ids' own encoding; from the second turn on it is made from the
    JSON the turn before sent (canonical answers, and answers of ids the tokenizer would not
    make: then the prompt's ids still open with the held ones)."""
    spelt = [TOK.convert_tokens_to_ids(c) for c in "hello"]  # (one token, canonically)
    assert spelt != TOK.encode("hello", add_special_tokens=False)
    answers = None if canonical else [spelt]
    server = Spelling(answers)
    managed = ManagedServer(server, TOK, reuse_rows=reuse)
    asyncio.run(converse(managed, 5, 2))
    assert [spelt == own for spelt, _, own in server.sent] == [True] * 5
    assert [prefixed for _, prefixed, _ in server.sent] == [False] + [True] * 4
    if not canonical:
        assert managed.drift_counts[DriftKind.REALIGN] > 0


def test_ids_json_spells_from_a_prefix_only_for_the_list_it_names():
    ids = list(range(300, 320))
    whole = msgspec.json.encode(ids)
    assert ids_json(ids) == whole  # no call in progress
    for count in (1, 7, 20):
        known = PromptJSON(ids, msgspec.json.encode(ids[:count]), count)
        scope = PROMPT_JSON.set(known)
        try:
            assert ids_json(list(ids)) == whole and known.json is None  # another list
            assert ids_json(ids) == whole and known.json == whole
        finally:
            PROMPT_JSON.reset(scope)
    longer = PromptJSON(ids[:3], msgspec.json.encode(ids[:5]), 5)  # (never made so)
    scope = PROMPT_JSON.set(longer)
    try:
        assert ids_json(longer.ids) == msgspec.json.encode(ids[:3])
    finally:
        PROMPT_JSON.reset(scope)
