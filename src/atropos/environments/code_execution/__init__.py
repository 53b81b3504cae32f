"""`code_execution`: write Python that passes hidden tests, run in a local sandbox.

Problems are MBPP and HumanEval style (`problems` in this package): the shipped
fixture (`data/code_execution/`), or `--env.dataset_name mbpp` / `openai_humaneval` from the hub.
The last fenced ```python block of a completion is run against the item's asserts or
stdin/stdout cases in an `atropos.sandbox` sandbox (`--env.sandbox_provider`; this package's
`sandbox` docstring is the threat model):
+1 if everything passes, else -1 (no code: -1). A completion cut at `max_token_length` is
`truncated/tokens` and masked (`truncated = "mask"`: `set_advantage_to_zero`). A group's
sandboxes run concurrently, bounded by `--env.max_concurrency`. Eval: `eval_samples`
completions per problem, unbiased pass@1 and pass@k. Upstream's `CodingEnv` ran the tests on
Modal; see docs/code_execution.md.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import Counter
from typing import Any, ClassVar, Literal

from pydantic import Field

from atropos.environments.code_execution.problems import Verdict, acheck_solution, load_problems
from atropos.environments.code_execution.sandbox import CodeRunner
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Item, Message
from atropos.rewards.passk import mean_pass_at_k
from atropos.sandbox import SandboxError

__all__ = ["SYSTEM_PROMPT", "CodeExecution", "CodeExecutionConfig", "demo_responder"]

SYSTEM_PROMPT = (
    "You are an expert Python programmer. You may think inside <think> </think> tags first."
    " Then give your complete solution as one fenced code block (```python ... ```); the last"
    " such block is run against hidden tests. Use only the standard library."
)


class CodeExecutionConfig(BaseEnvConfig):
    """`code_execution`'s settings: data, evaluation and the sandbox's limits."""

    dataset_name: str | None = Field(
        default=None, description="hub training set: mbpp or openai_humaneval (unset: fixture)"
    )
    dataset_config: str | None = Field(
        default=None, description="the hub dataset's config (MBPP: full or sanitized)"
    )
    train_split: str = Field(default="train", description="split of dataset_name to train on")
    eval_dataset_name: str | None = Field(
        default=None, description="hub evaluation set (unset: dataset_name, or the fixture)"
    )
    eval_split: str = Field(default="test", description="split of the evaluation set")
    eval_limit: int | None = Field(default=None, ge=1, description="evaluate on this many at most")
    eval_samples: int = Field(default=4, ge=1, description="completions per eval problem (n)")
    eval_k: int | None = Field(default=None, ge=1, description="k of pass@k (unset: n)")
    eval_temperature: float = Field(default=0.6, ge=0, description="sampling temperature of eval")
    timeout_seconds: float = Field(default=10.0, gt=0, description="wall clock per test run")
    cpu_seconds: float = Field(default=5.0, gt=0, description="CPU time per process")
    memory_mb: int = Field(default=1024, ge=64, description="address space per process (MiB)")
    max_processes: int = Field(default=16, ge=1, description="processes a run may add")
    max_output_kb: int = Field(default=1024, ge=1, description="output kept per stream (KiB)")
    max_concurrency: int = Field(default=8, ge=1, description="sandboxes running at once")
    sandbox_provider: Literal["auto", "bubblewrap", "process", "docker"] = Field(
        default="auto",
        description="where programs run: auto is docker when sandbox_image is set, else"
        " bubblewrap when bwrap is installed, else process (logged once)",
    )
    sandbox_image: str | None = Field(
        default=None, description="docker: a local image with python3 (never pulled)"
    )


class CodeExecution(Env[CodeExecutionConfig]):
    """MBPP/HumanEval-style problems; +1 when the code passes every test, else -1."""

    name = "code_execution"
    truncated: ClassVar[str] = "mask"  # a completion cut before its code says nothing
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 2048, "use_wandb": False
    }  # fmt: skip
    system_prompt = SYSTEM_PROMPT
    score_concurrently = True  # a group's sandbox runs overlap, bounded by max_concurrency

    @property
    def sandbox(self) -> CodeRunner:
        """The runner of programs (made on first use)."""
        runner = self.__dict__.get("_runner")
        if runner is None:
            s = self.config
            runner = self.__dict__["_runner"] = CodeRunner(
                provider=s.sandbox_provider,
                image=s.sandbox_image,
                timeout=s.timeout_seconds,
                cpu_seconds=s.cpu_seconds,
                memory_bytes=s.memory_mb * 2**20,
                max_processes=s.max_processes,
                output_bytes=s.max_output_kb * 1024,
                max_concurrency=s.max_concurrency,
            )
        return runner

    @property
    def sandbox_failures(self) -> Counter[str]:
        """Rollouts failed by the sandbox itself, by `SandboxError.reason`."""
        failures: Counter[str] = self.__dict__.setdefault("_sandbox_failures", Counter())
        return failures

    # ----- data and prompt ----------------------------------------------------------------------

    def load(self) -> list[dict[str, Any]]:
        s = self.config
        return load_problems(s.train_split, s.dataset_name, s.dataset_config)

    def load_eval(self) -> list[dict[str, Any]]:
        s = self.config
        name = s.eval_dataset_name or s.dataset_name
        config = s.dataset_config if name == s.dataset_name else None
        items = load_problems(s.eval_split if name else "test", name, config)
        return items[: s.eval_limit] if s.eval_limit else items

    def prompt(self, item: Item) -> list[Message]:
        parts = [item["prompt"].strip()]
        if item["starter"]:
            parts.append(f"Complete this code:\n```python\n{item['starter'].rstrip()}\n```")
        if item["io"]:
            parts.append("Read the input from standard input and print the answer.")
        else:
            parts.append("Write the code only: no example calls, no reading of input.")
        parts.append("### Answer: (use the provided format with backticks)")  # upstream's last line
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    # ----- scoring ------------------------------------------------------------------------------

    async def check(self, item: Item, completion: str) -> Verdict:
        """Run `item`'s tests on the completion's code in the sandbox. A `SandboxError` (the
        sandbox failed, not the code) is counted by its reason and raised: the runner counts
        the rollout failed (`failed/SandboxError`), never scores it."""
        try:
            return await acheck_solution(self.sandbox, item, completion)
        except SandboxError as error:
            self.sandbox_failures[error.reason] += 1
            raise

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Adds `train/sandbox_failed/<reason>`: sandbox failures since the start."""
        extra = {f"train/sandbox_failed/{r}": float(n) for r, n in self.sandbox_failures.items()}
        await super().wandb_log({**(metrics or {}), **extra})

    async def score(self, item: Item, completion: str) -> float:  # type: ignore[override]
        return 1.0 if (await self.check(item, completion)).passed else -1.0

    def score_group(
        self, item: Item, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        self.record_mean("train/percent_correct", (max(s, 0.0) for s in scores))
        return scores  # none dropped here (the runner applies ensure_scores_are_not_same)

    # ----- evaluation ---------------------------------------------------------------------------

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """`eval_samples` completions per eval problem; unbiased `eval/pass@1` and
        `eval/pass@k` (k = `eval_k`, default n), and the share cut at the token limit.

        A loop of its own, not `Env.evaluate`'s: pass@k takes n completions per problem."""
        items = self.load_eval()
        if not items:
            return {}
        s, start = self.config, time.time()
        n = s.eval_samples
        k = min(s.eval_k or n, n)
        params = {"temperature": s.eval_temperature}

        async def one(item: dict[str, Any]) -> list[dict[str, Any]]:
            messages = self.prompt(item)
            rollouts = await self.generate(messages, n=n, split="eval", **params)
            verdicts = await asyncio.gather(*(self.check(item, r.text) for r in rollouts))
            return [
                {
                    "task_id": item["task_id"],
                    "messages": messages,
                    "completion": r.text,
                    "passed": v.passed,
                    "status": v.status,
                    "detail": v.detail,
                    "finish_reason": r.finish_reason,
                }
                for r, v in zip(rollouts, verdicts, strict=True)
            ]

        per_item = await asyncio.gather(*map(one, items))
        counts = [(len(rows), sum(r["passed"] for r in rows)) for rows in per_item]
        samples = list(itertools.chain.from_iterable(per_item))
        metrics = {"eval/pass@1": mean_pass_at_k(counts, 1)}
        metrics[f"eval/pass@{k}"] = mean_pass_at_k(counts, k)
        metrics["eval/overlong_ratio"] = sum(r["finish_reason"] == "length" for r in samples) / len(
            samples
        )
        self.evaluate_log(
            metrics,
            start_time=start,
            end_time=time.time(),
            generation_parameters={**params, "n": n},
            samples=samples,
        )
        return metrics


# ----- offline demo -----------------------------------------------------------------------------

_demo_turns = itertools.count()


@functools.cache
def _fixture_problems() -> list[dict[str, Any]]:
    items = load_problems("train") + load_problems("test")
    return sorted(items, key=lambda i: len(i["prompt"]), reverse=True)  # longest match first


def wrong_answer(item: dict[str, Any]) -> str:
    """A completion with well-formed code that fails `item`'s tests."""
    if item["io"]:
        return "```python\nprint('no idea')\n```"
    entry = item["entry_point"] or "solution"
    return f"```python\ndef {entry}(*args, **kwargs):\n    return None\n```"


def right_answer(item: dict[str, Any]) -> str:
    """A completion holding `item`'s reference solution."""
    return f"Here is my solution.\n```python\n{item['solution'].rstrip()}\n```"


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: for a prompt holding a fixture
    problem, its reference solution on every other call and failing code on the others (so
    groups are mixed); None (random text) for any other prompt."""
    for item in _fixture_problems():
        if item["prompt"].strip() in prompt_text:
            return right_answer(item) if next(_demo_turns) % 2 == 0 else wrong_answer(item)
    return None
