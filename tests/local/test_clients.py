"""Our own clients against the local server: the vLLM backend, the OpenAI SDK, the CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import openai
import pytest

from atropos.cli.main import build_parser
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager


def manager(server) -> ServerManager:
    config = APIServerConfig(base_url=server.url + "/v1", model_name="tiny", server_type="vllm")
    fast = ServerManagerConfig(health_check_interval=0.05, deadline=30.0)
    return ServerManager([config], fast)


def test_the_vllm_backend_gets_exact_tokens_and_logprobs(server, forward_logprobs):
    prompt = server.engine.tokenizer.encode("Tokens, please")

    async def main():
        async with manager(server) as m:
            by_ids = await m.tokens_and_logprobs_completion(
                input_ids=prompt, n=2, max_tokens=6, temperature=1.0, seed=4
            )
            by_text = await m.tokens_and_logprobs_completion(prompt="Tokens, please", max_tokens=3)
            scored = await m.get_logprobs(input_ids=prompt, top_k=1)
            chat = await m.chat_completion(
                messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2
            )
            return by_ids, by_text, scored, chat

    (prompt_ids, outputs, logprobs, finish), by_text, scored, chat = asyncio.run(main())
    assert prompt_ids == prompt and len(outputs) == len(logprobs) == len(finish) == 2
    for ids, lps in zip(outputs, logprobs, strict=True):
        assert len(ids) == len(lps) and set(finish) <= {"stop", "length"}
        assert (
            max(abs(a - b) for a, b in zip(forward_logprobs(prompt, ids), lps, strict=True)) <= 1e-4
        )
    assert by_text[0] == prompt and len(by_text[1][0]) <= 3
    assert scored["prompt_tokens"] == prompt
    assert scored["prompt_topk_token_ids"][0] == []
    for pos in range(1, len(prompt)):
        best = scored["prompt_topk_logprobs"][pos][0]
        assert best >= forward_logprobs(prompt[:pos], [prompt[pos]])[0] - 1e-4
    assert len(chat.choices) == 2 and chat.model == "tiny"
    assert all(isinstance(c.message.content, str) for c in chat.choices)


def test_the_openai_sdk_reads_the_answers(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    try:
        completion = client.completions.create(model="tiny", prompt="Hello", max_tokens=3)
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage is not None and completion.usage.completion_tokens >= 1
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, logprobs=True
        )
        assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content
        assert [m.id for m in client.models.list().data] == ["tiny"]
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="Hello", max_tokens=3)
    finally:
        client.close()


def test_the_cli_parses_serve_flags_and_refuses_open_hosts_without_a_key(model_dir, capsys):
    args = build_parser().parse_args(["local", "serve", str(model_dir), "--port", "0"])
    assert (args.host, args.port, args.device, args.max_batch_size) == ("127.0.0.1", 0, "auto", 64)
    assert args.policy_version == 0 and args.seed is None
    open_args = build_parser().parse_args(["local", "serve", str(model_dir), "--host", "0.0.0.0"])
    open_args.api_key = None
    with pytest.raises(SystemExit) as refused:
        open_args.run(open_args)
    assert refused.value.code == 2 and "--api-key" in capsys.readouterr().err
    missing = build_parser().parse_args(["local", "serve", str(model_dir / "nope")])
    with pytest.raises(SystemExit) as refused:
        missing.run(missing)
    assert refused.value.code == 2 and "no config.json" in capsys.readouterr().err


def test_importing_the_server_side_pulls_in_no_torch():
    code = (
        "import sys, atropos.local, atropos.local.server, atropos.local.lora, "
        "atropos.local.protocol, atropos.local.responses, atropos.cli.local, atropos.cli.main, "
        "atropos.testing.fake_lora; "
        "print(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
