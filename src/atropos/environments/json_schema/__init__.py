"""`json_schema`: write JSON that validates against a pydantic model, or fix an almost-valid one.

Each item names one of the shipped models (`schemas.SCHEMAS`: nested objects, lists, enums,
optional fields, constraints; `--env.schema_module` adds a user's own) and a request ("a paid
order of two notebooks..."). The prompt shows the model's JSON Schema. A `generate` task asks
for a new object; a `fix` task (upstream's error-introduction mode) shows the row's valid
example broken by 1 to `max_errors` seeded mistakes (`corrupt.py`: type changes, a missing
required field, enum and constraint violations, an unknown key) and asks for it fixed.
`--env.task mixed` (the default) draws `fix` with probability `fix_share`.

The answer is the JSON in the one `<json_output>` block after the think block (`checks.py`),
validated by the model in JSON mode. Score: a valid object 1.0 (a fix: `1 - keep_weight` plus
`keep_weight` times the share of the untouched values it kept, so rewriting the object is
not a fix); an invalid one `partial_credit` times the share of top-level fields without an
error (0 by default: validation is 1/0); no JSON 0. Metrics: `train/valid_rate` overall, per
task and per schema, `train/kept_share` of valid fixes, `errors/no_json_rate`, and the same
under `eval/`. Details: docs/formats.md.
"""

from __future__ import annotations

import functools
import importlib
import json
import random
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from atropos.environments.common.completions import THINKING_DEFAULTS, answer_part, conversation
from atropos.environments.common.data_loading import in_prompt
from atropos.environments.common.demo import Alternating, shipped_rows, with_thinking
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv
from atropos.environments.common.selection import named_subset
from atropos.environments.json_schema.checks import json_text, judge, kept_share
from atropos.environments.json_schema.corrupt import KINDS, corrupt
from atropos.environments.json_schema.schemas import SCHEMAS
from atropos.envs.simple import Rollout
from atropos.envs.types import Message

__all__ = ["SCHEMAS", "JsonSchema", "JsonSchemaConfig", "available_schemas", "demo_responder"]


def available_schemas(module: str | None = None) -> dict[str, type[BaseModel]]:
    """The shipped models, and those of `module`'s `SCHEMAS` dict (name -> pydantic model)."""
    if module is None:
        return dict(SCHEMAS)
    found = getattr(importlib.import_module(module), "SCHEMAS", None)
    if not isinstance(found, dict) or not all(
        isinstance(m, type) and issubclass(m, BaseModel) for m in found.values()
    ):
        raise ValueError(f"{module} needs a SCHEMAS dict of name -> pydantic model")
    return {**SCHEMAS, **found}


@functools.cache
def schema_text(model: type[BaseModel]) -> str:
    """The model's JSON Schema as the prompt shows it (indented; pydantic's generated titles
    left out)."""

    def bare(node: Any, names: bool = False) -> Any:
        if isinstance(node, dict):
            return {
                k: bare(v, k == "properties")
                for k, v in node.items()
                if names or not (k == "title" and isinstance(v, str))
            }
        return [bare(v) for v in node] if isinstance(node, list) else node

    return json.dumps(bare(model.model_json_schema()), indent=2, ensure_ascii=False)


class JsonSchemaConfig(HeldOutConfig):
    """`json_schema`'s settings."""

    task: Literal["generate", "fix", "mixed"] = Field(
        default="mixed", description="write new objects, fix broken ones, or both"
    )
    fix_share: float = Field(default=0.5, ge=0, le=1, description="share of fix tasks in mixed")
    schemas: list[str] = Field(
        default_factory=list, description="models to use, as 'Order,Book' (unset: all)"
    )
    schema_module: str | None = Field(
        default=None, description="module whose SCHEMAS dict adds the user's own models"
    )
    error_types: list[str] = Field(
        default_factory=lambda: list(KINDS), description="mistakes fix tasks may hold"
    )
    max_errors: int = Field(default=2, ge=1, le=5, description="most mistakes in a fix task")
    partial_credit: float = Field(
        default=0.0, ge=0, lt=1, description="an invalid object's score: this x valid-field share"
    )
    keep_weight: float = Field(
        default=0.5, ge=0, le=1, description="share of a fix's score for keeping the rest"
    )

    @field_validator("schemas", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        )

    @field_validator("error_types", mode="before")
    @classmethod
    def _known_kinds(cls, value: Any) -> list[str]:
        return named_subset(value, KINDS, "error type")

    @model_validator(mode="after")
    def _known_schemas(self) -> JsonSchemaConfig:
        self.schemas = named_subset(self.schemas, available_schemas(self.schema_module), "schema")
        return self


@dataclass(frozen=True)
class Assessment:
    """One answer judged: JSON found, valid, the share of untouched values kept (fixes), and
    its score."""

    found: bool
    valid: bool
    kept: float | None
    score: float


