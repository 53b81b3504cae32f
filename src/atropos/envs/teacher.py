"""The teacher step of on-policy distillation: the teacher's top-k logprobs on every group.

With `--teacher.base_url URL` (any environment; the settings are `config.TeacherConfig`), the
runners start a `Teacher` once, after the env's `setup()`, and hand it every group that passed
the send-side checks (`runner.groups.ready_groups`), in serve and process mode alike. For each
sequence of the group it asks the teacher servers for the prompt logprobs of the sequence's
full token ids, prompt and completion, exactly as the student produced them (`get_logprobs`:
vLLM's `prompt_logprobs`, SGLang's `input_top_logprobs`, `atropos local serve`), and fills the
group's fields in upstream's shapes, one entry per token of `tokens`:

    distill_token_ids[i][t] = the teacher's top_k token ids at position t, best first
    distill_logprobs[i][t]  = their logprobs, log p_T(id | tokens[i][:t])

Position 0 has no context: its lists are empty. Groups that already carry both fields (an
environment that filled them itself) are left as they are.

**Same tokenizer.** The student's ids go to the teacher as they are, and the teacher's top-k
ids are read as student ids, so both must use one tokenizer. `Teacher.start` checks that once:
the teacher's tokenizer (`--teacher.tokenizer_name`, else its model's) against the env's, by
name, else by vocabulary and a few probe encodings; a difference is a `ConfigError` (exit
status 2) that says what differs and why it matters.

**Failures.** Each call is retried by the teacher's `ServerManager` like any inference call
(bounded, retryable errors only). A group whose teacher call still fails is dropped and counted
(`dropped/teacher_failed`; `dropped/teacher_bad_answer` for an answer that does not line up
with the tokens sent): a group is never sent without its teacher logprobs. An error that will
repeat for every group (a model the teacher does not serve, a refused key, a teacher never
reached, teacher servers all unreachable for `--server_wait` seconds in a row) stops the run like
the policy's own (`TeacherError`, a `FatalError`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from atropos.envs.config import ConfigError, TeacherConfig
from atropos.inference.base import MISSING_LOGPROB, PromptLogprobs, gather_or_cancel
from atropos.inference.errors import FatalError, InferenceError, fatal_reason

if TYPE_CHECKING:  # annotations only: the runner drives an env, never imports its base
    from atropos.envs.base import BaseEnv
    from atropos.inference.manager import ServerManager

__all__ = [
    "BAD_ANSWER",
    "FAILED",
    "PROBES",
    "Teacher",
    "TeacherError",
    "check_same_tokenizer",
    "check_teacher_tokenizer",
    "tokenizer_difference",
]

log = logging.getLogger("atropos.env")

FAILED = "teacher_failed"  # drop reason: the teacher call failed after its retries
BAD_ANSWER = "teacher_bad_answer"  # drop reason: the answer does not line up with the tokens

PROBES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  two  spaces,\ttabs\nand\n\nnewlines ",
    "12345 + 67.89 = ?  x_1^2 {braces} [brackets] (parens) <tags/>",
    "def f(x):\n    return x * 2  # code",
    "Ünïcödé: naïve café, Straße, 日本語, emoji 🙂",
)
"""Texts both tokenizers must encode alike (beside an equal vocabulary)."""

RULE = (
    "On-policy distillation sends the student's token ids to the teacher as they are and reads"
    " the teacher's top-k token ids as student ids, so the teacher must use the environment's"
    " tokenizer (same vocabulary, same encoding); choose a teacher of the student's model"
    " family, or set --teacher.tokenizer_name if the teacher's tokenizer was named wrongly"
)


class TeacherError(FatalError):
    """A teacher failure that will repeat for every group (the runners stop the run)."""


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """What differs between two tokenizers, in words, or None when they agree: the
    vocabularies (token -> id), then the ids of each of `PROBES` (no special tokens added)."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        if len(ours) != len(theirs):
            return f"their vocabularies have {len(ours):,} and {len(theirs):,} tokens"
        token = min(t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t))
        return (
            f"their vocabularies differ: {token!r} is {ours.get(token)} in the environment's"
            f" and {theirs.get(token)} in the teacher's"
        )
    for text in PROBES:
        a = student.encode(text, add_special_tokens=False)
        b = teacher.encode(text, add_special_tokens=False)
        if list(a) != list(b):
            return (
                f"they encode {text!r} differently: {list(a)[:12]} (environment's) and"
                f" {list(b)[:12]} (teacher's)"
            )
    return None


