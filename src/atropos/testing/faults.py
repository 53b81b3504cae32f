"""Faults injected into rollouts at a fixed rate, with the ground truth of which rollouts hit one
(tests/envs/test_outcomes.py and benchmarks/fault_outcomes.py).

Every item an env here rolls out gets a nonce, written into its prompt as `[#N]`. A
`FaultPlan`'s responder (for `FakeInferenceServer`, the policy's or the judge's) decides per
(nonce, turn) whether that request fails, and how: "500" (an HTTP 500 error body), "crash" (the
handler raises: a plain-text 500, as a dying server gives), "429" (rate limited) or "hang" (no
answer for `hang` seconds, past the client's deadline). The decision is a hash of the seed, the
nonce and the turn, so retries of a faulted request fail again and the item's rollouts cannot
end well; `faulted` holds every nonce that hit a fault. `audit(path, plans)` then reads a
runner's JSONL output: a row whose nonce is in `faulted` is a fabricated score (must be none).

Three environments: `FaultArithmetic` (single-turn, the shipped `arithmetic`), `FaultJudged`
(the same items scored by a judge: `\\boxed{A}` right, anything else wrong) and `FaultMCPTools`
(multi-turn tool use, the shipped `mcp_tools` against its fixture MCP server).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import Field
from starlette.exceptions import HTTPException

from atropos.environments.arithmetic import Arithmetic, ArithmeticConfig
from atropos.envs.judge import JudgeConfig, JudgedEnv, boxed_choice
from atropos.envs.outcome import failure_reason
from atropos.envs.types import Message

FAULTS = ("500", "crash", "429", "hang")
NONCE = re.compile(r"\[#(\d+)\]")
_nonces = itertools.count(1)
_current: contextvars.ContextVar[int] = contextvars.ContextVar("fault_nonce", default=0)

Responder = Callable[[str], Any]


FAILED: dict[int, str] = {}
"""Each failed item's nonce -> its `failure_reason` (what the runner counts it as), so a failure
no injected fault explains can be named (`unexplained`)."""


async def recorded(nonce: int, work: Awaitable[Any]) -> Any:
    """`await work`, noting the item's failure reason in `FAILED` when it raises."""
    try:
        return await work
    except Exception as err:
        FAILED[nonce] = failure_reason(err)
        raise


def unexplained(plans: Iterable[FaultPlan]) -> Counter[str]:
    """Failed items that no fault of `plans` hit, by reason."""
    faulted = set().union(*(p.faulted for p in plans))
    return Counter(r for nonce, r in FAILED.items() if nonce not in faulted)


def run_process(
    env_cls: Any,
    policy: str,
    out: Path,
    groups: int,
    *,
    group_size: int,
    workers: int,
    server_wait: float,
    **env: Any,
) -> tuple[int, Any]:
    """`env_cls` run by the process runner against the `policy` server (vllm-shaped, 1 s a
    call, two attempts) until it wrote `groups` groups to `out`: (exit status, runner)."""
    from atropos.envs.config import ResolvedConfig
    from atropos.envs.runner.process import ProcessRunner
    from atropos.inference.config import APIServerConfig, ServerManagerConfig

    config = env_cls.env_config_cls(
        tokenizer_name="tiny",
        group_size=group_size,
        use_wandb=False,
        total_steps=groups,
        max_num_workers=workers,
        ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(out),
        **env,
    )
    servers = [APIServerConfig(base_url=policy, server_type="vllm", model_name="m", timeout=1.0)]
    manager = ServerManagerConfig(max_attempts=2, retry_backoff=0.01, server_wait=server_wait)
    resolved = ResolvedConfig(config, servers, manager, "process")
    runner = ProcessRunner(env_cls(config, servers, manager=resolved.manager), resolved)
    return asyncio.run(runner.run(show_progress=False)), runner


def tag(text: str, nonce: int) -> str:
    """`text` with the nonce written into it."""
    return f"[#{nonce}] {text}"


