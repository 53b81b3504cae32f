"""`sft_loader`: stream a supervised dataset into the RL queue, one example per group.

Each example becomes a group of one sequence with score 1.0, per-token advantages 1.0 on the
trained tokens (0.0 elsewhere), `group_overrides={"sft": True, "group_size": 1}` and
`overrides=[{"sft": True}]`: with no inference logprobs the trainer takes its own (ratio 1), so
the policy-gradient step on it is a plain log-likelihood step. Tokenization is local, with the
env's tokenizer (`token_source: "retokenized"`); no inference server is used. Upstream's
`SFTEnv`; details in docs/tool_use_multiturn.md ("SFT loader").

Formats (`--env.dataset_format`): `completion` (`text`: all trained), `prefix_completion`
(`prefix` masked, `completion` trained), `oai_format` (`messages`) and `sharegpt_format`
(`conversations`, `from`/`value`). Chats are rendered with the chat template and train every
assistant turn (`train_on: all_assistant`) or only the last (`train_on: last`).

>>> step_budget(max_batches_offpolicy=3, batch_size=64, queued=100, max_per_step=200)
92
>>> step_budget(3, 64, 10, max_per_step=32), step_budget(3, 64, 500, 32), step_budget(3, -1, 0, 32)
(32, 0, 32)
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.config import ServerBaseline
from atropos.inference.tokenize import as_token_ids, tokenize_for_trainer

__all__ = [
    "FORMATS",
    "SFTExample",
    "SFTLoader",
    "SFTLoaderConfig",
    "load_examples",
    "step_budget",
    "to_example",
    "tokenize_example",
]

Format = Literal["completion", "prefix_completion", "oai_format", "sharegpt_format"]
FORMATS: tuple[str, ...] = ("completion", "prefix_completion", "oai_format", "sharegpt_format")
MASKED = -100
_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant"}
_ROLES.update({"assistant": "assistant", "tool": "tool", "function": "tool"})
_FIELDS = {  # where each format's text is, first name found wins
    "completion": (("text", "completion"),),
    "prefix_completion": (("prefix", "prompt"), ("completion", "response")),
}


@dataclass(frozen=True)
class SFTExample:
    """One example: a chat (`messages`), or text whose `prefix` is masked and `completion`
    trained (`completion` format: no prefix)."""

    messages: tuple[dict[str, str], ...] | None = None
    prefix: str = ""
    completion: str = ""


def _text(row: Mapping[str, Any], names: tuple[str, ...], where: str) -> str:
    for name in names:
        if isinstance(row.get(name), str):
            return str(row[name])
    raise ValueError(f"{where}: no text field {' or '.join(repr(n) for n in names)}")


def to_example(row: Mapping[str, Any], dataset_format: str, where: str) -> SFTExample:
    """The example of a row in `dataset_format`; `where` names the row in errors.

    >>> to_example({"prefix": "Q: 1+1?", "completion": " 2"}, "prefix_completion", "r")
    SFTExample(messages=None, prefix='Q: 1+1?', completion=' 2')
    >>> chat = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}
    >>> [m["role"] for m in to_example(chat, "sharegpt_format", "r").messages]
    ['user', 'assistant']
    """
    if dataset_format == "completion":
        return SFTExample(completion=_text(row, _FIELDS["completion"][0], where))
    if dataset_format == "prefix_completion":
        prefix_names, completion_names = _FIELDS["prefix_completion"]
        return SFTExample(
            prefix=_text(row, prefix_names, where), completion=_text(row, completion_names, where)
        )
    if dataset_format not in FORMATS:
        raise ValueError(f"unknown dataset_format {dataset_format!r}; choose from {FORMATS}")
    key, role_key, text_key = (
        ("messages", "role", "content")
        if dataset_format == "oai_format"
        else ("conversations", "from", "value")
    )
    turns = row.get(key)
    if not isinstance(turns, list):
        raise ValueError(f"{where}: expected a {key!r} list, got {type(turns).__name__}")
    messages = []
    for turn in turns:
        role = _ROLES.get(str(turn.get(role_key))) if isinstance(turn, Mapping) else None
        text = turn.get(text_key) if isinstance(turn, Mapping) else None
        if role is None or not isinstance(text, str):
            raise ValueError(f"{where}: unreadable turn {turn!r:.80}")
        messages.append({"role": role, "content": text})
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()  # nothing after the last reply is trained
    if not messages:
        raise ValueError(f"{where}: no assistant turn")
    return SFTExample(messages=tuple(messages))


def load_examples(
    dataset_format: str, dataset_name: str | None = None, split: str = "train"
) -> list[SFTExample]:
    """The examples of the shipped fixture for `dataset_format` (strict: a bad row is an
    error), or of a hub dataset's `split` (bad rows skipped)."""
    if not dataset_name:
        path = data_path("sft_loader", f"{dataset_format}.jsonl")
        if dataset_format not in FORMATS:
            raise ValueError(f"unknown dataset_format {dataset_format!r}; choose from {FORMATS}")
        return [
            to_example(r, dataset_format, f"{path}:{n}") for n, r in enumerate(read_jsonl(path), 1)
        ]
    examples = []
    for n, row in enumerate(load_hub(dataset_name, split), 1):
        try:
            examples.append(to_example(row, dataset_format, f"{dataset_name} row {n}"))
        except ValueError:
            continue
    if not examples:
        raise ValueError(f"{dataset_name}: no row reads as {dataset_format}")
    return examples


