"""`Env`: the small class for the common case, a dataset plus a reward.

Implement `load()` (the items) and `score(item, completion)` (a float), and optionally
`prompt(item)` (the chat messages; default: the item's `prompt` or `question` as a user turn)
and `load_eval()` (items for `evaluate`). Everything else (sampling a group per item through
the inference servers with token ids and logprobs, building masks, evaluation with metrics and
samples) is done here; `rollout_group` builds the group for an env that samples its own
rollouts, and `ShuffledPasses` gives items in seeded shuffled passes. `Env` is generic over its
config (`class Mine(Env[MineConfig])` types `self.config`). Evaluation is two hooks:
`eval_sample(item, rollout, score)` (one row of `samples.jsonl`) and `eval_metrics(samples)`.
A whole environment fits in a dozen lines:

    class Echo(Env):
        name = "echo"

        def load(self):
            return [{"prompt": "Say hi", "answer": "hi"}]

        def score(self, item, completion):
            return 1.0 if item["answer"] in completion else -1.0

    if __name__ == "__main__":
        Echo.cli()

Token fidelity: with a `vllm`, `sglang` or `trl` server the group's tokens, masks and logprobs
are the server's own ids (`token_source: "server"`); with a text-only `openai` server the
conversation is tokenized locally (`token_source: "retokenized"`, no logprobs).

Policy version: when the inference server reports the weight version that generated an answer
(`policy_version`, as our local server does), each rollout carries it and the group is stamped
with the lowest one (its oldest tokens); otherwise the runner stamps the trainer step at which
the rollout started.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from atropos.envs.base import BaseEnv, ConfigT
from atropos.envs.evaluation import evaluate_each, report_rows
from atropos.envs.outcome import invalid, truncated, with_outcomes
from atropos.envs.types import Item, Message, ScoredDataGroup
from atropos.inference.latency import note
from atropos.rewards.group import all_equal

if TYPE_CHECKING:
    from atropos.inference.managed import ChatTurn

T = TypeVar("T")


@dataclass(slots=True)  # cheaper to make: one per completion
class Rollout:
    """One sampled completion, ready to train on.

    `policy_version` is the lowest weight version the server reported for its tokens (None
    when the server reports none; the runner then stamps the trainer step instead).
    """

    text: str
    tokens: list[int]
    masks: list[int]
    logprobs: list[float] | None
    finish_reason: str
    token_source: str
    policy_version: int | None = None

    @property
    def trained_tokens(self) -> int:
        """How many of its tokens are trained (not masked with -100)."""
        return sum(1 for m in self.masks if m != -100)


def _rollouts(turn: ChatTurn) -> list[Rollout]:
    """The rollouts of a `ChatTurn` (its nodes are the caller's to keep: no copy)."""
    return [
        Rollout(
            content,
            node.tokens,
            node.masked_tokens,
            node.logprobs,
            reason,
            node.token_source,
            node.policy_version,
        )
        for content, reason, node in zip(
            turn.contents, turn.finish_reasons, turn.nodes, strict=True
        )
    ]


class ShuffledPasses(Generic[T]):
    """`items` in endless passes, each a fresh shuffle of them all by one seeded generator:
    the order in which `Env` takes its training items.

    >>> passes = ShuffledPasses("abc", seed=0)
    >>> sorted(passes.next() for _ in range(3)), sorted(passes.next() for _ in range(3))
    (['a', 'b', 'c'], ['a', 'b', 'c'])
    """

    def __init__(self, items: Sequence[T], seed: int) -> None:
        self.items = items
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def next(self) -> T:
        """The next item (a new pass, freshly shuffled, when the last one is done)."""
        if not self._order:
            self._order = list(range(len(self.items)))
            self._rng.shuffle(self._order)
        return self.items[self._order.pop()]


def rollout_group(
    rollouts: Sequence[Rollout],
    prompts: Sequence[list[Message]],
    scores: list[float],
    overrides: list[dict[str, Any]] | None = None,
) -> ScoredDataGroup:
    """The group of `rollouts` with their `scores`: tokens, masks, each rollout's conversation
    (its prompt in `prompts`, then its text), the `overrides` when given, the token source
    ("mixed" when they differ), the logprobs when every rollout has them, and the lowest
    policy version reported (the weights that made the oldest tokens; with none the runner
    stamps the step).

    For an env that builds its groups itself (e.g. from completions of several prompts).
    """
    tokens: list[list[int]] = []
    masks: list[list[int]] = []
    chats: list[list[Message]] = []
    sources: set[str] = set()
    versions: list[int] = []
    every_logprob = True
    for p, r in zip(prompts, rollouts, strict=True):  # one pass over the rollouts
        tokens.append(r.tokens)
        masks.append(r.masks)
        chats.append([*p, {"role": "assistant", "content": r.text}])
        sources.add(r.token_source)
        if r.logprobs is None:
            every_logprob = False
        if r.policy_version is not None:
            versions.append(r.policy_version)
    group = ScoredDataGroup(tokens=tokens, masks=masks, scores=scores, messages=chats)
    if overrides is not None:
        group["overrides"] = overrides
    group["token_source"] = (sources.pop() if len(sources) == 1 else "mixed") if sources else None
    if every_logprob:
        group["inference_logprobs"] = [r.logprobs or [] for r in rollouts]
    if versions:
        group["policy_version"] = min(versions)
    return group


class Env(BaseEnv[ConfigT]):
    """A dataset environment: `load()` and `score()` are all it needs.

    A group is built in `collect_trajectories`: `score()` of each rollout (one at a time; all
    of the group's at once when `score_concurrently` is set and `score` is async, e.g. a
    sandbox run), then `score_group()` on the whole group (None drops it), then
    `sequence_overrides()`: one dict per rollout for the trainer (e.g.
    `{"set_advantage_to_zero": True}` for a truncated one), sent as the group's `overrides`;
    None (the default) sends none.
    """

    system_prompt: ClassVar[str | None] = None
    temperature: ClassVar[float] = 1.0
    max_tokens: ClassVar[int | None] = None  # default: the env's max_token_length
    seed: ClassVar[int] = 0
    score_concurrently: ClassVar[bool] = False  # await an async `score` for a group at once
    # a completion cut by its token limit is `truncated/tokens` (`envs.outcome`): "score" it
    # as it stands, or "mask" it (its advantage zeroed)
    truncated: ClassVar[str] = "score"
    # what every answer holds (e.g. "\\boxed"): a completion without it after its thinking is
    # `invalid/no_answer` (`invalid_reason`); None: not checked
    answer_marker: ClassVar[str | None] = None
    _cut: tuple[str, dict[str, Any]] | None = None  # `outcome`'s truncated entry, by rule

    @abstractmethod
    def load(self) -> Iterable[Item]:
        """The training items."""

    @abstractmethod
    def score(self, item: Item, completion: str) -> float:
        """The reward of one completion (may also be `async def`)."""

    def load_eval(self) -> Iterable[Item]:
        """Items for `evaluate` (none by default)."""
        return []

    def score_group(
        self, item: Item, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        """Adjust a whole group's scores after `score()` (e.g. `atropos.rewards.length_penalty`);
        None drops the group. Default: the scores unchanged."""
        return scores

    def unless_all_equal(self, scores: list[float]) -> list[float] | None:
        """`scores` as they are, or None (the group dropped as "all_equal") when they are all
        equal and `--env.ensure_scores_are_not_same` is on: for `score_group` to end with."""
        if self.config.ensure_scores_are_not_same and all_equal(scores):
            self.drop("all_equal")
            return None
        return scores

    def sequence_overrides(
        self, item: Item, rollouts: list[Rollout], scores: list[float]
    ) -> list[dict[str, Any]] | None:
        """Per-sequence overrides for the trainer, one dict per rollout (`{}` for none), given
        the final scores; None (the default) leaves them out of the group."""
        return None

    def prompt(self, item: Item) -> list[Message]:
        """The conversation to complete for `item`."""
        text = item.get("prompt") or item.get("question") if isinstance(item, dict) else None
        if text is None:
            raise ValueError(
                f"{type(self).__name__}: items need a 'prompt' or 'question' field, or override"
                " prompt(item)"
            )
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": str(text)})
        return messages

    # ----- BaseEnv hooks ------------------------------------------------------------------------

    async def setup(self) -> None:
        self.items = list(self.load())
        if not self.items:
            raise ValueError(f"{type(self).__name__}.load() returned no items")
        self._passes = ShuffledPasses(self.items, self.seed)

    async def get_next_item(self) -> Item:
        return self._passes.next()

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        messages = self.prompt(item)
        rollouts = await self.generate(messages, n=self.config.group_size)
        scoring = time.perf_counter()
        if self.score_concurrently:
            scores = list(await asyncio.gather(*(self._score(item, r.text) for r in rollouts)))
        else:
            score, scores = self.score, []
            for r in rollouts:  # one at a time, as before; a float needs no coroutine around it
                value = score(item, r.text)
                scores.append(value if type(value) is float else await self._resolve(value))
        adjusted = self.score_group(item, rollouts, scores)
        note("scoring", time.perf_counter() - scoring)  # the runner's latency stages
        if adjusted is None:
            return None, []
        scores = list(map(float, adjusted))  # a hook may have put ints in (no frame per score)
        if len(scores) != len(rollouts):
            raise ValueError(
                f"{type(self).__name__}.score_group returned {len(scores)} scores for"
                f" {len(rollouts)} rollouts"
            )
        overrides = self.sequence_overrides(item, rollouts, scores)
        if overrides is not None and len(overrides) != len(rollouts):
            raise ValueError(
                f"{type(self).__name__}.sequence_overrides returned {len(overrides)} dicts"
                f" for {len(rollouts)} rollouts"
            )
        entries = self._outcomes(item, rollouts)
        merged = overrides is None and any(entries)
        if merged and type(self).outcome is not Env.outcome:  # an own one may share its dicts
            overrides = [{**e} for e in entries]
        elif merged:  # nothing to merge them into: the entries (fresh dicts) are the overrides
            overrides = entries
        group = rollout_group(rollouts, [messages] * len(rollouts), scores, overrides)
        return (group if merged else with_outcomes(group, entries)), []

    def _outcomes(self, item: Item, rollouts: list[Rollout]) -> list[dict[str, Any]]:
        """Each rollout's `outcome` entry; without an own `outcome` or `invalid_reason` and
        without an `answer_marker`, the same entries in one pass (no call per rollout)."""
        kind = type(self)
        if (
            kind.outcome is not Env.outcome
            or kind.invalid_reason is not Env.invalid_reason
            or self.answer_marker is not None
        ):
            return [self.outcome(item, r) for r in rollouts]
        entry = self._truncated_entry()
        return [{**entry} if r.finish_reason == "length" else {} for r in rollouts]

    def _truncated_entry(self) -> dict[str, Any]:
        """`truncated("tokens", self.truncated)`, made once per rule (copy it per rollout)."""
        cut = self._cut
        if cut is None or cut[0] != self.truncated:
            cut = self._cut = (self.truncated, truncated("tokens", self.truncated))
        return cut[1]

    def invalid_reason(self, item: Item, rollout: Rollout) -> str | None:
        """Why `rollout` is the policy's own fault (`no_answer`, `malformed_call`), counted as
        `invalid/<why>` and scored by `score` as any other; None: it is not. Default:
        `no_answer` when `answer_marker` is set and absent after the last `</think>`."""
        marker = self.answer_marker
        if marker is not None and marker not in rollout.text.rsplit("</think>", 1)[-1]:
            return "no_answer"
        return None

    def outcome(self, item: Item, rollout: Rollout) -> dict[str, Any]:
        """A rollout's outcome entry: `truncated/tokens` when cut by its token limit (under
        `truncated`), else `invalid/<why>` (`invalid_reason`), else `{}` (scored)."""
        if rollout.finish_reason == "length":
            return {**self._truncated_entry()}
        why = self.invalid_reason(item, rollout)
        return invalid(why) if why else {}

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One completion per `load_eval()` item with `eval_params()`, at most
        `max_eval_workers` in flight; each scored by `score`, made a sample row by
        `eval_sample`; `eval_metrics(samples)` logged with the samples by `evaluate_log`.

        Returns:
            The metrics; {} (and nothing logged) when there are no eval items.
        """
        params = self.eval_params()

        async def play(item: Item) -> dict[str, Any]:
            [rollout] = await self.generate(self.prompt(item), 1, "eval", **params)
            return self.eval_sample(item, rollout, await self._score(item, rollout.text))

        return await evaluate_each(
            self, list(self.load_eval()), play, report_rows(self.eval_metrics), {**params, "n": 1}
        )

    def eval_params(self) -> dict[str, Any]:
        """Sampling parameters of `evaluate`: `--env.eval_temperature` (0: greedy)."""
        return {"temperature": self.config.eval_temperature}

    def eval_sample(self, item: Item, rollout: Rollout, score: float) -> dict[str, Any]:
        """The row of `samples.jsonl` for one eval item (keep `score`: the default metrics
        read it). Default: the prompt, the completion, its finish reason and its score."""
        return {
            "messages": self.prompt(item),
            "completion": rollout.text,
            "finish_reason": rollout.finish_reason,
            "score": score,
        }

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """The metrics of one evaluation from its sample rows. Default: `eval/mean_score` and
        `eval/accuracy` (the share scored above 0)."""
        scores = [float(s["score"]) for s in samples]
        return {
            "eval/mean_score": sum(scores) / len(scores),
            "eval/accuracy": sum(1 for v in scores if v > 0) / len(scores),
        }

    # ----- generation ---------------------------------------------------------------------------

    async def _score(self, item: Item, text: str) -> float:
        return await self._resolve(self.score(item, text))

    @staticmethod
    async def _resolve(value: Any) -> float:
        """A score as a float (awaited first when `score` is async)."""
        if inspect.isawaitable(value):
            value = await value
        return float(value)

    def _server_type(self) -> str:
        configs = self.server_configs
        first = configs[0] if isinstance(configs, list) and configs else configs
        return str(getattr(first, "server_type", "openai"))

    async def generate(
        self, messages: list[Message], n: int, split: str = "train", **sampling: Any
    ) -> list[Rollout]:
        """Sample `n` completions of `messages` with tokens, masks and (when the server gives
        them) logprobs."""
        params = {
            "max_tokens": self.max_tokens or self.config.max_token_length,
            "temperature": self.temperature,
            **sampling,
        }
        tokenizer = self.tokenizer  # before the servers, so they share it
        if self._server_type() == "openai":
            return await self._generate_text_only(messages, n, split, params)
        single_turn = getattr(self.server, "single_turn", None)
        if single_turn is not None and tokenizer is not None:  # one call: no session needed
            turn = await single_turn(tokenizer, messages=messages, n=n, split=split, **params)
            return _rollouts(turn)
        async with self.server.managed_server(tokenizer=tokenizer) as managed:
            chat_turn = getattr(managed, "chat_turn", None)
            if chat_turn is None:  # a session without the lean call: read the OpenAI reply
                reply = await managed.chat_completion(messages=messages, n=n, split=split, **params)
                nodes = list(managed.nodes)
            else:
                # this session ends here, so its nodes (and their rows) are ours to keep: no copy
                turn = await chat_turn(messages=messages, n=n, split=split, **params)
        if chat_turn is not None:
            return _rollouts(turn)
        return [
            Rollout(
                text=choice.message.content or "",
                tokens=node.tokens,
                masks=node.masked_tokens,
                logprobs=node.logprobs,
                finish_reason=str(choice.finish_reason),
                token_source=getattr(node, "token_source", "server"),
                policy_version=getattr(node, "policy_version", None),
            )
            for choice, node in zip(reply.choices, nodes[-len(reply.choices) :], strict=True)
        ]

    async def _generate_text_only(
        self, messages: list[Message], n: int, split: str, params: dict[str, Any]
    ) -> list[Rollout]:
        from atropos.inference.base import PolicyVersions
        from atropos.inference.tokenize import tokenize_for_trainer

        with PolicyVersions() as seen:
            reply = await self.server.chat_completion(messages=messages, n=n, split=split, **params)
        rollouts = []
        for choice in reply.choices:
            text = choice.message.content or ""
            chat = [*messages, {"role": "assistant", "content": text}]
            out = tokenize_for_trainer(
                self.tokenizer,
                chat,
                finish_reason=str(choice.finish_reason or ""),
                template_kwargs=self.server.template_plan(self.tokenizer).kwargs,
            )
            rollouts.append(
                Rollout(
                    text,
                    out["tokens"],
                    out["masks"],
                    None,
                    str(choice.finish_reason),
                    "retokenized",
                    seen.lowest,
                )
            )
        return rollouts
