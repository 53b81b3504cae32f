"""Reasoning controls reach every backend's requests the way that server takes them.

Chat requests go through `ServerManager` to a recording stub over real HTTP (the bodies asserted
are the bodies the server received); token-level requests go through `managed_server` to the
fake vLLM server, whose echoed prompt ids show what the template rendered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from atropos.envs.config import BaseEnvConfig
from atropos.inference import reasoning as reasoning_module
from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError, fatal_reason
from atropos.inference.manager import ServerManager
from atropos.inference.reasoning import ChatPlan, Reasoning, TemplatePlan, dialect_of
from atropos.testing import serve_in_thread

LOGGER = "atropos.inference.reasoning"
FIELDS = (
    "reasoning_effort",
    "reasoning",
    "chat_template_kwargs",
    "thinking_token_budget",
    "custom_params",
    "separate_reasoning",
)
"""Every body field a reasoning setting can add."""


class Recorder:
    """A stub OpenAI/vLLM/SGLang/TRL server that records every POST body by path."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def app(self) -> Starlette:
        async def ok(request: Request) -> Response:
            return JSONResponse({"status": "ok", "object": "list", "data": []})

        def post(path: str, answer: Callable[[dict[str, Any]], Any]) -> Route:
            async def endpoint(request: Request) -> Response:
                body = await request.json()
                self.bodies.setdefault(path, []).append(body)
                return JSONResponse(answer(body))

            return Route(path, endpoint, methods=["POST"])

        return Starlette(
            routes=[
                Route("/health", ok),
                Route("/health/", ok),
                Route("/v1/models", ok),
                post("/v1/chat/completions", _chat),
                post("/v1/completions", _text),
                post("/generate/", lambda body: {"completion_ids": [[5, 6]] * body["n"]}),
            ]
        )

    def last(self, path: str = "/v1/chat/completions") -> dict[str, Any]:
        return self.bodies[path][-1]


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
    }
    return {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice]}


def _text(body: dict[str, Any]) -> dict[str, Any]:
    choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
    return {"id": "t", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}


class RecordingTokenizer:
    """Renders `<role>content` and records the kwargs of every `apply_chat_template`."""

    bos_token_id = None
    eos_token_id = 2
    chat_template = "{{ enable_thinking }} {{ thinking }} {{ reasoning_effort }}"

    def __init__(self) -> None:
        self.renders: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        self.renders.append(kwargs)
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[Recorder, str]]:
    recorder = Recorder()
    with serve_in_thread(recorder.app()) as url:
        yield recorder, url + "/v1"


def chat(
    url: str,
    server_type: str,
    reasoning: Reasoning | None,
    *,
    tokenizer: Any = None,
    calls: int = 1,
    **kwargs: Any,
) -> None:
    """`calls` chat requests through a manager over one server of `server_type` at `url`."""
    config = APIServerConfig(base_url=url, server_type=server_type, model_name="m")

    async def main() -> None:
        async with ServerManager([config], tokenizer=tokenizer, reasoning=reasoning) as manager:
            for _ in range(calls):
                messages = [{"role": "user", "content": "hi"}]
                await manager.chat_completion(messages=messages, **kwargs)

    asyncio.run(main())


def sent(body: dict[str, Any]) -> dict[str, Any]:
    """The reasoning fields of a request body."""
    return {k: body[k] for k in FIELDS if k in body}


EVERYTHING = Reasoning(thinking=True, effort="high", max_tokens=2048)


# -- where the settings come from -------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, None),
        ({"thinking_mode": True}, Reasoning(True, None, None)),
        ({"reasoning_effort": "low"}, Reasoning(True, "low", None)),
        ({"max_reasoning_tokens": 4096}, Reasoning(True, None, 4096)),
        ({"reasoning_effort": "none", "thinking_mode": True}, Reasoning(False, "none", None)),
    ],
)
def test_env_settings_become_one_reasoning(settings, expected):
    assert Reasoning.of(BaseEnvConfig(**settings)) == expected