def tokenize_example(
    tokenizer: Any, example: SFTExample, train_on: str = "all_assistant"
) -> tuple[list[int], list[int]]:
    """(tokens, masks) of an example; masks hold the id where trained, -100 elsewhere.

    A chat goes through `tokenize_for_trainer` (every assistant turn, or only the last); text is
    the prefix (with the tokenizer's leading special tokens) masked, then the completion and an
    end-of-sequence token trained.
    """
    if example.messages is not None:
        out = tokenize_for_trainer(
            tokenizer, example.messages, train_on_all_assistant_turns=train_on == "all_assistant"
        )
        return out["tokens"], out["masks"]
    head = as_token_ids(tokenizer.encode(example.prefix, add_special_tokens=True))
    body = as_token_ids(tokenizer.encode(example.completion, add_special_tokens=False))
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and (not body or body[-1] != eos):
        body.append(eos)
    return head + body, [MASKED] * len(head) + body


def step_budget(max_batches_offpolicy: int, batch_size: int, queued: int, max_per_step: int) -> int:
    """Sequences to add at a step change: `min(max_batches_offpolicy * batch_size - queued,
    max_per_step)`, at least 0; `max_per_step` when the off-policy bound is off (a factor <= 0)."""
    if max_batches_offpolicy <= 0 or batch_size <= 0:
        return max(0, max_per_step)
    return max(0, min(max_batches_offpolicy * batch_size - queued, max_per_step))


class SFTLoaderConfig(BaseEnvConfig):
    """`sft_loader`'s settings."""

    dataset_name: str | None = Field(
        default=None,
        description="hub dataset, e.g. AlignmentLab-AI/open-instruct-sharegpt (unset: fixture)",
    )
    dataset_split: str = Field(default="train", description="split of the hub dataset")
    dataset_format: Format = Field(
        default="sharegpt_format",
        description="completion, prefix_completion, oai_format or sharegpt_format",
    )
    train_on: Literal["all_assistant", "last"] = Field(
        default="all_assistant", description="chats: train every assistant turn, or the last"
    )
    max_sft_per_step: int = Field(default=32, ge=1, description="sequences added per step at most")
    add_every_n_steps: int = Field(
        default=1, ge=1, description="add sequences when the trainer step crosses a multiple"
    )
    shuffle: bool = Field(default=True, description="a seeded new order every pass")


