"""ManagedServer: token-exact nodes over the fake server's /generate, multi-turn extension by ids,
drift classification (CLEAN, REALIGN, FORK), n > 1 branches, logprob alignment, length rules."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from atropos.inference.managed import DriftKind, ManagedServer, SequenceNode
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
EOS = TOK.eos_token_id
NL = TOK.encode("\n")
USER = [{"role": "user", "content": "What is 2 + 2?"}]


class Script:
    """The fake server's responder: `fn(prompt) -> text`, or None for random tokens."""

    fn: Any = None

    def __call__(self, prompt: str) -> str | None:
        return None if self.fn is None else self.fn(prompt)


SCRIPT = Script()


class GenerateClient:
    """A minimal token backend: upstream's vLLM `/generate` call, over real HTTP."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.calls: list[tuple[dict[str, Any], tuple[Any, ...]]] = []

    async def tokens_and_logprobs_completion(
        self,
        *,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        n: int = 1,
        **kw: Any,
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        assert prompt is None and input_ids is not None
        body = {"prompt": {"prompt_token_ids": input_ids}, "logprobs": 0, "n": n, **kw}
        async with httpx.AsyncClient() as client:
            r = await client.post(f"{self.root}/generate", json=body)
        r.raise_for_status()
        data = r.json()
        outs = [[int(next(iter(p[0]))) for p in seq] for seq in data["logprobs"]]
        lps = [[next(iter(p[0].values())) for p in seq] for seq in data["logprobs"]]
        result = (data["prompt_token_ids"], outs, lps, data["finish_reasons"])
        self.calls.append((body, result))
        return result


class Scripted:
    """An in-memory server answering fixed output ids (for tokenizations no real server picks)."""

    def __init__(self, *answers: tuple[list[int], str]) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    async def tokens_and_logprobs_completion(self, *, input_ids: list[int], n: int = 1, **kw: Any):
        self.calls.append({"input_ids": input_ids, "n": n, **kw})
        out, finish = self.answers.pop(0)
        lps = [-0.25 - 0.01 * i for i in range(len(out))]
        return input_ids, [out] * n, [lps] * n, [finish] * n


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=SCRIPT) as server:
        yield server


@pytest.fixture
def client(srv: FakeInferenceServer) -> Iterator[GenerateClient]:
    SCRIPT.fn = None
    yield GenerateClient(srv.url)
    SCRIPT.fn = None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def prompt_ids(messages: list[dict[str, Any]], generation: bool = True) -> list[int]:
    text = TOK.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    return TOK.encode(text, add_special_tokens=False)


def trained(node: SequenceNode) -> str:
    return TOK.decode([t for t in node.masked_tokens if t != -100], skip_special_tokens=False)


def check_aligned(node: SequenceNode) -> None:
    assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
    for token, masked, lp in zip(node.tokens, node.masked_tokens, node.logprobs, strict=True):
        assert masked in (-100, token)
        assert (lp == 1.0) if masked == -100 else (lp < 0)


# --- single turn ------------------------------------------------------------------------------


def test_chat_completion_single_turn(client):
    SCRIPT.fn = lambda prompt: "The answer is 4."
    m = ManagedServer(client, TOK)
    reply = run(m.chat_completion(messages=USER, max_tokens=32, temperature=0.7))
    assert isinstance(reply, ChatCompletion)
    assert reply.choices[0].message.content == "The answer is 4."
    assert reply.choices[0].finish_reason == "stop"
    [node] = m.get_state()["nodes"]
    prompt = prompt_ids(USER)
    out = TOK.encode("The answer is 4.") + [EOS]
    assert node.tokens == prompt + out and node.token_source == "server"
    assert node.masked_tokens == [-100] * len(prompt) + out
    assert node.logprobs[: len(prompt)] == [1.0] * len(prompt)
    body, (_, _, lps, _) = client.calls[0]
    assert body["prompt"]["prompt_token_ids"] == prompt  # rendered locally, sent as ids
    assert body["max_tokens"] == 32 and body["temperature"] == 0.7
    assert node.logprobs[len(prompt) :] == lps[0]
    assert node.messages == [*USER, {"role": "assistant", "content": "The answer is 4."}]
    assert node.drift is None and node.finish_reason == "stop"
    assert reply.usage and reply.usage.prompt_tokens == len(prompt)
    check_aligned(node)


def test_completion_single_turn(client):
    SCRIPT.fn = lambda prompt: " world"
    m = ManagedServer(client, TOK)
    reply = run(m.completion(prompt="Hello", max_tokens=8))
    assert isinstance(reply, Completion) and reply.choices[0].text == " world"
    [node] = m.get_state()["nodes"]
    assert node.tokens == TOK.encode("Hello") + TOK.encode(" world") + [EOS]
    assert node.full_text == "Hello world" and node.messages is None
    assert trained(node) == " world<|im_end|>"
    check_aligned(node)


def test_n_choices_are_separate_nodes_with_server_logprobs(client):
    m = ManagedServer(client, TOK)
    reply = run(m.chat_completion(messages=USER, n=3, max_tokens=40))
    nodes = m.get_state()["nodes"]
    assert len(reply.choices) == len(nodes) == 3
    _, (prompt, outs, lps, finishes) = client.calls[0]
    assert len({tuple(o) for o in outs}) == 3  # random choices differ
    for choice, node, out, lp in zip(reply.choices, nodes, outs, lps, strict=True):
        assert node.tokens == prompt + out  # exactly the server's ids, not re-tokenized text
        assert node.logprobs[len(prompt) :] == lp
        assert choice.message.content == TOK.decode(out, skip_special_tokens=True)
        check_aligned(node)


# --- multi-turn -------------------------------------------------------------------------------


def test_clean_extension_keeps_earlier_completions_trainable(client):
    answers = iter(["The answer is 4.", "You are welcome."])
    SCRIPT.fn = lambda prompt: next(answers)
    m = ManagedServer(client, TOK)
    first = run(m.chat_completion(messages=USER))
    [node1] = m.get_state()["nodes"]
    convo = [*USER, {"role": "assistant", "content": first.choices[0].message.content}]
    convo.append({"role": "user", "content": "Thanks!"})
    run(m.chat_completion(messages=convo))
    assert m.drift_counts == {DriftKind.CLEAN: 1, DriftKind.REALIGN: 0, DriftKind.FORK: 0}
    [node2] = m.get_state()["nodes"]  # the extension replaced its prefix
    sent = client.calls[1][0]["prompt"]["prompt_token_ids"]
    assert sent[: len(node1.tokens)] == node1.tokens and sent == prompt_ids(convo)
    assert node2.tokens[: len(node1.tokens)] == node1.tokens
    assert node2.masked_tokens[: len(node1.tokens)] == node1.masked_tokens
    assert node2.logprobs[: len(node1.tokens)] == node1.logprobs
    assert trained(node2) == "The answer is 4.<|im_end|>You are welcome.<|im_end|>"
    assert node2.drift is DriftKind.CLEAN
    check_aligned(node2)


def test_extension_picks_the_branch_the_conversation_continues(client):
    m = ManagedServer(client, TOK)
    first = run(m.chat_completion(messages=USER, n=3, max_tokens=30))
    branches = m.get_state()["nodes"]
    chosen = first.choices[1].message.content
    convo = [*USER, {"role": "assistant", "content": chosen}, {"role": "user", "content": "?"}]
    run(m.chat_completion(messages=convo, max_tokens=30))
    nodes = m.get_state()["nodes"]
    assert len(nodes) == 3
    assert nodes[0].tokens == branches[0].tokens and nodes[2].tokens == branches[2].tokens
    assert nodes[1].tokens[: len(branches[1].tokens)] == branches[1].tokens
    assert nodes[1].messages and nodes[1].messages[1]["content"] == chosen
    # random server ids are rarely the canonical tokenization: CLEAN or REALIGN, never FORK
    assert m.drift_counts[DriftKind.FORK] == 0
    assert m.drift_counts[DriftKind.CLEAN] + m.drift_counts[DriftKind.REALIGN] == 1


def test_realign_keeps_the_servers_tokenization():
    hello = [TOK.convert_tokens_to_ids(c) for c in "hello"]  # one token per letter
    assert hello != TOK.encode("hello")
    server = Scripted((hello + [EOS], "stop"), (TOK.encode("bye") + [EOS], "stop"))
    m = ManagedServer(server, TOK)
    reply = run(m.chat_completion(messages=USER))
    assert reply.choices[0].message.content == "hello"
    [node1] = m.get_state()["nodes"]
    convo = [*USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
    run(m.chat_completion(messages=convo))
    assert m.drift_counts[DriftKind.REALIGN] == 1
    sent = server.calls[1]["input_ids"]
    assert sent[: len(node1.tokens)] == node1.tokens  # held ids kept, letters and all
    suffix = TOK.encode("\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    assert sent[len(node1.tokens) :] == suffix
    [node2] = m.get_state()["nodes"]
    assert trained(node2) == "hello<|im_end|>bye<|im_end|>" and node2.drift is DriftKind.REALIGN
    check_aligned(node2)


def test_fork_when_an_earlier_turn_was_edited(client):
    SCRIPT.fn = lambda prompt: "The answer is 4."
    m = ManagedServer(client, TOK)
    run(m.chat_completion(messages=USER))
    [held] = m.get_state()["nodes"]
    convo = [*USER, {"role": "assistant", "content": "It is 4."}, {"role": "user", "content": "?"}]
    run(m.chat_completion(messages=convo))
    assert m.drift_counts[DriftKind.FORK] == 1
    nodes = m.get_state()["nodes"]
    assert len(nodes) == 2 and nodes[0].tokens == held.tokens  # the old sequence stays
    fresh = nodes[1]
    assert fresh.drift is DriftKind.FORK
    assert client.calls[1][0]["prompt"]["prompt_token_ids"] == prompt_ids(convo)
    assert trained(fresh) == "The answer is 4.<|im_end|>"  # the edited turn is prompt now


THINK_STRIPPING = (
    "{%- for m in messages -%}"
    "{%- set c = m.content.split('</think>')[-1] if m.role == 'assistant' else m.content -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_fork_when_the_template_rewrites_history(client):
    tok = load_tokenizer()
    tok.chat_template = THINK_STRIPPING  # like templates that drop earlier think blocks
    SCRIPT.fn = lambda prompt: "<think>2+2</think>4"
    m = ManagedServer(client, tok)
    first = run(m.chat_completion(messages=USER))
    assert first.choices[0].message.content == "<think>2+2</think>4"
    convo = [*USER, {"role": "assistant", "content": "<think>2+2</think>4"}]
    run(m.chat_completion(messages=[*convo, {"role": "user", "content": "and 3+3?"}]))
    assert m.drift_counts == {DriftKind.CLEAN: 0, DriftKind.REALIGN: 0, DriftKind.FORK: 1}


def test_a_new_conversation_counts_no_drift(client):
    m = ManagedServer(client, TOK)
    run(m.chat_completion(messages=USER))
    run(m.chat_completion(messages=[{"role": "user", "content": "Something else"}]))
    assert len(m.get_state()["nodes"]) == 2 and sum(m.drift_counts.values()) == 0


def test_completion_extension_by_text(client):
    SCRIPT.fn = lambda prompt: " world"
    m = ManagedServer(client, TOK)
    run(m.completion(prompt="Hello"))
    [node1] = m.get_state()["nodes"]
    # continuing the text the tokens spell (eos included) extends them: CLEAN
    run(m.completion(prompt="Hello world<|im_end|> again"))
    assert m.drift_counts[DriftKind.CLEAN] == 1
    [node2] = m.get_state()["nodes"]
    assert node2.masked_tokens[: len(node1.tokens)] == node1.masked_tokens
    assert trained(node2) == " world<|im_end|> world<|im_end|>"
    # continuing the visible text only (the eos dropped) rewrites history: FORK
    run(m.completion(prompt=node2.full_text + " more"))
    assert m.drift_counts[DriftKind.FORK] == 1 and len(m.get_state()["nodes"]) == 2


# --- length, alignment, state -----------------------------------------------------------------


def test_length_completion_then_extension_masks_the_template_end(client):
    SCRIPT.fn = lambda prompt: "one two three four five six"
    m = ManagedServer(client, TOK)
    reply = run(m.chat_completion(messages=USER, max_tokens=3))
    assert reply.choices[0].finish_reason == "length"
    [node1] = m.get_state()["nodes"]
    head = TOK.encode("one two three four five six")[:3]
    assert node1.tokens[-3:] == head and EOS not in head
    content = reply.choices[0].message.content
    assert content == TOK.decode(head)
    convo = [*USER, {"role": "assistant", "content": content}, {"role": "user", "content": "go"}]
    SCRIPT.fn = lambda prompt: "ok"
    run(m.chat_completion(messages=convo))
    [node2] = m.get_state()["nodes"]
    at = len(node1.tokens)
    assert (
        node2.tokens[at : at + 2] == [EOS, *NL] and node2.masked_tokens[at : at + 2] == [-100] * 2
    )
    assert trained(node2) == TOK.decode(head) + "ok<|im_end|>"


def test_length_with_a_trailing_end_of_turn_masks_it():
    out = TOK.encode("cut") + [EOS]
    m = ManagedServer(Scripted((out, "length")), TOK)
    run(m.chat_completion(messages=USER))
    [node] = m.get_state()["nodes"]
    assert node.tokens[-len(out) :] == out  # kept as the server returned it...
    assert node.masked_tokens[-1] == -100 and node.logprobs[-1] == 1.0  # ...but not trained
    assert trained(node) == "cut"
    check_aligned(node)


def test_length_ending_in_the_template_suffix_masks_all_of_it():
    # ChatML ends a turn with <|im_end|> then "\n": a completion cut right after the newline
    # ends in a token that is not special, and the whole suffix must still go untrained
    out = TOK.encode("cut") + [EOS, *NL]
    m = ManagedServer(Scripted((out, "length")), TOK)
    run(m.chat_completion(messages=USER))
    [node] = m.get_state()["nodes"]
    assert node.tokens[-len(out) :] == out
    assert node.masked_tokens[-1 - len(NL) :] == [-100] * (1 + len(NL))
    assert trained(node) == "cut"
    check_aligned(node)


def test_length_ending_in_an_ordinary_token_is_all_trained():
    out = TOK.encode("cut short")
    m = ManagedServer(Scripted((out, "length")), TOK)
    run(m.chat_completion(messages=USER))
    [node] = m.get_state()["nodes"]
    assert node.masked_tokens[-len(out) :] == out and trained(node) == "cut short"


def test_logprobs_must_match_output_ids():
    class Broken(Scripted):
        async def tokens_and_logprobs_completion(self, *, input_ids, n=1, **kw):
            return input_ids, [[5, 6]], [[-0.1]], ["stop"]

    with pytest.raises(ValueError, match="1 logprobs for 2 output tokens"):
        run(ManagedServer(Broken(), TOK).chat_completion(messages=USER))


def test_wrong_choice_count_is_an_error():
    with pytest.raises(ValueError, match="asked for 2 completions"):
        server = Scripted(([5, EOS], "stop"))

        async def one_choice(**kw):
            return kw["input_ids"], [[5]], [[-0.1]], ["stop"]

        server.tokens_and_logprobs_completion = one_choice  # type: ignore[method-assign]
        run(ManagedServer(server, TOK).chat_completion(messages=USER, n=2))


def test_sampling_kwargs_and_split_reach_the_server():
    server = Scripted(([5, EOS], {"type": "stop"}))
    m = ManagedServer(server, TOK)
    reply = run(
        m.chat_completion(
            messages=USER, max_completion_tokens=7, split="eval", stop=["x"], tool_choice="auto"
        )
    )
    call = server.calls[0]
    assert call["max_tokens"] == 7 and call["split"] == "eval" and call["stop"] == ["x"]
    assert "tool_choice" not in call and "max_completion_tokens" not in call
    assert reply.choices[0].finish_reason == "stop"  # SGLang-style dict reasons normalized


def test_state_is_a_copy_and_reset_clears():
    m = ManagedServer(Scripted(([5, EOS], "stop"), ([6, EOS], "stop")), TOK)
    run(m.chat_completion(messages=USER))
    state = m.get_state()
    state["nodes"][0].tokens.append(99)
    state["nodes"][0].masked_tokens.append(99)
    state["nodes"][0].messages[0]["content"] = "changed"  # nested data is copied too
    state["nodes"][0].metadata["extra"] = [1]
    held = m.get_state()["nodes"][0]
    assert held.tokens[-1] == EOS and held.masked_tokens[-1] == EOS
    assert held.messages[0] == USER[0] and "extra" not in held.metadata
    assert held == m.nodes[0] and held is not m.nodes[0]
    convo = [
        *USER,
        {"role": "assistant", "content": TOK.decode([5])},
        {"role": "user", "content": "y"},
    ]
    run(m.chat_completion(messages=convo))
    assert sum(m.drift_counts.values()) == 1
    m.reset()
    assert m.get_state() == {"nodes": []} and sum(m.drift_counts.values()) == 0


def test_assistant_last_message_gets_no_generation_prompt():
    server = Scripted(([5, EOS], "stop"))
    convo = [*USER, {"role": "assistant", "content": "Partial"}]
    run(ManagedServer(server, TOK).chat_completion(messages=convo))
    assert server.calls[0]["input_ids"] == prompt_ids(convo, generation=False)


def test_tokenizer_comes_from_the_server_or_is_required():
    server = Scripted(([5, EOS], "stop"))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ManagedServer(server)
    server.tokenizer = TOK  # type: ignore[attr-defined]
    assert ManagedServer(server).tokenizer is TOK


def test_node_validation_and_dict():
    with pytest.raises(ValueError, match="equal lengths"):
        SequenceNode(tokens=[1, 2], masked_tokens=[-100], logprobs=[1.0, -0.5])
    node = SequenceNode([1, 2], [-100, 2], [1.0, -0.5], finish_reason="stop", drift=DriftKind.CLEAN)
    assert node.to_dict()["drift"] == "clean" and node.metadata == {"finish_reason": "stop"}


def test_get_logprobs_renders_messages():
    class WithLogprobs(Scripted):
        async def get_logprobs(self, **kw):
            return kw

    m = ManagedServer(WithLogprobs(), TOK)
    assert run(m.get_logprobs(messages=USER, top_k=2)) == {
        "input_ids": prompt_ids(USER),
        "top_k": 2,
    }
    assert run(m.get_logprobs(prompt="hi")) == {"prompt": "hi"}


# --- continuing one assistant turn ------------------------------------------------------------


def test_continue_turn_inserts_masked_ids_and_trains_the_continuation():
    call = TOK.encode('<tool_call>{"name": "f"}')
    more = TOK.encode(" so 4.") + [EOS]
    server = Scripted((call, "stop"), (more, "stop"))
    m = ManagedServer(server, TOK)
    first = run(m.chat_turn(messages=USER, max_tokens=16)).nodes[0]
    inserted = TOK.encode("<tool_response>4</tool_response>")
    node = run(m.continue_turn(first, inserted, max_tokens=8, temperature=0.5))
    assert server.calls[1]["input_ids"] == first.tokens + inserted  # the held ids, not re-rendered
    assert server.calls[1]["max_tokens"] == 8 and server.calls[1]["temperature"] == 0.5
    assert node.tokens == first.tokens + inserted + more
    assert node.masked_tokens == first.masked_tokens + [-100] * len(inserted) + more
    assert node.logprobs[: len(first.tokens)] == first.logprobs
    assert trained(node) == TOK.decode(call + more, skip_special_tokens=False)
    assert m.get_state()["nodes"] == [node]  # it took the first node's place
    assert node.messages is not None and node.messages[:-1] == USER
    assert node.messages[-1]["content"].endswith(" so 4.")
    check_aligned(node)


def test_continue_turn_refuses_a_server_that_changed_the_prompt():
    class Trimming(Scripted):
        async def tokens_and_logprobs_completion(self, *, input_ids, n=1, **kw):
            prompt, outs, lps, finishes = await super().tokens_and_logprobs_completion(
                input_ids=input_ids, n=n, **kw
            )
            return prompt[1:], outs, lps, finishes

    m = ManagedServer(Scripted(([EOS], "stop")), TOK)
    first = run(m.chat_turn(messages=USER)).nodes[0]
    m.server = Trimming(([EOS], "stop"))
    with pytest.raises(ValueError, match="cannot be continued token-exactly"):
        run(m.continue_turn(first, [5]))
