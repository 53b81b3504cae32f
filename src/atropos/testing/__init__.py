"""Test parts that ship with the package: loopback servers, a fake inference server, a tokenizer.

`load_script` imports a script outside the package (a benchmark) for its tests. `free_port`
(from `atropos.net`) and `tiny_tokenizer_path` (`atropos.tiny.tokenizer_path`) are
re-exported here for tests and env authors; library code imports them from their homes.

`FakeInferenceServer` (from `atropos.testing.fake_server`) is re-exported lazily, so importing
this package pulls in neither transformers nor the tokenizer.

>>> from starlette.applications import Starlette
>>> with serve_in_thread(Starlette()) as url:
...     url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atropos.net import free_port
from atropos.testing.scripts import load_script
from atropos.testing.serve import answer_lifespan, send_head, serve_in_thread
from atropos.tiny import tokenizer_path

if TYPE_CHECKING:
    from atropos.testing.fake_server import FakeInferenceServer

__all__ = [
    "answer_lifespan",
    "FakeInferenceServer",
    "free_port",
    "load_script",
    "send_head",
    "serve_in_thread",
    "tiny_tokenizer_path",
]


def tiny_tokenizer_path() -> str:
    """The directory of the tiny ChatML tokenizer (`atropos.tiny.tokenizer_path()`).

    >>> import os
    >>> os.path.isfile(os.path.join(tiny_tokenizer_path(), "tokenizer.json"))
    True
    """
    return tokenizer_path()


def __getattr__(name: str) -> Any:
    if name == "FakeInferenceServer":
        from atropos.testing.fake_server import FakeInferenceServer

        return FakeInferenceServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