class SFTLoader(BaseEnv[SFTLoaderConfig]):
    """Supervised examples as 1-sequence groups with score 1."""

    name = "sft_loader"
    seed: ClassVar[int] = 0

    @classmethod
    def config_init(cls) -> tuple[SFTLoaderConfig, ServerBaseline]:
        env = SFTLoaderConfig(
            group_size=1,
            max_token_length=2048,
            tokenizer_name="tiny",
            use_wandb=False,
            ensure_scores_are_not_same=False,
            inference_weight=-1.0,
        )
        return env, ServerBaseline()

    async def setup(self) -> None:
        s = self.config
        self.examples = load_examples(s.dataset_format, s.dataset_name, s.dataset_split)
        self.sft_epoch, self.sft_index = 0, 0  # the position, checkpointed
        self.allowance = 0  # sequences this step may still add (serve mode)
        self._period: int | None = None
        self._order: tuple[int, list[int]] | None = None
        self.counts = {"sequences": 0, "trained_tokens": 0, "skipped": 0}

    def checkpoint_state(self) -> dict[str, Any]:
        return {"sft_epoch": self.sft_epoch, "sft_index": self.sft_index}

    def refill(self) -> None:
        """At the first status and whenever the trainer step crosses a multiple of
        `add_every_n_steps`, allow `step_budget(...)` sequences (the queue counted in
        sequences: `queue_size` is in this env's `group_size` units)."""
        status, s = self.status_dict, self.config
        step = int(status.get("current_step", self.curr_step))
        period = step // s.add_every_n_steps
        if period == self._period:
            return
        self._period = period
        queued = int(status.get("queue_size", 0)) * max(1, self.config.group_size)
        k, b = self.config.max_batches_offpolicy, self.config.batch_size
        self.allowance = step_budget(k, b, queued, s.max_sft_per_step)

    async def get_next_item(self) -> Item:
        """The next example; in serve mode (registered) only while this step's allowance
        lasts (None, and the runner asks again later, once it is spent). In process mode there is
        no trainer: every call gives one."""
        if self.env_id is not None:
            if not self.status_dict:
                return None
            self.refill()
            if self.allowance <= 0:
                return None
            self.allowance -= 1
        if self._order is None or self._order[0] != self.sft_epoch:
            order = list(range(len(self.examples)))
            if self.config.shuffle:
                random.Random(self.seed * 1_000_003 + self.sft_epoch).shuffle(order)
            self._order = (self.sft_epoch, order)
        example = self.examples[self._order[1][self.sft_index]]
        self.sft_index += 1
        if self.sft_index >= len(self.examples):
            self.sft_epoch, self.sft_index = self.sft_epoch + 1, 0
        return example

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        example: SFTExample = item
        tokens, masks = tokenize_example(self.tokenizer, example, self.config.train_on)
        trained = sum(1 for m in masks if m != MASKED)
        if not trained or len(tokens) > self.config.max_token_length:
            self.counts["skipped"] += 1
            self.drop("too_long" if trained else "too_short")
            return None, []
        self.counts["sequences"] += 1
        self.counts["trained_tokens"] += trained
        if example.messages is not None:
            messages = [dict(m) for m in example.messages]
        else:
            messages = [{"role": "user", "content": example.prefix}] if example.prefix else []
            messages.append({"role": "assistant", "content": example.completion})
        group: dict[str, Any] = {
            "tokens": [tokens],
            "masks": [masks],
            "scores": [1.0],
            "advantages": [[0.0 if m == MASKED else 1.0 for m in masks]],
            "messages": [messages],
            "group_overrides": {"sft": True, "group_size": 1},
            "overrides": [{"sft": True}],
            "token_source": "retokenized",
        }
        return group, []  # type: ignore[return-value]

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        counts = getattr(self, "counts", None)
        if counts and any(counts.values()):
            for key, value in counts.items():
                metrics[f"train/sft_{key}"] = float(value)
            counts.update(dict.fromkeys(counts, 0))
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Nothing to evaluate: the loader only feeds the queue."""
        return {}
