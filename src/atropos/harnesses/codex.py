"""The Codex CLI harness (`@openai/codex`): `codex exec --json` headless on the task, its model
provider pointed at the rollout proxy's session over the Responses API.

- **Install**: `npm install @openai/codex@VERSION` once into
  `~/.cache/atropos/harnesses/codex-VERSION` (atropos.harnesses.cache); the package carries
  a static (musl) native binary per platform, so only its vendor folder is mounted, at
  `/opt/codex`, and the sandbox runs `codex` without node. `bin/` holds `codex`, `codex-path/`
  the `rg` it calls.
- **Config**: `$CODEX_HOME/config.toml` (`CODEX_HOME` = `HOME/.codex`): a provider `atropos`
  with `base_url` the session's `/v1` URL, `wire_api = "responses"`, the key read from
  `ATROPOS_SESSION_KEY`, no retries (a refused call, such as a session limit, is final); approval
  `never` and Codex's own sandbox off (`danger-full-access`, `--dangerously-bypass-approvals-and-
  sandbox`: the sandbox is ours); no web search, update check, analytics, feedback, history,
  OpenTelemetry export, sub-agents, apps, plugins, image generation, shell snapshot, nor
  unbounded reconnects (an unreachable model otherwise waits forever). `--strict-config` makes a
  Codex that no longer knows one of these keys fail at start, not silently ignore it.
- **Exit**: `--json` prints one event per line; the last `agent_message` is the output, a
  `turn.failed` or `error` event says why a turn ended. Reasons: `timeout` (the exec's
  deadline), `limit` (the proxy refused a call past the session's turns, tokens or seconds, or
  cut an answer at the tokens the session had left, which Codex reports as an incomplete
  response: not a failure, the work is scored as it stands; Codex sends no token limit of its
  own),
  `model_error` (another refused or broken model call), `approval` (a command was declined for
  want of approval), `exit_nonzero`, `crashed` (killed by a signal), `no_model_call`.

What Codex sends (0.171.0): `POST {base_url}/responses` with `stream: true`, `store: false`,
the whole conversation replayed as `input` each turn (developer messages, `function_call`
and `function_call_output` items; never `previous_response_id`), `instructions` empty, `tools`
(`exec_command`, `write_stdin`, `request_user_input`, `view_image`), `tool_choice: auto`,
`parallel_tool_calls: true`, `reasoning: {summary: auto}`, `include:
["reasoning.encrypted_content"]`, `prompt_cache_key` and `client_metadata`. Edits go through
`exec_command` (`apply_patch <<'EOF' ...` there is run by Codex itself).
"""

from __future__ import annotations

import json
import platform
from typing import Any

from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed, tail
from atropos.harnesses.cache import HarnessInstallError, npm_package
from atropos.sandbox import ExecResult

__all__ = ["Codex", "config_toml", "read_events"]

PACKAGE = "@openai/codex"
INSIDE = "/opt/codex"  # where the native vendor folder is mounted
KEY_VARIABLE = "ATROPOS_SESSION_KEY"
_TRIPLES = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}
_PLATFORM_PACKAGES = {
    "x86_64-unknown-linux-musl": "codex-linux-x64",
    "aarch64-unknown-linux-musl": "codex-linux-arm64",
}
_LIMIT_WORDS = (
    "reached max_turns",
    "reached max_tokens",
    "reached max_seconds",
    "reason: max_output_tokens",  # its answer cut at the tokens the session had left
)


