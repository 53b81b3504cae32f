"""`swe_patch`: fix an issue in a small code file with SEARCH/REPLACE edit blocks, scored by how
close the edited file comes to the oracle fix.

An item is a file (`path`, `code`), an issue, and the oracle fix: SEARCH/REPLACE blocks
(`oracle`) or the fixed file (`fixed_code`). The policy answers with blocks after its think
block (`edits.py`); they are applied to the file, the oracle's to the same file, and the reward
compares the two results: 1.0 when they are equal, else difflib's ratio between the two
changes (lines removed and added), 0.0 for no blocks, a malformed or unappliable one, or no
change. Upstream compared the patch texts; comparing results scores the same fix written with
other SEARCH spans the same. Metrics: `train/similarity`, `train/exact_rate`,
`train/applied_rate`, `errors/unappliable_rate`, `errors/no_edit_rate`, and the same under
`eval/`. Data: nine tasks written by us (each oracle checked to fix its file by the `check`
code beside it), or any dataset of the same fields with `--env.dataset_name`. Details:
docs/formats.md.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, ClassVar

from atropos.environments.common.completions import THINKING_DEFAULTS, answer_part, conversation
from atropos.environments.common.data_loading import in_prompt
from atropos.environments.common.demo import Alternating, shipped_rows, with_thinking
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv
from atropos.environments.swe_patch.edits import (
    DIVIDER,
    REPLACE,
    SEARCH,
    Outcome,
    apply_edits,
    judge_edits,
    read_edits,
)
from atropos.envs.simple import Rollout
from atropos.envs.types import Message

__all__ = ["SwePatch", "SwePatchConfig", "demo_responder", "instructions"]

_LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".go": "go", ".rs": "rust"}


def instructions(path: str) -> str:
    """How to write the edit blocks for the file `path`."""
    return (
        "Fix the issue by editing the file with SEARCH/REPLACE blocks, in this form:\n\n"
        f"{path}\n{SEARCH}\n(lines copied exactly from the file)\n{DIVIDER}\n"
        f"(the lines to put in their place)\n{REPLACE}\n\n"
        "Each SEARCH part must match exactly one place in the file, indentation included."
        " Use as many blocks as you need; they apply in order."
    )


class SwePatchConfig(HeldOutConfig):
    """`swe_patch`'s settings."""


class SwePatch(HeldOutEnv[SwePatchConfig]):
    """Fix an issue in a small file with SEARCH/REPLACE blocks; similarity to the oracle fix."""

    name = "swe_patch"
    config_defaults: ClassVar[dict[str, Any]] = {**THINKING_DEFAULTS}

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        missing = [k for k in ("path", "code", "issue") if not str(row.get(k) or "").strip()]
        if missing or not (row.get("oracle") or row.get("fixed_code")):
            raise ValueError(f"{where}: needs path, code, issue, and oracle or fixed_code")
        fixed = row.get("fixed_code")
        if not fixed:
            edits = read_edits(row["oracle"])
            fixed = apply_edits(row["code"], edits or [], row["path"]) if edits else None
        if fixed is None or fixed == row["code"]:
            raise ValueError(f"{where}: its oracle does not apply to its code, or changes nothing")
        return {**row, "id": str(row.get("id") or where), "fixed": fixed}

    def prompt(self, item: Any) -> list[Message]:
        path = item["path"]
        language = _LANGUAGES.get(PurePosixPath(path).suffix, "")
        text = (
            f"Here is the file `{path}`:\n\n```{language}\n{item['code']}```\n\n"
            f"Issue:\n{item['issue']}\n\n{instructions(path)}"
        )
        return conversation(self.config, text)

    def judge(self, item: dict[str, Any], completion: str) -> Outcome:
        """The outcome of one completion's edits."""
        body = answer_part(completion, self.config.thinking_mode)
        return judge_edits(body, item["code"], item["path"], item["fixed"])

    def score(self, item: Any, completion: str) -> float:
        return self.judge(item, completion).score

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        statuses = [self.judge(item, r.text).status for r in rollouts]
        self.record_mean("train/similarity", scores)
        for name, counted in _RATES.items():
            key = f"errors/{name}" if name in _ERRORS else f"train/{name}"
            self.record_mean(key, (float(s in counted) for s in statuses))
        return self.unless_all_equal(scores)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        return {"id": item["id"], "path": item["path"], "issue": item["issue"],
                "status": self.judge(item, r.text).status, "completion": r.text,
                "finish_reason": r.finish_reason, "score": score}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Mean similarity and the share of each outcome."""
        n = len(samples)
        found = {"eval/similarity": sum(s["score"] for s in samples) / n}
        for name, counted in _RATES.items():
            found[f"eval/{name}"] = sum(s["status"] in counted for s in samples) / n
        return found


_RATES = {  # metric -> the outcomes it counts
    "exact_rate": {"exact"},
    "applied_rate": {"exact", "applied"},
    "unappliable_rate": {"unappliable"},
    "no_edit_rate": {"no_edits", "malformed"},
}
_ERRORS = {"unappliable_rate", "no_edit_rate"}  # logged under errors/ in training
_turns = Alternating()


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: on every other call the oracle's
    blocks, on the others a block that applies but only adds a comment to the file's first
    line; None (random text) for other prompts. `python -m atropos.testing.fake_server --port
    9001 --responder atropos.environments.swe_patch:demo_responder`."""
    row = in_prompt(shipped_rows("swe_patch", "issue"), prompt_text)
    if row is None:
        return None
    if _turns.right():
        body = str(row["oracle"])
    else:
        first = row["code"].splitlines(keepends=True)[0]
        body = f"{row['path']}\n{SEARCH}\n{first}{DIVIDER}\n{first.rstrip()}  # fixed\n{REPLACE}\n"
    return with_thinking(prompt_text, "I change only the lines the issue is about.", body)