def test_contradictory_settings_warn_once_and_effort_none_wins(caplog):
    with caplog.at_level(logging.WARNING, LOGGER):
        config = BaseEnvConfig(
            thinking_mode=True, reasoning_effort="none", max_reasoning_tokens=2048
        )
        reasoning = Reasoning.of(config)
    assert reasoning is not None and reasoning.thinking is False and reasoning.budget is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "turns reasoning off" in messages[0]


def test_an_env_hands_its_settings_to_its_server_manager():
    from atropos.envs.base import BaseEnv

    class Probe(BaseEnv):
        async def get_next_item(self) -> Any:
            return None

        async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            return None

    config = BaseEnvConfig(reasoning_effort="medium", max_reasoning_tokens=1024, use_wandb=False)
    server = APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="vllm")
    assert Probe(config, server).server.reasoning == Reasoning(True, "medium", 1024)
    assert Probe(BaseEnvConfig(use_wandb=False), server).server.reasoning is None


# -- chat requests, per backend ---------------------------------------------------------------


@pytest.mark.parametrize("server_type", ["openai", "vllm", "sglang", "trl"])
def test_unset_settings_send_nothing(stub, server_type):
    recorder, url = stub
    tokenizer = RecordingTokenizer()
    chat(url, server_type, Reasoning.of(BaseEnvConfig()), tokenizer=tokenizer, max_tokens=9)
    if server_type == "trl":
        assert "generation_kwargs" not in recorder.last("/generate/")
        assert tokenizer.renders[-1] == {"tokenize": False, "add_generation_prompt": True}
    else:
        body = recorder.last()
        assert sent(body) == {} and body["max_tokens"] == 9


def test_vllm_chat_gets_effort_template_switches_and_budget(stub):
    recorder, url = stub
    chat(url, "vllm", EVERYTHING)
    assert sent(recorder.last()) == {
        "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
        "thinking_token_budget": 2048,
    }


def test_effort_none_turns_the_template_switches_off(stub):
    recorder, url = stub
    chat(url, "vllm", Reasoning.of(BaseEnvConfig(reasoning_effort="none")))
    assert sent(recorder.last()) == {
        "reasoning_effort": "none",
        "chat_template_kwargs": {"enable_thinking": False, "thinking": False},
    }


def test_sglang_chat_gets_its_budget_field_and_keeps_reasoning_in_content(stub, caplog):
    recorder, url = stub
    with caplog.at_level(logging.WARNING, LOGGER):
        chat(url, "sglang", EVERYTHING, calls=2)
    assert sent(recorder.last()) == {
        "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
        "custom_params": {"thinking_budget": 2048},
        "separate_reasoning": False,
    }
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "--enable-strict-thinking" in warned[0]


def test_the_callers_own_fields_win(stub):
    recorder, url = stub
    mine = {"chat_template_kwargs": {"enable_thinking": False}, "custom_params": {"x": 1}}
    chat(url, "sglang", EVERYTHING, extra_body=mine, reasoning_effort="low")
    body = recorder.last()
    assert body["reasoning_effort"] == "low"
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "thinking": True}
    assert body["custom_params"] == {"thinking_budget": 2048, "x": 1}


def test_skip_reasoning_and_text_completions_send_nothing(stub):
    recorder, url = stub
    chat(url, "vllm", EVERYTHING, skip_reasoning=True)
    assert sent(recorder.last()) == {} and "skip_reasoning" not in recorder.last()
    config = APIServerConfig(base_url=url, server_type="vllm", model_name="m")

    async def main() -> None:
        async with ServerManager([config], reasoning=EVERYTHING) as manager:
            await manager.completion(prompt="2+2=", max_tokens=3)

    asyncio.run(main())
    assert sent(recorder.last("/v1/completions")) == {}


