"""IFEval-style accuracy: strict and loose, at the prompt level and the instruction level.

A prompt carries one or more instructions. *Strict*: the response itself follows an
instruction. *Loose* (IFEval's definition): some variant of the response does, among the
response with markdown `*` removed, without its first line, without its last line, and both
(8 variants, blank ones skipped), which forgives a preamble ("Sure, here it is:") or a sign-off.
Prompt-level accuracy counts prompts whose every instruction is followed; instruction-level
counts instructions.

`from_ifeval` reads Google's IFEval rows (`instruction_id_list` + `kwargs`), so an IFEval
evaluation environment needs only `follow` and `accuracy`:

>>> row = {"prompt": "Write a haiku. No commas.", "instruction_id_list": ["punctuation:no_comma"],
...        "kwargs": [{}]}
>>> result = follow("Here it is:\\nold pond frog jumps in", from_ifeval(row))
>>> result.strict, result.loose
((True,), (True,))
>>> accuracy([result, follow("a, b", from_ifeval(row))])["prompt_level_strict_acc"]
0.5
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atropos.environments.common.ifeval.registry import verify

__all__ = [
    "IFEVAL_INSTRUCTIONS",
    "Instruction",
    "PromptResult",
    "accuracy",
    "follow",
    "from_ifeval",
    "loose_variants",
]


@dataclass(frozen=True)
class Instruction:
    """One instruction: a check name and its arguments (RLVR-IFeval names)."""

    func_name: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptResult:
    """Per-instruction outcomes of one response, strict and loose."""

    strict: tuple[bool, ...]
    loose: tuple[bool, ...]


def loose_variants(response: str) -> list[str]:
    """The response and IFEval's 7 relaxations of it, blank ones left out.

    >>> for variant in loose_variants("Sure:\\n**Hi**\\nBye"):
    ...     print(repr(variant))
    'Sure:\\n**Hi**\\nBye'
    '**Hi**\\nBye'
    'Sure:\\n**Hi**'
    '**Hi**'
    'Sure:\\nHi\\nBye'
    'Hi\\nBye'
    'Sure:\\nHi'
    'Hi'
    """
    variants = []
    for text in (response, response.replace("*", "")):
        lines = text.split("\n")
        variants.append(text)
        variants.extend("\n".join(cut).strip() for cut in (lines[1:], lines[:-1], lines[1:-1]))
    return [v for v in variants if v.strip()]


def follow(response: str, instructions: Sequence[Instruction]) -> PromptResult:
    """Which instructions `response` follows, strictly and loosely."""
    variants = loose_variants(response)
    strict = tuple(verify(i.func_name, response, i.args) for i in instructions)
    loose = tuple(
        s or any(verify(i.func_name, v, i.args) for v in variants)
        for s, i in zip(strict, instructions, strict=True)
    )
    return PromptResult(strict, loose)


def accuracy(results: Iterable[PromptResult]) -> dict[str, float]:
    """IFEval's four numbers: prompt- and instruction-level accuracy, strict and loose."""
    results = list(results)
    out: dict[str, float] = {}
    for mode in ("strict", "loose"):
        per_prompt = [getattr(r, mode) for r in results]
        flat = [ok for outcomes in per_prompt for ok in outcomes]
        out[f"prompt_level_{mode}_acc"] = (
            sum(all(o) for o in per_prompt) / len(per_prompt) if per_prompt else 0.0
        )
        out[f"inst_level_{mode}_acc"] = sum(flat) / len(flat) if flat else 0.0
    return out


# IFEval instruction id -> (check, {IFEval kwarg: our arg}, fixed args)
IFEVAL_INSTRUCTIONS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "keywords:existence": ("verify_keywords", {"keywords": "keyword_list"}, {}),
    "keywords:frequency": (
        "verify_keyword_frequency",
        {"keyword": "word", "frequency": "N", "relation": "quantifier"},
        {},
    ),
    "keywords:forbidden_words": (
        "validate_forbidden_words",
        {"forbidden_words": "forbidden_words"},
        {},
    ),
    "keywords:letter_frequency": (
        "verify_letter_frequency",
        {"letter": "letter", "let_frequency": "N", "let_relation": "quantifier"},
        {},
    ),
    "language:response_language": ("validate_response_language", {"language": "language"}, {}),
    "length_constraints:number_sentences": (
        "verify_sentence_constraint",
        {"num_sentences": "N", "relation": "quantifier"},
        {},
    ),
    "length_constraints:number_paragraphs": ("verify_paragraph_count", {"num_paragraphs": "N"}, {}),
    "length_constraints:number_words": (
        "validate_word_constraint",
        {"num_words": "N", "relation": "quantifier"},
        {},
    ),
    "length_constraints:nth_paragraph_first_word": (
        "validate_paragraphs",
        {"num_paragraphs": "N", "nth_paragraph": "i", "first_word": "first_word"},
        {},
    ),
    "detectable_content:number_placeholders": (
        "validate_placeholders",
        {"num_placeholders": "N"},
        {},
    ),
    "detectable_content:postscript": (
        "verify_postscript",
        {"postscript_marker": "postscript_marker"},
        {},
    ),
    "detectable_format:number_bullet_lists": ("verify_bullet_points", {"num_bullets": "N"}, {}),
    "detectable_format:constrained_response": ("validate_choice", {}, {}),
    "detectable_format:number_highlighted_sections": (
        "validate_highlighted_sections",
        {"num_highlights": "N"},
        {},
    ),
    "detectable_format:multiple_sections": (
        "validate_sections",
        {"section_spliter": "section_splitter", "num_sections": "N"},
        {"quantifier": "at least"},
    ),
    "detectable_format:json_format": ("validate_json_format", {}, {}),
    "detectable_format:title": ("validate_title", {}, {}),
    "combination:two_responses": ("validate_two_responses", {}, {}),
    "combination:repeat_prompt": (
        "validate_repeat_prompt",
        {"prompt_to_repeat": "original_prompt"},
        {},
    ),
    "startend:end_checker": ("validate_end", {"end_phrase": "end_phrase"}, {}),
    "startend:quotation": ("validate_quotation", {}, {}),
    "change_case:capital_word_frequency": (
        "validate_frequency_capital_words",
        {"capital_frequency": "N", "capital_relation": "quantifier"},
        {},
    ),
    "change_case:english_capital": ("validate_uppercase", {}, {}),
    "change_case:english_lowercase": ("validate_lowercase", {}, {}),
    "punctuation:no_comma": ("validate_no_commas", {}, {}),
}


def from_ifeval(row: Mapping[str, Any]) -> list[Instruction]:
    """The instructions of a Google IFEval row (`instruction_id_list`, `kwargs`).

    Raises:
        ValueError: an instruction id this package does not know.
    """
    ids = list(row["instruction_id_list"])
    kwargs = row.get("kwargs") or [{}] * len(ids)
    instructions = []
    for instruction_id, given in zip(ids, kwargs, strict=True):
        if instruction_id not in IFEVAL_INSTRUCTIONS:
            raise ValueError(f"unknown IFEval instruction id {instruction_id!r}")
        name, renames, fixed = IFEVAL_INSTRUCTIONS[instruction_id]
        args = {ours: (given or {}).get(theirs) for theirs, ours in renames.items()}
        kept = {k: v for k, v in args.items() if v is not None}
        instructions.append(Instruction(name, {**fixed, **kept}))
    return instructions
