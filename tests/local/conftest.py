"""Fixtures for `atropos local serve`: a tiny random Llama on disk and a live server over it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atropos.inference.tokenizer import import_transformers_quietly
from atropos.local.engine import Engine
from atropos.local.server import LocalServer
from atropos.testing import serve_in_thread, tiny_tokenizer_path

torch.set_num_threads(1)  # the machine is shared; the model is tiny anyway
transformers = import_transformers_quietly()
transformers.logging.disable_progress_bar()


def build_model(directory: Path, seed: int = 0) -> Path:
    """Save a tiny random Llama with the shipped tokenizer into `directory`."""
    tokenizer_dir = Path(tiny_tokenizer_path())
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.5,  # peaked distributions: greedy choices are clear-cut
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, directory / item.name)
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model every server in these tests loads at start."""
    return build_model(tmp_path_factory.mktemp("local") / "tiny-llama")


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, other weights: a checkpoint to reload."""
    return build_model(tmp_path_factory.mktemp("local") / "tiny-llama-2", seed=1)


@pytest.fixture(scope="session")
def reference(model_dir: Path) -> Any:
    """A separate copy of the model for plain full-sequence forward passes."""
    from atropos.local.weights import load_fp32

    return load_fp32(str(model_dir)).eval()


class Live:
    """A running local server: `url`, `engine`, and `post`/`get` returning httpx responses."""

    def __init__(self, url: str, engine: Engine, name: str) -> None:
        self.url, self.engine, self.name = url, engine, name
        self.client = httpx.Client(base_url=url, timeout=60)

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return self.client.post(path, json=body, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def complete(self, **body: Any) -> dict[str, Any]:
        r = self.post("/v1/completions", body)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data


@contextlib.contextmanager
def live_server(model_dir: Path, **options: Any) -> Iterator[Live]:
    """Serve `model_dir` on a free loopback port for the block."""
    api_key = options.pop("api_key", None)
    engine = Engine(str(model_dir), device="cpu", **options).start()
    try:
        app = LocalServer(engine, served_model_name="tiny", api_key=api_key).app
        with serve_in_thread(app) as url:
            live = Live(url, engine, "tiny")
            try:
                yield live
            finally:
                live.client.close()
    finally:
        engine.close()


@pytest.fixture(scope="session")
def start_server() -> Callable[..., contextlib.AbstractContextManager[Live]]:
    """`with start_server(model_dir, **engine_options) as live:` a server of one's own."""
    return live_server


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Live]:
    """One server per test module (tests that change its weights start their own)."""
    with live_server(model_dir, seed=0) as live:
        yield live


@pytest.fixture
def forward_logprobs(reference: Any) -> Callable[[list[int], list[int]], list[float]]:
    """`fn(prompt_ids, output_ids)`: log p(output token) from one unpadded, uncached forward."""

    def fn(prompt: list[int], output: list[int], model: Any = None) -> list[float]:
        ids = torch.tensor([prompt + output])
        with torch.no_grad():
            logits = (model or reference)(ids, use_cache=False).logits[0].float()
        lps = torch.log_softmax(logits, dim=-1)
        return [float(lps[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]

    return fn
