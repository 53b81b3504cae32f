r"""The table of evaluation suites: one `Suite` per benchmark, and the environment class each
becomes (`suite_env`). Field names follow each dataset's hub card; fixtures live under
`atropos/environments/data/evals/` in the same layout, written for atropos.

MMLU (few-shot examples from its dev split) and IFEval (strict and loose instruction checks)
keep classes of their own, `mmlu.py` and `ifeval.py`.

>>> list(ENVS)[:4], ENVS["eval_arc"].suite is ARC
(['eval_gsm8k', 'eval_math500', 'eval_aime', 'eval_gpqa'], True)
>>> len(SUITES), len({suite.benchmark for suite in SUITES})
(21, 21)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atropos.environments.evals import rows
from atropos.environments.evals.answers import LETTERS
from atropos.environments.evals.formats import (
    BoxedInteger,
    BoxedMath,
    MultipleChoice,
    Row,
    Spans,
    Target,
    YesNo,
)
from atropos.environments.evals.judged import (
    ArenaJudged,
    ArenaPrompt,
    Conversation,
    MTBenchJudged,
    ShortAnswer,
    SimpleQAJudged,
    simpleqa_topic,
)
from atropos.environments.evals.suite import Part, Suite, SuiteEval, one, suite_env
from atropos.rewards.math import gsm8k_gold

__all__ = ["ENVS", "SUITES"]

BOXED_PROMPT = "Solve the problem, then give the final answer as \\boxed{answer}."


def text(key: str) -> Callable[[Row], str]:
    """A reader of the text field `key`."""
    return lambda row: str(row[key])


def fields(*keys: str) -> Callable[[Row], dict[str, str]]:
    """Subsets read from the fields `keys` (a field a row lacks is left out)."""
    return lambda row: {k: str(row[k]) for k in keys if row.get(k) not in (None, "")}


GSM8K = Suite(
    "eval_gsm8k",
    "GSM8K word problems; a \\boxed{} answer checked by math-verify (string fallback)",
    one("openai/gsm8k", "test", "gsm8k.jsonl", "main"),
    BoxedMath(text("question"), lambda row: gsm8k_gold(str(row["answer"]))),
    system_prompt="Solve the problem step by step, then give the final answer as \\boxed{answer}.",
)
MATH500 = Suite(
    "eval_math500",
    "MATH-500 competition problems; a \\boxed{} answer checked by math-verify",
    one("HuggingFaceH4/MATH-500", "test", "math500.jsonl"),
    BoxedMath(text("problem"), lambda row: str(row["answer"]).strip()),
    ident=lambda row, i: str(row.get("unique_id") or f"math500-{i}"),
    subsets=fields("level", "subject"),
    system_prompt=BOXED_PROMPT,
)
AIME = Suite(
    "eval_aime",
    "AIME problems; the \\boxed{} integer must equal the gold (0 to 999)",
    one("HuggingFaceH4/aime_2024", "train", "aime.jsonl"),
    BoxedInteger(text("problem"), lambda row: row["answer"]),
    ident="id",
    system_prompt="Solve the problem. The answer is an integer from 0 to 999; give it as"
    " \\boxed{answer}.",
)
GPQA = Suite(
    "eval_gpqa",
    "GPQA graduate-level science questions, options shuffled per item; the right letter",
    one("Idavidrein/gpqa", "train", "gpqa.jsonl", "gpqa_diamond"),
    MultipleChoice(
        text("Question"),
        lambda row: rows.shuffled(row)[0],
        lambda row: LETTERS.index(rows.shuffled(row)[1]),
    ),
    ident="Record ID",
    subsets=lambda row: (
        {"domain": str(row["High-level domain"])} if row.get("High-level domain") else {}
    ),
)
ARC = Suite(
    "eval_arc",
    "ARC grade-school science questions (Easy and Challenge sets); the right letter",
    tuple(
        Part(label, "allenai/ai2_arc", label, "test", f"arc/{label}.jsonl")
        for label in ("ARC-Easy", "ARC-Challenge")
    ),
    MultipleChoice(text("question"), lambda row: row["choices"]["text"], rows.labelled_index),
    ident="id",
)
BOOLQ = Suite(
    "eval_boolq",
    "BoolQ yes/no questions about a Wikipedia passage",
    one("lighteval/boolq_helm", "validation", "boolq.jsonl"),
    YesNo(
        lambda row: f"{row['passage']}\n\nQuestion: {str(row['question']).replace('??', '?')}",
        lambda row: rows.yes_no(row["answer"]),
    ),
)
HELLASWAG = Suite(
    "eval_hellaswag",
    "HellaSwag: the most plausible ending of an everyday scene; the right letter",
    one("Rowan/hellaswag", "validation", "hellaswag.jsonl"),
    MultipleChoice(
        lambda row: f"How does this most plausibly go on?\n\n{row['activity_label']}: {row['ctx']}",
        lambda row: row["endings"],
        lambda row: int(row["label"]),
    ),
    ident="ind",
)
PIQA = Suite(
    "eval_piqa",
    "PIQA physical commonsense: which of two solutions reaches the goal; the right letter",
    one("ybisk/piqa", "validation", "piqa.jsonl"),
    MultipleChoice(
        lambda row: f"Goal: {row['goal']}\n\nWhich solution reaches the goal?",
        lambda row: [row["sol1"], row["sol2"]],
        lambda row: int(row["label"]),
    ),
)
SIQA = Suite(
    "eval_siqa",
    "Social IQa: people's motives, reactions and what happens next; the right letter",
    one("allenai/social_i_qa", "validation", "siqa.jsonl"),
    MultipleChoice(
        lambda row: f"{row['context']}\n\n{row['question']}",
        lambda row: [row[f"answer{letter}"] for letter in "ABC"],
        lambda row: int(row["label"]) - 1,
    ),
)
WINOGRANDE = Suite(
    "eval_winogrande",
    "WinoGrande: which of two names or things fills the blank; the right letter",
    one("allenai/winogrande", "validation", "winogrande.jsonl", "winogrande_xl"),
    MultipleChoice(
        lambda row: f"Which option fills the blank (_) best?\n\n{row['sentence']}",
        lambda row: [row["option1"], row["option2"]],
        lambda row: int(row["answer"]) - 1,
    ),
)
OPENBOOKQA = Suite(
    "eval_openbookqa",
    "OpenBookQA elementary science with common knowledge; the right letter",
    one("allenai/openbookqa", "test", "openbookqa.jsonl", "main"),
    MultipleChoice(text("question_stem"), lambda row: row["choices"]["text"], rows.labelled_index),
    ident="id",
)
MMLU_PRO = Suite(
    "eval_mmlu_pro",
    "MMLU-Pro: up to ten options per question, by category; the right letter",
    one("TIGER-Lab/MMLU-Pro", "test", "mmlu_pro.jsonl"),
    MultipleChoice(text("question"), lambda row: row["options"], lambda row: row["answer_index"]),
    ident="question_id",
    subsets=fields("category"),
)
BBH_TASKS = (
    "boolean_expressions causal_judgement date_understanding disambiguation_qa dyck_languages"
    " formal_fallacies geometric_shapes hyperbaton logical_deduction_five_objects"
    " logical_deduction_seven_objects logical_deduction_three_objects movie_recommendation"
    " multistep_arithmetic_two navigate object_counting penguins_in_a_table"
    " reasoning_about_colored_objects ruin_names salient_translation_error_detection snarks"
    " sports_understanding temporal_sequences tracking_shuffled_objects_five_objects"
    " tracking_shuffled_objects_seven_objects tracking_shuffled_objects_three_objects web_of_lies"
    " word_sorting"
).split()
BBH_FIXTURES = (
    "boolean_expressions date_understanding dyck_languages formal_fallacies"
    " multistep_arithmetic_two sports_understanding word_sorting"
).split()
BBH = Suite(
    "eval_bbh",
    "BIG-Bench Hard: 27 reasoning tasks, the answer matched to the target per task",
    tuple(
        Part(
            task,
            "lukaemon/bbh",
            task,
            "test",
            f"bbh/{task}.jsonl" if task in BBH_FIXTURES else None,
        )
        for task in BBH_TASKS
    ),
    Target(rows.bbh_input, rows.bbh_target),
    part_group="task",
)
DROP = Suite(
    "eval_drop",
    "DROP reading comprehension with counting and arithmetic; exact match and F1 on spans",
    one("lighteval/drop_harness", "validation", "drop.jsonl"),
    Spans(lambda row: f"Passage: {row['passage']}\n\nQuestion: {row['question']}", rows.drop_golds),
    ident="query_id",
)
AGIEVAL_ENGLISH = (
    "aqua-rat logiqa-en lsat-ar lsat-lr lsat-rc sat-en sat-en-without-passage sat-math"
)
AGIEVAL_CHINESE = (
    "gaokao-biology gaokao-chemistry gaokao-chinese gaokao-english gaokao-geography"
    " gaokao-history gaokao-mathqa gaokao-physics logiqa-zh"
)
AGIEVAL_FIXTURES = ("aqua-rat", "logiqa-en", "lsat-ar", "sat-math")
AGIEVAL = Suite(
    "eval_agieval",
    "AGIEval admission and qualification exam questions (English by default); the right letter",
    tuple(
        Part(
            label,
            f"dmayhem93/agieval-{label}",
            None,
            "test",
            f"agieval/{label}.jsonl" if label in AGIEVAL_FIXTURES else None,
            default=label in AGIEVAL_ENGLISH.split(),
        )
        for label in (AGIEVAL_ENGLISH + " " + AGIEVAL_CHINESE).split()
    ),
    MultipleChoice(rows.agieval_query, rows.agieval_options, lambda row: int(row["gold"][0])),
    family="dmayhem93/agieval",
    keep=lambda row: len(row["gold"]) == 1,  # a question with several right options is left out
)
MUSR = Suite(
    "eval_musr",
    "MuSR: murder mysteries, object placements and team allocations told as long stories",
    tuple(
        Part(task, "TAUR-Lab/MuSR", None, task, f"musr/{task}.jsonl")
        for task in ("murder_mysteries", "object_placements", "team_allocation")
    ),
    MultipleChoice(
        lambda row: f"{row['narrative']}\n\n{row['question']}",
        lambda row: rows.listed(row["choices"]),
        lambda row: int(row["answer_index"]),
    ),
    part_group="task",
)
PUBMEDQA = Suite(
    "eval_pubmedqa",
    "PubMedQA: a research question answered yes, no or maybe from its abstract",
    one("qiaojin/PubMedQA", "train", "pubmedqa.jsonl", "pqa_labeled"),
    YesNo(rows.pubmedqa_question, text("final_decision"), ("yes", "no", "maybe")),
    ident="pubid",
)
OLYMPIADBENCH = Suite(
    "eval_olympiadbench",
    "OlympiadBench olympiad maths and physics (English, text only); \\boxed{} answers",
    tuple(
        Part(config, "Hothan/OlympiadBench", config, "train", f"olympiadbench/{config}.jsonl")
        for config in ("OE_TO_maths_en_COMP", "OE_TO_physics_en_COMP")
    ),
    BoxedMath(rows.olympiad_question, rows.olympiad_golds),
    ident="id",
    system_prompt=BOXED_PROMPT,
)
SIMPLEQA = Suite(
    "eval_simpleqa",
    "SimpleQA short factual questions; the judge grades correct, incorrect or not attempted",
    one("lighteval/SimpleQA", "test", "simpleqa.jsonl"),
    ShortAnswer(text("problem"), text("answer")),
    subsets=simpleqa_topic,
)
MT_BENCH = Suite(
    "eval_mt_bench",
    "MT-Bench two-turn conversations; the judge rates each answer from 1 to 10",
    one("lighteval/mt-bench", "train", "mt_bench.jsonl"),
    Conversation(lambda row: list(row["turns"]), lambda row: list(row.get("reference") or [])),
    ident="question_id",
    subsets=fields("category"),
)
ARENA_HARD = Suite(
    "eval_arena_hard",
    "Arena-Hard prompts; the judge compares each answer with a baseline answer (win rate)",
    one("NousResearch/arena-hard-v1-prompts", "train", "arena_hard/prompts.jsonl"),
    ArenaPrompt(text("prompt")),
    ident="uid",
    subsets=fields("category"),
)

GSM8KEval = suite_env(GSM8K, "GSM8KEval")
Math500Eval = suite_env(MATH500, "Math500Eval")
AIMEEval = suite_env(AIME, "AIMEEval")
GPQAEval = suite_env(GPQA, "GPQAEval")
ARCEval = suite_env(ARC, "ARCEval")
BoolQEval = suite_env(BOOLQ, "BoolQEval")
HellaSwagEval = suite_env(HELLASWAG, "HellaSwagEval")
PIQAEval = suite_env(PIQA, "PIQAEval")
SIQAEval = suite_env(SIQA, "SIQAEval")
WinoGrandeEval = suite_env(WINOGRANDE, "WinoGrandeEval")
OpenBookQAEval = suite_env(OPENBOOKQA, "OpenBookQAEval")
MMLUProEval = suite_env(MMLU_PRO, "MMLUProEval")
BBHEval = suite_env(BBH, "BBHEval")
DROPEval = suite_env(DROP, "DROPEval")
AGIEvalEval = suite_env(AGIEVAL, "AGIEvalEval")
MuSREval = suite_env(MUSR, "MuSREval")
PubMedQAEval = suite_env(PUBMEDQA, "PubMedQAEval")
OlympiadBenchEval = suite_env(OLYMPIADBENCH, "OlympiadBenchEval")
SimpleQAEval = suite_env(SIMPLEQA, "SimpleQAEval", SimpleQAJudged)
MTBenchEval = suite_env(MT_BENCH, "MTBenchEval", MTBenchJudged)
ArenaHardEval = suite_env(ARENA_HARD, "ArenaHardEval", ArenaJudged)

ENVS: dict[str, type[SuiteEval[Any]]] = {  # the suites' environments by name, in the table's order
    cls.suite.name: cls
    for cls in (
        GSM8KEval,
        Math500Eval,
        AIMEEval,
        GPQAEval,
        ARCEval,
        BoolQEval,
        HellaSwagEval,
        PIQAEval,
        SIQAEval,
        WinoGrandeEval,
        OpenBookQAEval,
        MMLUProEval,
        BBHEval,
        DROPEval,
        AGIEvalEval,
        MuSREval,
        PubMedQAEval,
        OlympiadBenchEval,
        SimpleQAEval,
        MTBenchEval,
        ArenaHardEval,
    )
}
SUITES = tuple(cls.suite for cls in ENVS.values())
