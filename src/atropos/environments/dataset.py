"""`dataset`: any dataset of prompts and answers, scored by rewards named in configuration.

Items come from the Hugging Face hub (`dataset_name`, `dataset_config`, `split`), a local JSONL
file (`dataset_path`), or, by default, a small fixture shipped with the package, so
`atropos env process dataset` works offline. Each item's `prompt_field` is the user turn (after
`system_prompt`); its `ground_truth_field` (default: `answer_field`) is the gold answer every
reward receives as `answer`. Rewards are `atropos.rewards` names with weights and parameters,
combined by `reward_normalization`. Every group is scored, in every mode (upstream's serve path
never reached its scoring).

The dataset settings can live in a YAML file, `--env.dataset_config_file PATH` (examples in
`atropos/environments/data/dataset/`); its values fill the fields left at their defaults, so a
flag still wins::

    dataset_name: gsm8k
    dataset_config: main
    prompt_field: question
    answer_field: answer
    system_prompt: Think step by step, then give the final answer as \\boxed{answer}.
    rewards:
      - {name: accuracy, weight: 1.0}
      - {name: format, weight: 0.2, params: {preferred_tags: [think]}}

>>> DatasetEnvConfig(rewards=["accuracy", {"name": "format", "weight": 0.2}]).rewards[1]
{'name': 'format', 'weight': 0.2, 'params': {}}
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl, take
from atropos.envs.config import BaseEnvConfig, ConfigError
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message
from atropos.names import did_you_mean
from atropos.rewards import Combination, build

__all__ = ["DatasetEnv", "DatasetEnvConfig", "read_dataset_file"]


def _default_rewards() -> list[dict[str, Any] | str]:
    return [{"name": "accuracy", "weight": 1.0, "params": {}}]


class DatasetEnvConfig(BaseEnvConfig):
    """`dataset`'s settings: the base ones, where the items come from, and the rewards."""

    dataset_config_file: str | None = Field(
        None, description="YAML file of the dataset settings below (fills fields left at defaults)"
    )
    dataset_name: str | None = Field(
        None, description="hub dataset (unset: dataset_path, else the shipped fixture)"
    )
    dataset_config: str | None = Field(None, description="the hub dataset's configuration")
    split: str = Field("train", description="the hub split to train on")
    dataset_path: str | None = Field(None, description="a local JSONL file of items")
    prompt_field: str = Field("prompt", description="the item field holding the prompt")
    answer_field: str = Field("answer", description="the item field holding the answer")
    ground_truth_field: str | None = Field(
        None, description="the field rewards check against (default: answer_field)"
    )
    system_prompt: str | None = Field(None, description="system message before every prompt")
    prefill: str | None = Field(
        None, description="text the answer starts with (e.g. '<think>'); scored with it"
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature for training")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling for training")
    eval_split: str | None = Field(None, description="hub split to evaluate on (unset: none)")
    eval_dataset_path: str | None = Field(None, description="local JSONL file to evaluate on")
    eval_limit: int = Field(100, ge=0, description="evaluate on the first N eval items")
    rewards: list[dict[str, Any] | str] = Field(
        default_factory=_default_rewards,
        description="rewards: names or {name, weight, params} (see docs/rewards.md)",
    )
    reward_normalization: Literal["none", "sum", "minmax"] = Field(
        "none", description="none: weighted sum; sum: weighted mean; minmax: [0, 1] per group"
    )

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, entries: list[dict[str, Any] | str]) -> list[dict[str, Any] | str]:
        terms = build(entries).terms  # unknown names and parameters fail here
        return [{"name": t.name, "weight": t.weight, "params": dict(t.params)} for t in terms]

    @model_validator(mode="before")
    @classmethod
    def _read_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("dataset_config_file"):
            return data
        defaults = {
            k: f.get_default(call_default_factory=True) for k, f in cls.model_fields.items()
        }
        found = read_dataset_file(data["dataset_config_file"])
        return {
            **data,
            **{k: v for k, v in found.items() if k not in data or data[k] == defaults[k]},
        }


DATASET_FIELDS = tuple(
    k for k in DatasetEnvConfig.model_fields if k not in BaseEnvConfig.model_fields
)