class JsonSchema(HeldOutEnv[JsonSchemaConfig]):
    """JSON that validates against a pydantic model: written new, or fixed."""

    name = "json_schema"
    config_defaults: ClassVar[dict[str, Any]] = {**THINKING_DEFAULTS}

    @functools.cached_property
    def models(self) -> dict[str, type[BaseModel]]:
        """The models items may name."""
        return available_schemas(self.config.schema_module)

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        model = self.models.get(str(row.get("schema")))
        if model is None or not str(row.get("request") or "").strip():
            raise ValueError(f"{where}: needs a 'request' and a 'schema' among {list(self.models)}")
        try:
            model.model_validate_json(json.dumps(row.get("example")))
        except ValidationError as e:
            raise ValueError(f"{where}: its example is not a valid {model.__name__}: {e}") from None
        return {**row, "id": str(row.get("id") or where)}

    def load_split(self, split: str) -> list[dict[str, Any]]:
        rows = super().load_split(split)
        return [row for row in rows if row["schema"] in self.config.schemas]

    def load_eval(self) -> list[dict[str, Any]]:
        """Each test row twice: a generate task and a fix task (seeded by the row's id)."""
        rows = self.load_split("test")
        return [
            self.make_item(r, task, f"eval:{r['id']}") for r in rows for task in ("generate", "fix")
        ]

    async def setup(self) -> None:
        await super().setup()
        self._drawn = getattr(self, "_drawn", 0)

    async def get_next_item(self) -> dict[str, Any]:
        row, s = self._passes.next(), self.config
        self._drawn += 1
        rng = random.Random(f"{self.seed}:{self._drawn}")
        fix = s.task == "fix" or (s.task == "mixed" and rng.random() < s.fix_share)
        return self.make_item(row, "fix" if fix else "generate", f"{self.seed}:{self._drawn}")

    def make_item(self, row: dict[str, Any], task: str, seed: str) -> dict[str, Any]:
        """`row` as a `task` item; a fix task's mistakes are drawn with `seed`."""
        if task == "generate":
            return {**row, "task": task}
        s, rng = self.config, random.Random(seed)
        model, count = self.models[row["schema"]], rng.randint(1, s.max_errors)
        try:
            broken = corrupt(model, row["example"], rng, count, s.error_types)
        except ValueError:  # none of the chosen kinds fits this object: any kind will do
            broken = corrupt(model, row["example"], rng, count)
        mistakes = [{"kind": m.kind, "path": list(m.path)} for m in broken.mistakes]
        return {**row, "task": task, "broken": broken.data, "mistakes": mistakes}

    def prompt(self, item: Any) -> list[Message]:
        name = item["schema"]
        schema = f"```json\n{schema_text(self.models[name])}\n```"
        if item["task"] == "generate":
            parts = [
                f"Write a JSON object describing {item['request']}. It must validate against the"
                f" JSON Schema of the `{name}` model:",
                schema,
                "Put the JSON object inside <json_output></json_output> tags.",
            ]
        else:
            broken = json.dumps(item["broken"], indent=2, ensure_ascii=False)
            parts = [
                f"This JSON object describes {item['request']}. It should validate against the"
                f" JSON Schema of the `{name}` model below, but it has errors. Fix them and"
                " change nothing else.",
                f"Schema:\n{schema}",
                f"JSON to fix:\n```json\n{broken}\n```",
                "Put the corrected JSON object inside <json_output></json_output> tags.",
            ]
        return conversation(self.config, "\n\n".join(parts))

    def assess(self, item: dict[str, Any], completion: str) -> Assessment:
        """Judge one completion of `item`."""
        s = self.config
        body = answer_part(completion, s.thinking_mode)
        text = None if body is None else json_text(body)
        verdict = None if text is None else judge(self.models[item["schema"]], text)
        if text is None or verdict is None or not verdict.parsed:
            return Assessment(False, False, None, 0.0)
        if not verdict.valid:
            return Assessment(True, False, None, s.partial_credit * verdict.field_share)
        if item["task"] == "generate":
            return Assessment(True, True, None, 1.0)
        broken = [tuple(m["path"]) for m in item["mistakes"]]
        kept = kept_share(item["example"], broken, json.loads(text))
        return Assessment(True, True, kept, 1.0 - s.keep_weight + s.keep_weight * kept)

    def score(self, item: Any, completion: str) -> float:
        return self.assess(item, completion).score

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        found = [self.assess(item, r.text) for r in rollouts]
        valid = [float(a.valid) for a in found]
        for key in ("", f"/{item['task']}", f"/{item['schema']}"):
            self.record_mean(f"train/valid_rate{key}", valid)
        self.record_mean("train/kept_share", (a.kept for a in found if a.kept is not None))
        self.record_mean("errors/no_json_rate", (float(not a.found) for a in found))
        return self.unless_all_equal(scores)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        a = self.assess(item, r.text)
        return {**item, "completion": r.text, "finish_reason": r.finish_reason, "score": score,
                "found": a.found, "valid": a.valid, "kept": a.kept}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Mean score, JSON found, valid rate overall, per task and per schema."""
        n = len(samples)
        found = {
            "eval/mean_score": sum(s["score"] for s in samples) / n,
            "eval/no_json_rate": sum(not s["found"] for s in samples) / n,
            "eval/valid_rate": sum(s["valid"] for s in samples) / n,
        }
        for field in ("task", "schema"):
            for value in sorted({s[field] for s in samples}):
                chosen = [s["valid"] for s in samples if s[field] == value]
                found[f"eval/valid_rate/{value}"] = sum(chosen) / len(chosen)
        return found


_turns = Alternating()


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: on every other call the shipped
    example (valid, and a perfect fix), on the others the example without its first key
    (invalid); None (random text) for other prompts. `python -m atropos.testing.fake_server
    --port 9001 --responder atropos.environments.json_schema:demo_responder`."""
    row = in_prompt(shipped_rows("json_schema", "request"), prompt_text)
    if row is None:
        return None
    example = dict(row["example"])
    if not _turns.right():
        example.pop(next(iter(example)))
    body = f"<json_output>\n{json.dumps(example, indent=2)}\n</json_output>"
    return with_thinking(prompt_text, "I check each field against the schema.", body)
