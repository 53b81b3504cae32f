"""Providers by name: `open_sandbox(spec, provider)` starts one and hands it back started."""

from __future__ import annotations

from atropos.sandbox._local import LocalSandbox
from atropos.sandbox.bubblewrap import BubblewrapSandbox
from atropos.sandbox.process import ProcessSandbox
from atropos.sandbox.spec import SandboxError, SandboxSpec

PROVIDERS: dict[str, type[LocalSandbox]] = {
    "bubblewrap": BubblewrapSandbox,
    "process": ProcessSandbox,
}
LATER = {"docker": "the docker provider comes with the Docker engine work"}


async def open_sandbox(
    spec: SandboxSpec, provider: str = "bubblewrap", start_timeout: float = 30.0
) -> LocalSandbox:
    """A started sandbox of `provider`; raises `SandboxError` (reason start_failed,
    start_timeout, unsupported or unavailable) when it cannot be had."""
    if provider not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS))
        why = LATER.get(provider, "no such provider")
        raise SandboxError("unavailable", f"provider {provider!r}: {why}; available: {known}")
    return await PROVIDERS[provider](spec).start(start_timeout)
