"""vLLM's runtime LoRA endpoints for `FakeInferenceServer`: load, unload, list, and a history.

- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: the path must be a directory holding
  `adapter_config.json` (the weights are not read). 200 with vLLM's plain-text line
  `Success: LoRA adapter 'NAME' added successfully.`; 400 `InvalidUserInput` when a field is
  missing or the name is taken; 404 `NotFoundError` ("No adapter found ...") for a bad path.
- `POST /v1/unload_lora_adapter {"lora_name"}`: 200 `Success: LoRA adapter 'NAME' removed
  successfully.`; 404 for an unknown name.
- `GET /v1/models` lists each loaded adapter after the base model (`parent` = the base).

Generation requests may name an adapter as `model` (the fake answers any model name). Tests read
`server.lora.adapters` (name -> path) and `server.lora.history` (every successful load and
unload, in order). Source: vLLM docs, "LoRA Adapters" (dynamically serving LoRA adapters),
https://docs.vllm.ai/en/latest/features/lora.html, and `vllm/entrypoints/openai/serving_models.py`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


@dataclass(frozen=True)
class LoraEvent:
    """One successful call: `action` is "load" or "unload"; `path` is None for unloads."""

    action: str
    name: str
    path: str | None = None


def _error(status: int, message: str, param: str | None, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


async def _body(request: Request) -> dict[str, Any] | None:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class FakeLora:
    """The adapters a fake server has loaded, and the routes that change them."""

    def __init__(self) -> None:
        """No adapter loaded, empty history."""
        self.adapters: dict[str, str] = {}
        self.history: list[LoraEvent] = []

    def routes(self) -> list[Route]:
        """The two POST routes, to add to the server's app."""
        return [
            Route("/v1/load_lora_adapter", self._load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", self._unload, methods=["POST"]),
        ]

    def cards(self, base: str, created: int) -> list[dict[str, Any]]:
        """`/v1/models` entries for the loaded adapters."""
        return [
            {"id": name, "object": "model", "created": created, "owned_by": "atropos-fake"}
            | {"root": path, "parent": base}
            for name, path in self.adapters.items()
        ]

    async def _load(self, request: Request) -> Response:
        body = await _body(request) or {}
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            missing = "lora_name" if not isinstance(name, str) or not name else "lora_path"
            message = "Both 'lora_name' and 'lora_path' must be provided."
            return _error(400, message, missing, "InvalidUserInput")
        if name in self.adapters and body.get("load_inplace") is not True:
            message = f"The lora adapter '{name}' has already been loaded."
            return _error(400, message, "lora_name", "InvalidUserInput")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            message = f"No adapter found for {path!r}: no adapter_config.json there"
            return _error(404, message, "lora_path", "NotFoundError")
        self.adapters[name] = path
        self.history.append(LoraEvent("load", name, path))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, request: Request) -> Response:
        body = await _body(request) or {}
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return _error(400, "lora_name must be provided.", "lora_name", "InvalidUserInput")
        if name not in self.adapters:
            message = f"The lora adapter '{name}' cannot be found."
            return _error(404, message, "lora_name", "NotFoundError")
        del self.adapters[name]
        self.history.append(LoraEvent("unload", name))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
