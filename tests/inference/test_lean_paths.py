"""The cheap paths agree with the general ones: `ManagedServer.chat_turn` with `chat_completion`,
the typed `/generate` reading with the general one, the fake server's kept answers with fresh
ones; and servers' `policy_version` reaches calls and sequence nodes."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import msgspec
import pytest

from atropos.inference.base import PolicyVersions
from atropos.inference.config import APIServerConfig
from atropos.inference.managed import ManagedServer
from atropos.inference.openai import OpenAIBackend
from atropos.inference.sequence import build_node, build_nodes
from atropos.inference.vllm import VLLMBackend
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
CHAT = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "What is 2 + 2?"},
]


def vllm(url: str, **kw: Any) -> VLLMBackend:
    config = APIServerConfig(base_url=url, server_type="vllm", model_name="m", **kw)
    return VLLMBackend(config, tokenizer=TOK)


def test_chat_turn_and_chat_completion_give_the_same_completions_and_nodes():
    with FakeInferenceServer() as fake:

        async def main() -> tuple[Any, Any, list[Any], list[Any]]:
            backend = vllm(fake.base_url, vllm_token_api="generate")
            try:
                a, b = ManagedServer(backend, TOK), ManagedServer(backend, TOK)
                reply = await a.chat_completion(messages=CHAT, n=3, max_tokens=6, seed=1)
                turn = await b.chat_turn(messages=CHAT, n=3, max_tokens=6, seed=1)
                return reply, turn, a.nodes, b.nodes
            finally:
                await backend.aclose()

        reply, turn, nodes_a, nodes_b = asyncio.run(main())
    assert [c.message.content for c in reply.choices] == turn.contents
    assert [c.finish_reason for c in reply.choices] == turn.finish_reasons
    assert [n.to_dict() for n in nodes_a] == [n.to_dict() for n in nodes_b]
    assert turn.nodes == nodes_b
    assert nodes_b[0].tokens[: len(turn.prompt_tokens)] == turn.prompt_tokens
    assert reply.usage is not None
    assert reply.usage.completion_tokens == turn.completion_tokens
    assert reply.usage.prompt_tokens == len(turn.prompt_tokens)


def test_the_typed_generate_reading_and_the_general_one_agree():
    """The same answer read through the typed fast path and through the general reading."""
    with FakeInferenceServer() as fake:
        ids = TOK.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)
        body = {"prompt": {"prompt_token_ids": ids}, "logprobs": 0, "n": 4, "max_tokens": 7}
        raw = httpx.post(fake.url + "/generate", json=body).content
        backend = vllm(fake.base_url, vllm_token_api="generate")
        general = backend._read_generate(msgspec.json.decode(raw))
        from atropos.inference.vllm import _GENERATE_DECODER, _sampled

        typed = _GENERATE_DECODER.decode(raw)
        assert _sampled(typed.logprobs) == (general[0], general[1])
        assert typed.finish_reasons == general[2]

        # a server that spells positions as bare objects and logprobs as {"logprob": x}
        odd = msgspec.json.decode(raw)
        odd["logprobs"] = [
            [{k: {"logprob": v} for k, v in pos[0].items()} for pos in seq]
            for seq in odd["logprobs"]
        ]

        assert backend._generated(list(ids), 4, odd)[1:3] == (general[0], general[1])


def test_the_typed_generate_reading_takes_each_positions_first_entry_untracked():
    """Alternatives after the sampled entry are skipped; positions are not GC-tracked."""
    import gc

    from atropos.inference.vllm import _GENERATE_DECODER, _sampled

    raw = b'{"logprobs": [[[{"5": -0.1}, {"9": -2.0}], [{"7": -0.5}]], [[{"3": -1.5}]]]}'
    typed = _GENERATE_DECODER.decode(raw)
    assert _sampled(typed.logprobs) == ([[5, 7], [3]], [[-0.1, -0.5], [-1.5]])
    assert not gc.is_tracked(typed.logprobs[0][0])
    with pytest.raises(msgspec.ValidationError):  # an empty position: the general path's
        _GENERATE_DECODER.decode(b'{"logprobs": [[[]]]}')
    with pytest.raises(ValueError, match="without a sampled token"):
        _sampled(_GENERATE_DECODER.decode(b'{"logprobs": [[[{}]]]}').logprobs)


def test_kept_answers_are_the_fresh_answers_and_still_wait_and_count():
    with FakeInferenceServer(latency=0.05) as fake:
        ids = TOK.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)
        body = {"prompt": {"prompt_token_ids": ids}, "logprobs": 0, "n": 3, "max_tokens": 9}
        with httpx.Client() as client:
            first = client.post(fake.url + "/generate", json=body)
            tokens = fake.tokens_generated
            again = client.post(fake.url + "/generate", json=body)
            other = client.post(fake.url + "/generate", json={**body, "max_tokens": 4})
        assert first.status_code == again.status_code == 200
        assert first.content == again.content and other.content != first.content
        assert first.headers["content-type"] == "application/json"
        assert again.elapsed.total_seconds() >= 0.05  # the latency still applies
        assert fake.tokens_generated > 2 * tokens - 1 and fake.requests["/generate"] == 3
        assert fake.prompt_tokens == 3 * len(ids)


def test_versions_reach_calls_replies_and_nodes():
    versions = itertools.count(3)
    with FakeInferenceServer(policy_version=lambda: next(versions)) as fake:

        async def main() -> dict[str, Any]:
            chat = OpenAIBackend(APIServerConfig(base_url=fake.base_url, model_name="m"))
            tokens = vllm(fake.base_url)  # /v1/completions with token ids
            try:
                with PolicyVersions() as seen_chat:
                    reply = await chat.chat_completion(messages=CHAT, n=2, max_tokens=4)
                managed = ManagedServer(tokens, TOK)
                with PolicyVersions() as seen_first:
                    first = await managed.chat_turn(messages=CHAT, max_tokens=4)
                conversation = [
                    *CHAT,
                    {"role": "assistant", "content": first.contents[0]},
                    {"role": "user", "content": "And 3 + 3?"},
                ]
                second = await managed.chat_turn(messages=conversation, max_tokens=4)
                return {
                    "chat": seen_chat.lowest,
                    "reply": getattr(reply, "policy_version", None),
                    "first": (seen_first.lowest, first.policy_version),
                    "second": second.policy_version,
                    "nodes": [n.policy_version for n in managed.nodes],
                }
            finally:
                await chat.aclose()
                await tokens.aclose()

        got = asyncio.run(main())
    assert got["chat"] == got["reply"] == 3
    assert got["first"] == (4, 4)
    assert got["second"] == 5
    assert got["nodes"] == [4]  # the second turn extends the first: its oldest tokens are v4


def test_a_groups_nodes_are_each_choices_node_and_share_no_rows():
    """`build_nodes` (one prompt's choices at once) gives what `build_node` gives per choice,
    end-of-turn and inserted ids included, and no two nodes share a row."""
    parent = build_node(
        prompt_tokens=[1, 2, 3], output=[4, 5], output_logprobs=[-0.1, -0.2],
        finish_reason="stop", parent=None, policy_version=3,
    )  # fmt: skip
    prompt = [*parent.tokens, 6, 7]
    outs = [[8, 9, 10], [11], [12, 13]]
    lps = [[-0.3, -0.4, -0.5], (-0.6,), [-0.7, -0.8]]
    eots, spliced = [1, 0, 0], [None, None, (0, 1)]
    for prefixed in (False, True):
        group = build_nodes(
            prompt_tokens=prompt, outputs=outs, output_logprobs=lps,
            finish_reasons=["length", "stop", "stop"], full_texts=["a", "b", "c"],
            parent=parent, prefixed=prefixed, end_of_turn=eots, policy_version=5,
            unlearned=spliced,
        )  # fmt: skip
        one_by_one = [
            build_node(
                prompt_tokens=prompt,
                output=outs[i],
                output_logprobs=lps[i],
                finish_reason=["length", "stop", "stop"][i],
                parent=parent,
                end_of_turn=eots[i],
                full_text="abc"[i],
                policy_version=5,
                unlearned=spliced[i],
            )  # fmt: skip
            for i in range(3)
        ]
        assert group == one_by_one
        assert group[0].masked_tokens == [-100] * 3 + [4, 5] + [-100] * 2 + [8, 9, -100]
        assert group[2].logprobs[-2:] == [1, -0.8] and group[0].policy_version == 3
        rows = [id(r) for n in [parent, *group] for r in (n.tokens, n.masked_tokens, n.logprobs)]
        assert len(set(rows)) == len(rows)
    fork = build_nodes(
        prompt_tokens=[1, 9], outputs=[[2]], output_logprobs=[[-1.0]], finish_reasons=["stop"],
        full_texts=[""], parent=parent,
    )  # fmt: skip
    assert fork[0].masked_tokens == [-100, -100, 2] and fork[0].policy_version is None


def test_built_nodes_hold_every_field_the_constructor_makes():
    """`build_nodes` fills a node's `__dict__` without `__init__` (a hot path): it must hold
    exactly `SequenceNode`'s fields, as the constructor would, so a field added to the class
    and not to `build_nodes` fails here rather than as an AttributeError in a reader."""
    import dataclasses

    from atropos.inference.sequence import SequenceNode

    node = build_node(
        prompt_tokens=[1, 2], output=[3], output_logprobs=[-0.5], finish_reason="stop",
        full_text="t", parent=None, policy_version=2,
    )  # fmt: skip
    made = SequenceNode(
        [1, 2, 3], [-100, -100, 3], [1.0, 1.0, -0.5], finish_reason="stop", full_text="t",
        policy_version=2,
    )  # fmt: skip
    assert set(vars(node)) == {f.name for f in dataclasses.fields(SequenceNode)}
    assert vars(node) == vars(made)


def test_a_continued_groups_nodes_keep_the_parents_rows_and_share_none():
    """n=4 continuing a held conversation: each node starts with the parent's rows, owns its
    own lists, and the parent's lists are left as they were."""
    with FakeInferenceServer() as fake:

        async def main() -> tuple[Any, list[Any]]:
            backend = vllm(fake.base_url, vllm_token_api="generate")
            try:
                managed = ManagedServer(backend, TOK)
                first = await managed.chat_turn(messages=CHAT, max_tokens=6, seed=1)
                parent = first.nodes[0]
                rows = (list(parent.tokens), list(parent.masked_tokens), list(parent.logprobs))
                msgs = [*CHAT, {"role": "assistant", "content": first.contents[0]}]
                msgs.append({"role": "user", "content": "And 3 + 3?"})
                turn = await managed.chat_turn(messages=msgs, n=4, max_tokens=6, seed=2)
                assert (parent.tokens, parent.masked_tokens, parent.logprobs) == rows
                return parent, turn.nodes
            finally:
                await backend.aclose()

        parent, nodes = asyncio.run(main())
    held = len(parent.tokens)
    for node in nodes:
        assert node.tokens[:held] == parent.tokens
        assert node.masked_tokens[:held] == parent.masked_tokens
        assert node.logprobs[:held] == parent.logprobs
        assert node.metadata == {"finish_reason": node.finish_reason}
    rows = [id(r) for n in [parent, *nodes] for r in (n.tokens, n.masked_tokens, n.logprobs)]
    assert len(set(rows)) == len(rows)


def test_echoed_prompt_ids_are_the_ids_sent_unless_spelt_otherwise():
    """A `/completions` answer's `prompt_token_ids` equal to the ids sent gives those ids (no
    list read); one spelt otherwise, or other ids, is read from the answer."""
    with FakeInferenceServer() as fake:
        backend = vllm(fake.base_url, vllm_token_api="completions")
        ids = TOK.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)

        async def main() -> Any:
            try:
                return await backend.tokens_and_logprobs_completion(
                    input_ids=ids, n=2, max_tokens=3
                )
            finally:
                await backend.aclose()

        prompt, outputs, _, _ = asyncio.run(main())
    assert prompt is ids and len(outputs) == 2
    from atropos.inference.vllm import _echoed

    sent = msgspec.Raw(msgspec.json.encode(ids))
    spaced = msgspec.Raw(msgspec.json.format(msgspec.json.encode(ids), indent=1))
    assert _echoed(spaced, ids, sent) == ids and _echoed(spaced, ids, sent) is not ids
    assert _echoed(msgspec.Raw(b'["5", 6]'), ids, sent) == ["5", 6]  # made ints by the caller


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_a_calls_body_is_the_same_on_every_attempt_and_for_each_spelling(api):
    """The vLLM backend builds a token call's body in the call's own kwargs: a retried attempt
    sends what the first one did, and kwargs the general path strips or merges (`model`,
    `extra_body`) give the same body (the fake server answers equal bodies alike)."""
    from atropos.inference.config import ServerManagerConfig
    from atropos.inference.manager import ServerManager

    ids = TOK.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)
    kw: dict[str, Any] = {"input_ids": ids, "n": 2, "max_new_tokens": 5, "temperature": 1.0}
    with FakeInferenceServer() as fake:
        config = APIServerConfig(
            base_url=fake.url + "/v1", server_type="vllm", model_name="m",
            vllm_token_api=api, health_check=False,
        )  # fmt: skip

        async def main() -> list[Any]:
            settings = ServerManagerConfig(retry_backoff=0.01)
            async with ServerManager([config], settings, tokenizer=TOK) as manager:
                first = await manager.tokens_and_logprobs_completion(**kw)
                fake.fail_next(1)
                retried = await manager.tokens_and_logprobs_completion(**kw)
                spelt = {**kw, "model": "x", "extra_body": {"temperature": 1.0}}
                other = await manager.tokens_and_logprobs_completion(**spelt)
                return [first, retried, other]

        first, retried, other = asyncio.run(main())
        assert sum(fake.requests.values()) == 4  # the failed attempt, then three answers
    assert first == retried == other and first[0] == ids
    assert len(first[1]) == 2 and all(0 < len(out) <= 5 for out in first[1])
