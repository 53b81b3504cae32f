"""Claude Code (`@anthropic-ai/claude-code`, pinned) as a harness: `claude -p` headless, its
Anthropic Messages calls pointed at the rollout proxy's session.

- **Install**: `npm install --prefix <harness cache>/claude-code-<version>
  @anthropic-ai/claude-code@<version>` (atropos.harnesses.cache.npm_package); npm's platform
  package carries a native binary (Node is not needed to run it; a glibc one on glibc hosts).
  The folder is bound read-only at `/opt/atropos/claude-code` and `claude` is run by its path
  there.
- **Pointed at the session**: `ANTHROPIC_BASE_URL` (the session's `/s/<id>` root) and
  `ANTHROPIC_API_KEY` (sent as `x-api-key`); `--model` and every model it might pick for
  background or sub-agent work (`ANTHROPIC_SMALL_FAST_MODEL`, the haiku/sonnet/opus defaults,
  `CLAUDE_CODE_SUBAGENT_MODEL`) are the policy, so every call it makes lands in the session.
- **Nothing else on the network**: non-essential traffic, telemetry, error reporting and the
  auto-updater off; the attribution header (a version line it prepends to the system prompt)
  off, so the policy's prompt holds only what the agent says.
- **Headless permissions**: `--dangerously-skip-permissions` with `IS_SANDBOX=1` (what 2.1.332
  checks before refusing the flag as root, exit 1). The sandbox is the boundary.
- **Exit**: `--output-format stream-json --verbose` writes one JSON event per line; the last
  `result` event says how it ended. Read in this order: a deadline is `timeout`; a signal
  `crashed`; a tool call denied for want of approval (`permission_denials`) `approval`; no model
  call `no_model_call`; no result event `no_result` (or `exit_nonzero`); an API error it gave up
  on `model_error`; another error or non-zero exit `exit_nonzero`. A limit is not a failure
  (atropos.harnesses.run scores the work as it stands): its own turn limit (`--max-turns`, from
  `HarnessCall.max_turns`) or the proxy refusing a call past the session's limits (the error
  names `reached max_...`) ends the run ok, reason `limit`.

Choices where the task is silent: the tool set is Claude Code's default unless `tools` names
one (`"Bash,Edit,Read,Write"`: a smaller prompt); transcripts are not kept
(`--no-session-persistence`: a rollout is never resumed).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed, tail
from atropos.harnesses.cache import npm_package
from atropos.sandbox import ExecResult

__all__ = ["ClaudeCode", "last_result"]

PACKAGE = "@anthropic-ai/claude-code"
VERSION = "2.1.332"
MOUNT = "/opt/atropos/claude-code"
_BIN = "node_modules/.bin/claude"
_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    "IS_SANDBOX": "1",
}
_MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


class ClaudeCode(Harness):
    """Claude Code, headless. `tools`: the built-in tools it offers (`--tools`, e.g.
    `"Bash,Edit,Read,Write"`); None keeps its default set."""

    name: ClassVar[str] = "claude-code"
    dialect: ClassVar[str] = "anthropic"
    version: ClassVar[str] = VERSION

    def __init__(self, tools: str | None = None) -> None:
        self.tools = tools

    def install(self) -> Installed:
        """Install once into the harness cache (a no-op when there); HarnessInstallError
        naming what to do when npm is missing or fails."""
        target = npm_package(self.name, PACKAGE, self.version)
        return Installed(mounts={MOUNT: target}, path=[f"{MOUNT}/node_modules/.bin"])

    def files(self, call: HarnessCall) -> dict[str, bytes]:
        # onboarding marked done: no first-run questions whatever the mode
        state = {"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True}
        return {f"{call.home}/.claude.json": json.dumps(state).encode()}

    def environment(self, call: HarnessCall) -> dict[str, str]:
        env = {
            "HOME": call.home,
            "ANTHROPIC_BASE_URL": call.base_url,
            "ANTHROPIC_API_KEY": call.api_key,
            **dict.fromkeys(_MODEL_VARS, call.model),
            **_QUIET,
        }
        return env

    def command(self, call: HarnessCall) -> list[str]:
        argv = [f"{MOUNT}/{_BIN}", "-p", "--output-format", "stream-json", "--verbose"]
        argv += ["--model", call.model, "--dangerously-skip-permissions"]
        argv += ["--no-session-persistence"]
        if call.max_turns is not None:
            argv += ["--max-turns", str(call.max_turns)]
        if self.tools is not None:
            argv += ["--tools", self.tools]
        return [*argv, "--", call.instruction]

    def outcome(self, result: ExecResult, calls_made: int) -> HarnessExit:
        final = last_result(result.stdout)
        detail = tail(result.stderr, 1500)
        if final is not None and isinstance(final.get("result"), str):
            detail = f"{final['result'][-500:]}\n{detail}".strip()
        if result.timed_out:
            return HarnessExit(False, "timeout", detail or tail(result.stdout))
        if result.exit_code < 0:
            return HarnessExit(False, "crashed", f"signal {-result.exit_code}: {detail}")
        if final is not None and final.get("permission_denials"):
            denied = [d.get("tool_name") for d in final["permission_denials"]]
            return HarnessExit(False, "approval", f"denied for want of approval: {denied}")
        if calls_made == 0:
            return HarnessExit(False, "no_model_call", detail or tail(result.stdout))
        if final is None:
            reason = "exit_nonzero" if result.exit_code else "no_result"
            return HarnessExit(False, reason, detail or tail(result.stdout))
        output = str(final.get("result") or "")
        if final.get("terminal_reason") == "max_turns" or final.get("subtype") == "error_max_turns":
            return HarnessExit(True, "limit", detail, output)  # its own --max-turns
        if final.get("api_error_status") is not None:
            if "reached max_" in output:  # the proxy refused a call past the session's limits
                return HarnessExit(True, "limit", detail, output)
            return HarnessExit(False, "model_error", detail)
        if final.get("is_error") or result.exit_code != 0:
            return HarnessExit(False, "exit_nonzero", f"exit {result.exit_code}: {detail}")
        return HarnessExit(True, "ok", detail, output)


def last_result(stdout: bytes) -> dict[str, Any] | None:
    """The last `{"type": "result"}` event of stream-json output (None when there is none)."""
    found = None
    for line in stdout.splitlines():
        if not line.startswith(b"{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("type") == "result":
            found = event
    return found
