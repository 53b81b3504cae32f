"""mini-SWE-agent (PyPI `mini-swe-agent`): its bash-only loop, every step one `bash` tool
call run in the repository, until the model runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.

Installed in a venv of the system's Python under the harness cache, bound at the same path in
the sandbox. Run headless through its own CLI, `python -m minisweagent.run.mini` (`mini`):
`--agent-class default` (its non-interactive agent: no confirmation, no prompt at the end),
`-y`, `--exit-immediately`, the task with `-t`, and a config file (`mini.yaml`, the shipped
one, merged with ours): the model through litellm as `openai/<model>` with `api_base` the
session's OpenAI base URL and `api_key` its key; the step limit the rollout's turn limit; the
cost limit off and `cost_tracking: ignore_errors` (litellm knows no price for our model,
which would otherwise end the run); litellm's cost map read locally (no fetch at import);
mini's first-run setup prompt and startup banner off; one try per call (a refusal of the
proxy is final, not retried ten times with backoff).

Its exit: the trajectory file's `exit_status`, printed after the run on a marked line:
`Submitted` is ok, `LimitsExceeded` a limit (scored), `RepeatedFormatError` the policy's
(scored: it made no tool call three times running); anything else, or a non-zero exit, is a
failure (`exit_nonzero`)."""

from __future__ import annotations

import json
import shlex
from typing import ClassVar

from atropos.harnesses.base import (
    Harness,
    HarnessCall,
    HarnessExit,
    Installed,
    default_outcome,
    tail,
)
from atropos.harnesses.cache import python_venv
from atropos.sandbox import ExecResult

__all__ = ["MiniSweAgent"]

MARK = "@@atropos-mini-swe-agent@@"
_SCORED = {"Submitted": "ok", "LimitsExceeded": "limit", "RepeatedFormatError": "format_errors"}
_REPORT = (
    "import json, sys\n"
    "info = json.load(open(sys.argv[1])).get('info', {})\n"
    "print(json.dumps({'exit_status': info.get('exit_status'),"
    " 'submission': info.get('submission')}))"
)


class MiniSweAgent(Harness):
    """mini-SWE-agent, the model an OpenAI-compatible endpoint through litellm."""

    name: ClassVar[str] = "mini-swe-agent"
    dialect: ClassVar[str] = "openai"
    version: ClassVar[str] = "2.4.6"

    def install(self) -> Installed:
        folder = python_venv(self.name, f"mini-swe-agent=={self.version}", self.version)
        return Installed(mounts={str(folder): folder}, path=[f"{folder}/bin"])

    def files(self, call: HarnessCall) -> dict[str, bytes]:
        config = {
            "agent": {
                "step_limit": call.max_turns or 0,
                "cost_limit": 0,
                "wall_time_limit_seconds": 0,
                "output_path": f"{call.home}/trajectory.json",
            },
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{call.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": call.base_url,
                    "api_key": call.api_key,
                    "max_retries": 0,  # the openai client would retry a refusal twice
                },
            },
            "environment": {"environment_class": "local", "cwd": call.workdir, "timeout": 60},
        }
        # YAML is a superset of JSON: mini reads this file as YAML
        return {f"{call.home}/atropos-mini.yaml": json.dumps(config, indent=1).encode()}

    def environment(self, call: HarnessCall) -> dict[str, str]:
        return {
            "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{call.home}/.config/mini-swe-agent",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list at import
            "OPENAI_API_KEY": call.api_key,
            "OPENAI_BASE_URL": call.base_url,
            "PAGER": "cat",
        }

    def command(self, call: HarnessCall) -> list[str]:
        trajectory = f"{call.home}/trajectory.json"
        mini = [
            "python", "-m", "minisweagent.run.mini", "--agent-class", "default", "-y",
            "--exit-immediately", "-t", call.instruction, "-o", trajectory,
            "-c", "mini.yaml", "-c", f"{call.home}/atropos-mini.yaml",
        ]  # fmt: skip
        script = (
            f"{shlex.join(mini)}; code=$?; echo; echo {MARK}; "
            f"python -c {shlex.quote(_REPORT)} {shlex.quote(trajectory)}; exit $code"
        )
        return ["/bin/sh", "-c", script]

    def outcome(self, result: ExecResult, calls_made: int) -> HarnessExit:
        if result.timed_out or calls_made == 0:
            return default_outcome(result, calls_made)
        report = _report(result.stdout.decode(errors="replace"))
        status = str(report.get("exit_status") or "")
        detail = f"exit_status {status or '?'}, exit {result.exit_code}: " + (
            tail(result.stderr) or tail(result.stdout)
        )
        if result.exit_code == 0 and status in _SCORED:
            return HarnessExit(True, _SCORED[status], detail, str(report.get("submission") or ""))
        return HarnessExit(False, "exit_nonzero", detail)


def _report(stdout: str) -> dict[str, object]:
    """The marked line's JSON (empty when the run wrote no trajectory)."""
    _, mark, after = stdout.rpartition(MARK)
    if not mark:
        return {}
    try:
        report = json.loads(after.strip().splitlines()[0])
    except (ValueError, IndexError):
        return {}
    return report if isinstance(report, dict) else {}