def read_dataset_file(path: str | Path) -> dict[str, Any]:
    """The dataset settings in a YAML file: `DatasetEnvConfig` fields at the top level, or in
    a `dataset:` block (upstream's layout). Errors name the file and the key.

    Raises:
        ValueError: the file is missing or not YAML, or a key is not a dataset setting.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(
            f"dataset_config_file {str(path)!r}: cannot read it: {e.strerror}"
        ) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("dataset"), dict):
        doc = {**{k: v for k, v in doc.items() if k != "dataset"}, **doc["dataset"]}
    if not isinstance(doc, dict):
        raise ValueError(
            f"{path}: expected a mapping of dataset settings, got {type(doc).__name__}"
        )
    for key in doc:
        if key in BaseEnvConfig.model_fields:
            raise ValueError(
                f"{path}: {key!r} is a run setting, not a dataset one: set it with --env.{key}"
                " or in the env: block of a --config file"
            )
        if key not in DATASET_FIELDS or key == "dataset_config_file":
            hint = did_you_mean(str(key), DATASET_FIELDS, repr)
            raise ValueError(
                f"{path}: unknown key {key!r}{hint} (dataset settings: {', '.join(DATASET_FIELDS)})"
            )
    if "rewards" in doc:
        build(doc["rewards"], doc.get("reward_normalization", "none"), where=f"{path}: rewards")
    return doc


class DatasetEnv(Env[DatasetEnvConfig]):
    """Prompts and answers from any dataset, scored by configurable rewards."""

    name = "dataset"
    requires: ClassVar[dict[str, str]] = {"math_verify": "envs"}  # checked before a run
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "max_token_length": 512, "use_wandb": False
    }  # fmt: skip

    @cached_property
    def rewards(self) -> Combination:
        """The configured rewards, combined."""
        return build(self.config.rewards, self.config.reward_normalization)

    # ----- data --------------------------------------------------------------------------------

    def _rows(self, split: str | None, path: str | None, fixture: str) -> list[dict[str, Any]]:
        """Rows from `path` (a local file wins), else the hub dataset's `split`, else the
        shipped `fixture`; none for evaluation when only a local training file is set."""
        cfg = self.config
        if path:
            rows, source = read_jsonl(path), path
        elif cfg.dataset_name:
            if split is None:
                return []
            rows, source = load_hub(cfg.dataset_name, split, cfg.dataset_config), cfg.dataset_name
        elif cfg.dataset_path:  # a local training file and no eval file: no eval items
            return []
        else:
            path = str(data_path("dataset", fixture))
            rows, source = read_jsonl(path), path
        self._check_fields(rows, source)
        return rows

    def _check_fields(self, rows: list[dict[str, Any]], source: str) -> None:
        cfg = self.config
        wanted = {"prompt_field": cfg.prompt_field}
        wanted["ground_truth_field" if cfg.ground_truth_field else "answer_field"] = (
            cfg.ground_truth_field or cfg.answer_field
        )
        for i, row in enumerate(rows):
            for setting, name in wanted.items():
                if name not in row:
                    hint = did_you_mean(name, map(str, row), repr)
                    raise ConfigError(
                        f"--env.{setting}: row {i} of {source} has no field {name!r}{hint}"
                        f" (its fields: {', '.join(map(str, row))})"
                    )

    def load(self) -> list[dict[str, Any]]:
        return self._rows(self.config.split, self.config.dataset_path, "train.jsonl")

    def load_eval(self) -> list[dict[str, Any]]:
        cfg = self.config
        return list(
            take(self._rows(cfg.eval_split, cfg.eval_dataset_path, "test.jsonl"), cfg.eval_limit)
        )

    # ----- prompting and scoring ---------------------------------------------------------------

    def prompt(self, item: dict[str, Any]) -> list[Message]:
        prompt = item[self.config.prompt_field]
        if isinstance(prompt, list):  # already a conversation
            return [dict(m) for m in prompt]  # type: ignore[misc]
        messages: list[Message] = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": str(prompt)})
        return messages

    def gold(self, item: dict[str, Any]) -> Any:
        """The answer the rewards check against."""
        return item[self.config.ground_truth_field or self.config.answer_field]

    def score(self, item: dict[str, Any], completion: str) -> float:
        return self.rewards(completion, answer=self.gold(item))

    def score_group(
        self, item: dict[str, Any], rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        return self.rewards.normalize_group(scores)

    async def generate(
        self, messages: list[Message], n: int, split: str = "train", **sampling: Any
    ) -> list[Rollout]:
        """Sample with the configured temperature and top_p; with a `prefill`, continue it (the
        rollout's text starts with it; its tokens are prompt, not trained)."""
        cfg = self.config
        sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, **sampling}
        if not cfg.prefill:
            return await super().generate(messages, n, split, **sampling)
        if self._server_type() == "openai":
            raise ConfigError(
                "--env.prefill needs a server that returns token ids (vllm, sglang or trl),"
                " not an 'openai' one"
            )
        tokenizer = self.tokenizer
        params = {"max_tokens": self.max_tokens or cfg.max_token_length, **sampling}
        async with self.server.managed_server(tokenizer=tokenizer) as managed:
            text = tokenizer.apply_chat_template(  # with the env's reasoning switches
                messages, tokenize=False, add_generation_prompt=True, **managed.reasoning.kwargs
            )
            reply = await managed.completion(
                prompt=str(text) + cfg.prefill, n=n, split=split, **params
            )
            nodes = list(managed.nodes)[-len(reply.choices) :]
        return [
            Rollout(
                cfg.prefill + choice.text,
                node.tokens,
                node.masked_tokens,
                node.logprobs,
                str(choice.finish_reason),
                getattr(node, "token_source", "server"),
                getattr(node, "policy_version", None),
            )
            for choice, node in zip(reply.choices, nodes, strict=True)
        ]

    # ----- evaluation --------------------------------------------------------------------------

    def eval_params(self) -> dict[str, Any]:
        """The first `eval_limit` eval items, one sample each at `eval_temperature` (default
        0: greedy) and top_p 1."""
        return {**super().eval_params(), "top_p": 1.0}

    def eval_sample(self, item: dict[str, Any], rollout: Rollout, score: float) -> dict[str, Any]:
        row = super().eval_sample(item, rollout, score)  # messages, completion, finish_reason
        return {**row, "gold": self.gold(item), "score": score}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """eval/{mean, max, min}_score."""
        scores = [s["score"] for s in samples]
        return {
            "eval/mean_score": sum(scores) / len(scores),
            "eval/max_score": max(scores),
            "eval/min_score": min(scores),
        }