class Codex(Harness):
    """OpenAI's Codex CLI, run as `codex exec --json` against the session's Responses API."""

    name = "codex"
    dialect = "responses"
    version = "0.171.0"

    def install(self) -> Installed:
        triple = _TRIPLES.get(platform.machine())
        if triple is None or platform.system() != "Linux":
            raise HarnessInstallError(
                f"the codex harness runs on Linux x86_64 or aarch64, not {platform.system()} "
                f"{platform.machine()}"
            )
        folder = npm_package(self.name, PACKAGE, self.version)
        vendor = (
            folder / "node_modules" / "@openai" / _PLATFORM_PACKAGES[triple] / "vendor" / triple
        )
        if not (vendor / "bin" / "codex").is_file():
            raise HarnessInstallError(
                f"{PACKAGE}@{self.version} in {folder} lacks its native binary "
                f"{vendor}/bin/codex (npm skipped the optional platform package?): remove "
                f"{folder} and install again"
            )
        return Installed(mounts={INSIDE: vendor}, path=[f"{INSIDE}/bin", f"{INSIDE}/codex-path"])

    def files(self, call: HarnessCall) -> dict[str, bytes]:
        return {f"{call.home}/.codex/config.toml": config_toml(call).encode()}

    def environment(self, call: HarnessCall) -> dict[str, str]:
        return {
            "HOME": call.home,
            "CODEX_HOME": f"{call.home}/.codex",
            KEY_VARIABLE: call.api_key,
            "NO_COLOR": "1",
            "OTEL_SDK_DISABLED": "true",
        }

    def command(self, call: HarnessCall) -> list[str]:
        return [
            "codex",
            "exec",
            "--json",
            "--strict-config",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--ephemeral",
            "--color",
            "never",
            "--cd",
            call.workdir,
            "--model",
            call.model,
            "--",
            call.instruction,
        ]

    def outcome(self, result: ExecResult, calls_made: int) -> HarnessExit:
        events = read_events(result.stdout)
        messages = [
            _item(e).get("text", "") for e in events if _item(e).get("type") == "agent_message"
        ]
        output = messages[-1] if messages else ""
        failures = [_failure(e) for e in events if e.get("type") in ("turn.failed", "error")]
        failure = next((f for f in reversed(failures) if f), "")
        detail = "\n".join(filter(None, [failure, tail(result.stderr, 1500)]))
        if result.timed_out:
            return HarnessExit(False, "timeout", detail or tail(result.stdout), output)
        if any(word in failure for word in _LIMIT_WORDS):  # not a failure: scored as it stands
            return HarnessExit(True, "limit", detail, output)
        if any(_declined(e) for e in events):
            return HarnessExit(False, "approval", detail, output)
        if result.exit_code < 0 or result.exit_code > 128:
            return HarnessExit(False, "crashed", f"exit {result.exit_code}: {detail}", output)
        if calls_made == 0:
            return HarnessExit(False, "no_model_call", detail or tail(result.stdout), output)
        if failure and any(e.get("type") == "turn.failed" for e in events):
            return HarnessExit(False, "model_error", detail, output)
        if result.exit_code != 0:
            return HarnessExit(False, "exit_nonzero", f"exit {result.exit_code}: {detail}", output)
        return HarnessExit(True, "ok", detail, output)


def config_toml(call: HarnessCall) -> str:
    """`$CODEX_HOME/config.toml` for one run (TOML basic strings are JSON's)."""

    def q(text: str) -> str:
        return json.dumps(text)

    return f"""\
model = {q(call.model)}
model_provider = "atropos"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.atropos]
name = "atropos rollout proxy"
base_url = {q(call.base_url)}
env_key = "{KEY_VARIABLE}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = {max(1000, int(call.timeout * 1000))}

[features]
shell_snapshot = false
goals = false
apps = false
plugins = false
image_generation = false
tool_suggest = false
memories = false
unbounded_connection_retries = false

[agents]
enabled = false

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"

[otel]
exporter = "none"
"""


def read_events(stdout: bytes) -> list[dict[str, Any]]:
    """The JSON events of `codex exec --json`'s stdout (lines that are not JSON objects are
    skipped: a crash may cut the last one)."""
    events = []
    for line in stdout.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _item(event: dict[str, Any]) -> dict[str, Any]:
    item = event.get("item") if event.get("type") == "item.completed" else None
    return item if isinstance(item, dict) else {}


def _failure(event: dict[str, Any]) -> str:
    """The message of a `turn.failed` or `error` event; the proxy's JSON error unwrapped."""
    source = event.get("error") if event.get("type") == "turn.failed" else event
    message = source.get("message") if isinstance(source, dict) else None
    if not isinstance(message, str):
        return ""
    try:
        inner = json.loads(message)
    except ValueError:
        return message
    error = inner.get("error") if isinstance(inner, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return message


def _declined(event: dict[str, Any]) -> bool:
    """A command or patch Codex did not run for want of approval."""
    item = _item(event)
    return item.get("type") in ("command_execution", "file_change") and item.get("status") in (
        "declined",
        "rejected",
    )
