"""`--env.harness COMMAND`: any program as a harness (a name that is not registered is a
command). It runs under `/bin/sh -c` in the repository and reads its session from the usual
variables: `OPENAI_BASE_URL` (`.../s/ID/v1`), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`
(`.../s/ID`), `ANTHROPIC_API_KEY`, `ATROPOS_MODEL`, and the task in `ATROPOS_INSTRUCTION`.
Nothing is installed: the program must be reachable inside the sandbox (bubblewrap over the
host's root sees the host's programs; mount yours otherwise). Its exit is read the common way
(`default_outcome`)."""

from __future__ import annotations

from typing import ClassVar

from atropos.harnesses.base import Harness, HarnessCall, Installed

__all__ = ["CommandHarness"]


class CommandHarness(Harness):
    """A shell command run as the harness."""

    name: ClassVar[str] = "command"
    dialect: ClassVar[str] = "openai"
    version: ClassVar[str] = "-"

    def __init__(self, command: str) -> None:
        if not command.strip():
            raise ValueError("--env.harness is empty: give a harness name or a command")
        self.shell = command

    def install(self) -> Installed:
        return Installed()

    def environment(self, call: HarnessCall) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": call.base_url,
            "OPENAI_API_KEY": call.api_key,
            "ANTHROPIC_BASE_URL": call.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": call.api_key,
            "ATROPOS_MODEL": call.model,
            "ATROPOS_INSTRUCTION": call.instruction,
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }

    def command(self, call: HarnessCall) -> list[str]:
        return ["/bin/sh", "-c", self.shell]
