"""The two servers every vLLM-facing test here runs against, and the reference they are held to.

`target` is parametrized: `local` (`atropos local serve tiny` in this process, the default
server everywhere) and `vllm` (real vLLM, `vllm_server` from tests/conftest.py). Both serve the
shipped tiny policy as "atropos-tiny". `reference` is that policy in transformers, float32: the
logprobs both servers report for a sequence are held to its forward pass over the same ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from atropos.inference.tokenizer import load_tokenizer
from atropos.testing.vllm import VLLMServer, tiny_policy_path

from .helpers import MAX_MODEL_LEN, Target


@pytest.fixture(scope="session")
def local_target() -> Iterator[Target]:
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server(max_model_len=MAX_MODEL_LEN) as url:
        yield Target("local", url)


@pytest.fixture(scope="session", params=["local", "vllm"])
def target(request: pytest.FixtureRequest) -> Target:
    """Each server in turn (tests are grouped by server, so each starts once a session)."""
    if request.param == "local":
        found: Target = request.getfixturevalue("local_target")
        return found
    server: VLLMServer = request.getfixturevalue("vllm_server")
    return Target("vllm", server.base_url)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny policy's tokenizer (the shipped ChatML one)."""
    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def logprob_table() -> Callable[[list[int]], Any]:
    """`fn(ids)`: the tiny policy's log-softmax over `ids` in transformers (float32, one
    unpadded, uncached forward pass); row i is the distribution of the id after ids[: i + 1]."""
    torch = pytest.importorskip("torch")
    from atropos.inference.tokenizer import import_transformers_quietly

    transformers = import_transformers_quietly()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_policy_path()), dtype=torch.float32
    ).eval()

    def table(ids: list[int]) -> Any:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    return table


@pytest.fixture(scope="session")
def reference(
    logprob_table: Callable[[list[int]], Any],
) -> Callable[[list[int], list[int]], list[float]]:
    """`fn(prompt_ids, output_ids)`: log p(each output id) under the tiny policy."""

    def logprobs(prompt: list[int], output: list[int]) -> list[float]:
        table = logprob_table(prompt + output)
        return [float(table[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]

    return logprobs
