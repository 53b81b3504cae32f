"""What the vLLM-facing tests share: the served name, the context, `Target` (a running server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager

MODEL = "atropos-tiny"
MAX_MODEL_LEN = 4096  # both servers' context (the local server's default, VLLMServer's)


@dataclass(frozen=True)
class Target:
    """A running server of the tiny policy: its name in test ids and its OpenAI base URL."""

    name: str
    base_url: str

    def config(self, **fields: Any) -> APIServerConfig:
        """Our client's configuration of this server (server_type "vllm")."""
        fields = {"server_type": "vllm", "model_name": MODEL, **fields}
        return APIServerConfig(base_url=self.base_url, **fields)

    def manager(self, tokenizer: Any = None, **manager: Any) -> ServerManager:
        """A `ServerManager` over this server alone (quick probes, a 60 s deadline per call)."""
        settings = ServerManagerConfig(
            **{"health_check_interval": 0.5, "deadline": 60.0, **manager}
        )
        return ServerManager([self.config()], settings, tokenizer=tokenizer)