def test_openai_gets_effort_and_its_reasoning_model_rules(stub, caplog, monkeypatch):
    recorder, url = stub
    monkeypatch.setattr(reasoning_module, "dialect_of", lambda kind, url: "openai")
    with caplog.at_level(logging.WARNING, LOGGER):
        chat(url, "openai", EVERYTHING, calls=2, max_tokens=50, temperature=0.7, top_p=1.0)
    body = recorder.last()
    assert sent(body) == {"reasoning_effort": "high"}
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    assert "temperature" not in body and body["top_p"] == 1.0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # the budget (at setup) and the temperature (once, not per call)
    assert "no reasoning budget" in warned[0] and "temperature=0.7" in warned[1]


def test_openai_effort_none_keeps_sampling_fields(stub, monkeypatch):
    recorder, url = stub
    monkeypatch.setattr(reasoning_module, "dialect_of", lambda kind, url: "openai")
    chat(url, "openai", Reasoning(False, "none", None), max_tokens=5, temperature=0.2)
    body = recorder.last()
    assert body["reasoning_effort"] == "none" and body["temperature"] == 0.2
    assert body["max_completion_tokens"] == 5


@pytest.mark.parametrize(
    ("reasoning", "expected"),
    [
        (Reasoning(True, "high", 2048), {"max_tokens": 2048}),
        (Reasoning(True, "low", None), {"effort": "low"}),
        (Reasoning(False, "none", None), {"effort": "none"}),
        (Reasoning(True, None, None), {"enabled": True}),
    ],
)
def test_openrouter_gets_one_reasoning_object(stub, monkeypatch, reasoning, expected):
    recorder, url = stub
    monkeypatch.setattr(reasoning_module, "dialect_of", lambda kind, url: "openrouter")
    chat(url, "openai", reasoning)
    assert sent(recorder.last()) == {"reasoning": expected}


def test_other_openai_compatible_servers_get_only_the_standard_effort(stub, caplog):
    recorder, url = stub
    with caplog.at_level(logging.WARNING, LOGGER):
        chat(url, "openai", EVERYTHING)
    assert sent(recorder.last()) == {"reasoning_effort": "high"}
    assert "no standard reasoning budget" in caplog.records[0].getMessage()
    chat(url, "openai", Reasoning(True, None, None))  # thinking_mode alone: the env's prompt
    assert sent(recorder.last()) == {}


def test_trl_chat_renders_the_switches_and_sends_none_of_them(stub, caplog):
    recorder, url = stub
    tokenizer = RecordingTokenizer()
    with caplog.at_level(logging.WARNING, LOGGER):
        chat(url, "trl", EVERYTHING, tokenizer=tokenizer, max_tokens=4)
    assert tokenizer.renders[-1] == {
        "tokenize": False,
        "add_generation_prompt": True,
        "enable_thinking": True,
        "thinking": True,
        "reasoning_effort": "high",
    }
    body = recorder.last("/generate/")
    assert "generation_kwargs" not in body and body["max_tokens"] == 4
    assert "TRL's vllm-serve takes no reasoning budget" in caplog.records[0].getMessage()


def test_vllm_refusing_a_budget_is_fatal_with_the_fix():
    body = "ValueError: thinking_token_budget is set but reasoning_config is not configured."
    for status in (400, 500):
        error = InferenceError.from_status(status, body)
        assert error.fatal and not error.retryable
        assert "--reasoning-parser" in (fatal_reason(error) or "")


def test_dialects_follow_the_server_type_and_the_host():
    assert dialect_of("sglang", "https://api.openai.com/v1") == "sglang"
    assert dialect_of("openai", "https://res.openai.azure.com/openai") == "openai"
    assert dialect_of("openai", "https://OpenRouter.ai/api/v1") == "openrouter"
    plan = ChatPlan.from_fields(Reasoning(True, None, None), "compatible", "u")
    assert plan.apply({"n": 1}) == {"n": 1}  # nothing to add: the kwargs pass through