class FaultPlan:
    """Which (nonce, turn) requests fail, and how (see the module docstring)."""

    def __init__(
        self, rate: float, kinds: Iterable[str] = FAULTS, seed: int = 0, hang: float = 3.0
    ) -> None:
        self.rate, self.kinds, self.seed, self.hang = rate, tuple(kinds), seed, hang
        unknown = set(self.kinds) - set(FAULTS)
        if not 0 <= rate <= 1 or unknown or not self.kinds:
            raise ValueError(f"FaultPlan: rate in [0, 1] and kinds among {FAULTS}")
        self.faulted: set[int] = set()
        self.injected: Counter[str] = Counter()

    def kind_for(self, nonce: int, turn: int) -> str | None:
        rng = random.Random(f"{self.seed}:{nonce}:{turn}")
        if rng.random() >= self.rate:
            return None
        return self.kinds[rng.randrange(len(self.kinds))]

    def responder(self, inner: Responder | None = None) -> Callable[[str], Awaitable[Any]]:
        """A `FakeInferenceServer` responder: `inner`'s answer, unless this request fails."""

        async def respond(prompt: str) -> Any:
            found = NONCE.search(prompt)
            turn = max(0, prompt.count("<|im_start|>assistant") - 1)  # replies so far
            kind = self.kind_for(int(found.group(1)), turn) if found else None
            if kind is not None:
                assert found is not None
                self.faulted.add(int(found.group(1)))
                self.injected[kind] += 1
                if kind == "hang":
                    await asyncio.sleep(self.hang)
                elif kind == "crash":
                    raise RuntimeError("injected crash")
                else:
                    raise HTTPException(int(kind), f"injected {kind}")
            answer = inner(prompt) if inner is not None else None
            return await answer if asyncio.iscoroutine(answer) else answer

        return respond


def audit(path: Path, plans: Iterable[FaultPlan]) -> dict[str, int]:
    """Rows (and groups) a runner wrote to `path`, and those whose rollout hit a fault."""
    faulted = set().union(*(p.faulted for p in plans))
    counts = Counter(groups=0, rows=0, faulted_rows=0, rows_without_nonce=0)
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        group = json.loads(line)
        counts["groups"] += 1
        for messages in group.get("messages") or []:
            counts["rows"] += 1
            text = " ".join(str(m.get("content")) for m in messages if m.get("role") == "user")
            found = NONCE.search(text)
            if found is None:
                counts["rows_without_nonce"] += 1
            elif int(found.group(1)) in faulted:
                counts["faulted_rows"] += 1
    return dict(counts)


def right_answer(prompt: str) -> str:
    """A policy responder for arithmetic: the sum, wrong for about half the items."""
    numbers = [int(n) for n in re.findall(r"(\d+)", prompt.split("[#")[-1])[1:3]]
    total = sum(numbers)
    return str(total if total % 2 else total + 1)


def judge_says(prompt: str) -> str:
    """A judge responder: A (right) or B, by the parity of the prompt's last number."""
    numbers = re.findall(r"(\d+)", prompt)
    return "\\boxed{A}" if numbers and int(numbers[-1]) % 2 else "\\boxed{B}"


class FaultArithmetic(Arithmetic):
    """`arithmetic` with a nonce in every item's prompt."""

    name = "fault_arithmetic"

    async def get_next_item(self) -> Any:
        return {**(await super().get_next_item()), "nonce": next(_nonces)}

    async def collect_trajectories(self, item: Any) -> Any:
        return await recorded(item["nonce"], super().collect_trajectories(item))

    def prompt(self, item: Any) -> Any:
        messages = super().prompt(item)
        messages[-1] = {**messages[-1], "content": tag(str(messages[-1]["content"]), item["nonce"])}
        return messages


class FaultJudgedConfig(ArithmeticConfig):
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


class FaultJudged(FaultArithmetic, JudgedEnv):
    """The same items, each completion scored by the judge (one answer, no reference)."""

    name = "fault_judged"
    env_config_cls = FaultJudgedConfig

    async def score(self, item: Any, completion: str) -> float:  # type: ignore[override]
        question = self.prompt(item)[-1]["content"]
        text = f"{question}\nAnswer: {completion}\nRight? \\boxed{{A}} yes, \\boxed{{B}} no"
        ask: list[Message] = [{"role": "user", "content": text}]
        [answer] = await self.judge.complete(ask, 1)
        return 1.0 if boxed_choice(answer) == "A" else -1.0


def fault_mcp_tools() -> type:
    """`mcp_tools` with a nonce in every item's prompt (made on call: it needs `mcp`)."""
    from atropos.environments.mcp_tools import MCPTools

    class FaultMCPTools(MCPTools):  # type: ignore[misc]
        name = "fault_mcp_tools"

        async def get_next_item(self) -> Any:
            return (next(_nonces), await super().get_next_item())

        async def collect_trajectories(self, item: Any) -> Any:
            nonce, task = item
            _current.set(nonce)  # this item's task: its episodes' prompts read it
            return await recorded(nonce, super().collect_trajectories(task))

        def prompt(self, task: Any) -> Any:
            messages = super().prompt(task)
            user = next(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[user] = {
                **messages[user],
                "content": tag(messages[user]["content"], _current.get()),
            }
            return messages  # fmt: skip

    return FaultMCPTools