def check_same_tokenizer(student: Any, student_name: str, teacher: Any, teacher_name: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (`ConfigError`)."""
    difference = tokenizer_difference(student, teacher)
    if difference is not None:
        raise ConfigError(
            f"--teacher: the teacher's tokenizer ({teacher_name}) is not the environment's"
            f" ({student_name}): {difference}. {RULE}"
        )


def teacher_tokenizer_name(config: TeacherConfig) -> str:
    """The teacher's tokenizer: `--teacher.tokenizer_name`, else its model's (the shipped
    tokenizer for the local tiny policy), as `layering.default_tokenizer` names a server's."""
    from atropos.envs.layering import default_tokenizer

    if config.tokenizer_name:
        return config.tokenizer_name
    if config.model_name == "default":
        raise ConfigError(
            "--teacher: name the teacher's model (--teacher.model_name, as its servers serve"
            " it) or its tokenizer (--teacher.tokenizer_name): the teacher must use the"
            " environment's tokenizer, and that is checked before the run starts"
        )
    return default_tokenizer(config.servers())[0]


async def check_teacher_tokenizer(env: BaseEnv[Any], config: TeacherConfig) -> None:
    """Refuse a teacher whose tokenizer is not the env's (`ConfigError`); the same name passes
    without loading anything."""
    from atropos.inference.tokenizer import TokenizerError, load_tokenizer

    student_name = env.config.tokenizer_name
    teacher_name = teacher_tokenizer_name(config)
    if teacher_name == student_name:
        return
    student = await asyncio.to_thread(lambda: env.tokenizer)
    try:
        teacher = await asyncio.to_thread(load_tokenizer, teacher_name)
    except TokenizerError as err:
        why = str(err).split("; set --env.")[0]  # its advice names the env's flag
        raise ConfigError(
            f"--teacher: cannot load the teacher's tokenizer {teacher_name!r} to check it"
            f" against the environment's ({why}); set --teacher.tokenizer_name to the"
            " teacher's tokenizer (a local directory or a model id this machine can reach)"
        ) from None
    check_same_tokenizer(student, student_name, teacher, teacher_name)


class Teacher:
    """Fills `distill_token_ids` / `distill_logprobs` of groups from the teacher's servers.

    Args:
        config: the `--teacher.*` settings.
        manager: the teacher's servers (closed by `aclose`).
    """

    max_messages = 20  # distinct failure messages logged; later ones are only counted

    def __init__(self, config: TeacherConfig, manager: ServerManager) -> None:
        self.config = config
        self.manager = manager
        self._logged: set[str] = set()

    @classmethod
    async def start(cls, env: BaseEnv[Any]) -> Teacher | None:
        """The env's teacher (None without `--teacher.base_url`), its tokenizer checked against
        the env's; it closes with the env (`env.on_close`)."""
        config: TeacherConfig | None = getattr(env.config, "teacher", None)
        if config is None or not config.enabled:
            return None
        from atropos.inference.manager import ServerManager

        await check_teacher_tokenizer(env, config)
        manager = ServerManager(config.servers(), env.manager_config, role="teacher")
        made = cls(config, manager)
        env.on_close(made.aclose)
        log.warning("teacher: top-%d logprobs from %s", config.top_k, ", ".join(config.base_url))
        return made

    async def annotate(
        self, groups: list[dict[str, Any]], drops: Counter[str]
    ) -> list[dict[str, Any]]:
        """`groups` with their teacher fields filled; a group whose teacher call failed is left
        out and counted in `drops` by reason. Raises `TeacherError` on a fatal failure."""
        reasons = await gather_or_cancel(self._fill(group) for group in groups)
        kept = []
        for group, reason in zip(groups, reasons, strict=True):
            if reason is None:
                kept.append(group)
            else:
                drops[reason] += 1
        return kept

    async def _fill(self, group: dict[str, Any]) -> str | None:
        """Fill one group; the drop reason when it cannot be (`FAILED`, `BAD_ANSWER`)."""
        if group.get("distill_token_ids") is not None and group.get("distill_logprobs") is not None:
            return None
        tokens: list[list[int]] = group["tokens"]
        try:
            answers = await gather_or_cancel(self._ask(seq) for seq in tokens)
        except InferenceError as err:
            if fatal_reason(err) is not None:
                raise TeacherError(f"teacher: {err}".replace("--openai.", "--teacher.")) from err
            self._note(f"{FAILED}: {err}")
            return FAILED
        rows = []
        for seq, answer in zip(tokens, answers, strict=True):
            row = self._row(seq, answer)
            if isinstance(row, str):
                self._note(f"{BAD_ANSWER}: {row}")
                return BAD_ANSWER
            rows.append(row)
        group["distill_token_ids"] = [ids for ids, _ in rows]
        group["distill_logprobs"] = [lps for _, lps in rows]
        return None

    async def _ask(self, seq: list[int]) -> PromptLogprobs:
        return await self.manager.get_logprobs(input_ids=seq, top_k=self.config.top_k)

    def _row(
        self, seq: list[int], answer: PromptLogprobs
    ) -> tuple[list[list[int]], list[list[float]]] | str:
        """One sequence's rows from the teacher's answer, or what is wrong with the answer."""
        ids, lps = answer["prompt_topk_token_ids"], answer["prompt_topk_logprobs"]
        sent = answer.get("prompt_tokens") or seq
        if list(sent) != list(seq):
            return f"the teacher scored other tokens than the {len(seq)} sent"
        if len(ids) != len(seq) or len(lps) != len(seq):
            return f"{len(ids)} positions of teacher logprobs for {len(seq)} tokens"
        k = self.config.top_k
        for t, (top_ids, top_lps) in enumerate(zip(ids, lps, strict=True)):
            if len(top_ids) != len(top_lps) or len(top_ids) > k:
                return f"position {t}: {len(top_ids)} ids and {len(top_lps)} logprobs (top_k {k})"
        finite = [[lp if math.isfinite(lp) else MISSING_LOGPROB for lp in row] for row in lps]
        return [list(row) for row in ids], finite

    def _note(self, message: str) -> None:
        """Log a failure once per distinct message (the counts are in the drop metrics)."""
        if message in self._logged or len(self._logged) >= self.max_messages:
            return
        self._logged.add(message)
        log.warning("%s; the group is dropped (the same failure again is only counted)", message)

    async def aclose(self) -> None:
        """Close the teacher's server manager."""
        await self.manager.aclose()