# -- token-level requests: the template kwargs at render time --------------------------------


def template_plan(reasoning: Reasoning, template: str) -> TemplatePlan:
    tokenizer = RecordingTokenizer()
    tokenizer.chat_template = template
    return TemplatePlan.for_tokenizer(reasoning, tokenizer)


def test_only_the_kwargs_a_template_reads_are_passed(caplog):
    high = Reasoning(True, "high", None)
    with caplog.at_level(logging.WARNING, LOGGER):
        qwen = template_plan(high, "{% if enable_thinking is false %}x{% endif %}")
        harmony = template_plan(high, "Reasoning: {{ reasoning_effort }}")
        plain = template_plan(Reasoning(True, None, None), "{{ messages }}")
    assert qwen.kwargs == {"enable_thinking": True}
    assert harmony.kwargs == {"reasoning_effort": "high"}
    assert plain.kwargs == {}  # thinking_mode alone: the env's prompt asks, no warning
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "does not read reasoning_effort" in warned[0]  # qwen's


def test_an_effort_no_template_reads_warns_once_per_manager(caplog):
    from atropos.inference.tokenizer import load_tokenizer
    from atropos.testing import FakeInferenceServer

    tokenizer = load_tokenizer("tiny")  # its template reads no reasoning kwarg
    with FakeInferenceServer() as fake, caplog.at_level(logging.WARNING, LOGGER):
        config = APIServerConfig(base_url=fake.base_url, server_type="vllm", model_name="m")
        reasoning = Reasoning(True, "low", None)

        async def main() -> None:
            async with ServerManager([config], reasoning=reasoning) as manager:
                for _ in range(3):
                    async with manager.managed_server(tokenizer=tokenizer) as managed:
                        await managed.chat_turn(messages=[{"role": "user", "content": "x"}])

        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "reads none of" not in warned[0]
    assert "'low' does not change token-level prompts" in warned[0]


def test_template_kwargs_reach_rendering_for_token_requests():
    tokenizer = RecordingTokenizer()

    class Echo:
        async def tokens_and_logprobs_completion(self, *, input_ids, n=1, **kw):
            return input_ids, [[111]] * n, [[-0.1]] * n, ["stop"] * n

        async def get_logprobs(self, **kw):
            return {}

    from atropos.inference.managed import ManagedServer

    async def main() -> None:
        managed = ManagedServer(Echo(), tokenizer, reasoning=Reasoning(False, "none", None))
        await managed.chat_turn(messages=[{"role": "user", "content": "a"}])
        await managed.chat_turn(
            messages=[{"role": "user", "content": "b"}],
            chat_template_kwargs={"enable_thinking": True},
        )
        await managed.chat_turn(messages=[{"role": "user", "content": "c"}], skip_reasoning=True)
        await managed.get_logprobs(messages=[{"role": "user", "content": "d"}], skip_reasoning=True)

    asyncio.run(main())
    switches = [{k: r.get(k) for k in ("enable_thinking", "thinking")} for r in tokenizer.renders]
    assert switches == [
        {"enable_thinking": False, "thinking": False},
        {"enable_thinking": True, "thinking": False},  # the call's own kwargs win
        {"enable_thinking": None, "thinking": None},
        {"enable_thinking": None, "thinking": None},
    ]
    assert tokenizer.renders[0]["reasoning_effort"] == "none"


QWEN_LIKE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)


def qwen_like_tokenizer() -> Any:
    """The shipped tiny tokenizer with a template that reads `enable_thinking` (a fresh
    instance: the cached one is shared)."""
    from atropos.inference.tokenizer import import_transformers_quietly
    from atropos.tiny import tokenizer_path

    tokenizer = import_transformers_quietly().AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.chat_template = QWEN_LIKE
    return tokenizer


def test_text_only_retokenization_renders_with_the_switch():
    """A server without token ids: the finished chat is tokenized locally with the same
    switches the request carried, so the trained tokens follow the prompt the policy saw."""
    from atropos.inference.tokenize import tokenize_for_trainer

    tokenizer = qwen_like_tokenizer()
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    plain = tokenize_for_trainer(tokenizer, chat)
    off = tokenize_for_trainer(tokenizer, chat, template_kwargs={"enable_thinking": False})
    # the template adds the empty think block to a generation prompt only: the sequence is the
    # prompt as the policy saw it, then its reply
    masked = zip(off["tokens"], off["masks"], strict=True)
    prompt = tokenizer.decode([t for t, m in masked if m == -100])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    for out in (plain, off):
        trained = [t for t in out["masks"] if t != -100]
        assert tokenizer.decode(trained) == "4<|im_end|>\n"
    assert plain["tokens"] != off["tokens"]
    same = tokenize_for_trainer(tokenizer, chat, template_kwargs={"enable_thinking": True})
    assert same == plain  # a switch that leaves the prompt as rendered changes nothing


def test_the_rendered_prompt_the_server_receives_follows_the_switch():
    from atropos.testing import FakeInferenceServer

    tokenizer = qwen_like_tokenizer()
    prompts = {}
    with FakeInferenceServer() as fake:
        config = APIServerConfig(base_url=fake.base_url, server_type="vllm", model_name="m")
        for name, reasoning in (("off", Reasoning(False, "none", None)), ("unset", None)):

            async def main(reasoning: Reasoning | None = reasoning) -> list[int]:
                async with ServerManager([config], reasoning=reasoning) as manager:
                    async with manager.managed_server(tokenizer=tokenizer) as managed:
                        turn = await managed.chat_turn(messages=[{"role": "user", "content": "q"}])
                return turn.prompt_tokens

            prompts[name] = tokenizer.decode(asyncio.run(main()))
    assert prompts["off"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompts["unset"].endswith("<|im_start|>assistant\n")


# -- token-level requests: the budget, enforced by us ----------------------------------------


class Scripted:
    """A token server answering from a script: `script(input_ids, max_tokens)` -> (ids, finish)."""

    def __init__(self, script: Callable[[list[int], int | None], tuple[list[int], str]]) -> None:
        self.script = script
        self.calls: list[tuple[list[int], int, int | None]] = []

    async def tokens_and_logprobs_completion(self, *, input_ids, n=1, max_tokens=None, **kw):
        self.calls.append((list(input_ids), n, max_tokens))
        outs, finishes = [], []
        for _ in range(n):
            ids, finish = self.script(list(input_ids), max_tokens)
            outs.append(ids)
            finishes.append(finish)
        return input_ids, outs, [[-0.5] * len(o) for o in outs], finishes


THINK, END, NL, EOS = 1024, 1025, 202, 2


def thinker(words: int, answer: list[int]) -> Callable[[list[int], int | None], tuple]:
    """Thinks `words` tokens (5) then answers; continues correctly from any cut."""
    full = [THINK, *[5] * words, END, *answer, EOS]

    def script(ids: list[int], most: int | None) -> tuple[list[int], str]:
        if ids and ids[-1] == END and END not in full[: words + 1]:  # closed by the caller
            rest = [*answer, EOS]
        else:
            done = _generated(ids, full)
            rest = full[done:]
        if most is not None and len(rest) > most:
            return rest[:most], "length"
        return rest, "stop"

    return script


def _generated(ids: list[int], full: list[int]) -> int:
    """How much of `full` the tail of `ids` already holds (the prompt ends with 9)."""
    tail = ids[len(ids) - ids[::-1].index(9) :]
    return len(tail)


def run_budget(server: Scripted, n: int, max_tokens: int | None, budget: int = 8):
    from atropos.inference.managed import ManagedServer
    from atropos.inference.thinking_budget import ThinkMarkers

    class Tok(RecordingTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            return "\t"  # one token, 9: where the completion starts

    plan = TemplatePlan({}, budget, ThinkMarkers(THINK, END, (NL, END)))
    managed = ManagedServer(server, Tok(), reasoning=plan)
    messages = [{"role": "user", "content": "q"}]
    return asyncio.run(managed.chat_turn(messages=messages, n=n, max_tokens=max_tokens))


def test_a_block_within_the_budget_takes_one_request():
    server = Scripted(thinker(3, [7]))
    turn = run_budget(server, n=2, max_tokens=100)
    assert len(server.calls) == 1 and server.calls[0][1:] == (2, 8)
    node = turn.nodes[0]
    assert node.tokens == [9, THINK, 5, 5, 5, END, 7, EOS] and turn.finish_reasons[0] == "stop"


def test_a_block_over_the_budget_is_closed_by_us_and_not_trained():
    server = Scripted(thinker(20, [7, 7]))
    turn = run_budget(server, n=2, max_tokens=30)
    assert [c[1:] for c in server.calls] == [(2, 8), (1, 20), (1, 20)]
    cut = [9, THINK, *[5] * 7]
    assert server.calls[1][0] == [*cut, NL, END]  # continued by ids from the forced close
    node = turn.nodes[0]
    assert node.tokens == [*cut, NL, END, 7, 7, EOS]
    assert node.masked_tokens == [-100, THINK, *[5] * 7, -100, -100, 7, 7, EOS]
    assert node.logprobs[9:11] == [1, 1] and node.logprobs[11] == -0.5
    assert turn.finish_reasons == ["stop", "stop"]


def test_a_closed_block_cut_at_the_budget_continues_unchanged():
    server = Scripted(thinker(2, [7] * 10))
    turn = run_budget(server, n=1, max_tokens=12)
    assert [c[1:] for c in server.calls] == [(1, 8), (1, 4)]
    node = turn.nodes[0]
    assert node.tokens == [9, THINK, 5, 5, END, *[7] * 8] and -100 not in node.masked_tokens[1:]
    assert turn.finish_reasons == ["length"]


def test_a_limit_within_the_budget_needs_no_enforcing():
    server = Scripted(thinker(20, [7]))
    turn = run_budget(server, n=1, max_tokens=5)
    assert len(server.calls) == 1 and turn.finish_reasons == ["length"]


def test_the_budget_end_to_end_through_the_manager_on_the_fake_vllm_server():
    from atropos.testing import FakeInferenceServer

    def responder(prompt: str) -> str:
        if prompt.endswith("\n</think>"):
            return " 42"
        return "<think>" + " step" * 40 + "</think> 41"

    tokenizer = qwen_like_tokenizer()
    with FakeInferenceServer(responder=responder) as fake:
        config = APIServerConfig(base_url=fake.base_url, server_type="vllm", model_name="m")

        async def main() -> Any:
            async with ServerManager([config], reasoning=Reasoning(True, None, 10)) as manager:
                async with manager.managed_server(tokenizer=tokenizer) as managed:
                    messages = [{"role": "user", "content": "q"}]
                    return await managed.chat_turn(messages=messages, max_tokens=64)

        turn = asyncio.run(main())
        assert fake.requests["/v1/completions"] == 2
    assert turn.contents[0] == "<think>" + " step" * 9 + "\n</think> 42"
    node = turn.nodes[0]
    forced = [i for i, m in enumerate(node.masked_tokens) if m == -100][-2:]
    assert [node.tokens[i] for i in forced] == [NL, END]


def test_no_think_tokens_means_no_budget_and_one_warning(caplog):
    tokenizer = RecordingTokenizer()
    tokenizer.get_vocab = dict  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, LOGGER):
        plan = TemplatePlan.for_tokenizer(Reasoning(True, None, 2048), tokenizer)
    assert plan.budget is None and plan.kwargs == {"enable_thinking": True, "thinking": True}
    assert "no <think> and </think> tokens" in caplog.records[0].getMessage()
