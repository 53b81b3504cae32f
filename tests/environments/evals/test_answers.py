"""Each benchmark's answer extraction on hand-made completions: odd formats, several answers,
missing answers."""

from __future__ import annotations

import pytest

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.evals import (
    AIMEEval,
    GPQAEval,
    GSM8KEval,
    IFEvalEval,
    Math500Eval,
    MMLUEval,
    Problem,
)
from atropos.environments.evals.answers import grade_boxed, grade_choice, normalize
from atropos.environments.evals.rows import shuffled

from .helpers import make

# ----- GSM8K -------------------------------------------------------------------------------------

GSM8K = make(GSM8KEval)
GSM8K_ITEM = GSM8K.problem({"question": "q", "answer": "5 * 1,060 = 5,300\n#### 5,300"}, 0)


@pytest.mark.parametrize(
    ("completion", "extracted", "correct"),
    [
        ("<think>4 * 1250 + 300</think> The answer is \\boxed{5300}.", "5300", True),
        ("\\boxed{5,300}", "5,300", True),
        ("\\boxed{5300.0}", "5300.0", True),
        ("\\boxed{\\$5,300}", "\\$5,300", True),
        ("\\boxed{5300 \\text{ sheets}}", "5300 \\text{ sheets}", True),
        ("\\boxed{ 5300 }", "5300", True),
        ("First \\boxed{5300}, so again \\boxed{5,300}", "5,300", True),  # the same answer twice
        ("\\boxed{5300} or maybe \\boxed{5301}", "5300 | 5301", False),  # different answers
        ("<think>\\boxed{5301}</think> \\boxed{5300}", "5300", True),  # only after thinking
        ("<think>\\boxed{5300}</think> \\boxed{5301}", "5301", False),
        ("<think>\\boxed{5300} and then the limit hit", None, False),  # unclosed think
        ("The answer is 5300.", None, False),  # no box: unanswered
        ("\\boxed{5301}", "5301", False),
        ("", None, False),
    ],
)
def test_gsm8k_reads_one_boxed_answer(completion, extracted, correct):
    graded = GSM8K.grade_completion(GSM8K_ITEM, completion)
    assert (graded.extracted, graded.correct) == (extracted, correct)


def test_gsm8k_string_fallback_when_math_verify_says_no():
    # math-verify cannot read a bare word; the normalised strings still match
    assert grade_boxed("\\boxed{\\text{seven}}", "seven").correct
    assert not grade_boxed("\\boxed{\\text{eight}}", "seven").correct
    assert normalize("\\$5,300.00") == "5300"


# ----- MATH-500 ----------------------------------------------------------------------------------

MATH = make(Math500Eval)


@pytest.mark.parametrize(
    ("gold", "completion", "correct"),
    [
        ("\\frac{5}{6}", "\\boxed{\\dfrac{5}{6}}", True),
        ("\\frac{5}{6}", "\\boxed{5/6}", True),
        ("\\frac{5}{6}", "\\boxed{\\frac{10}{12}}", True),
        ("\\frac{5}{6}", "\\boxed{0.83}", False),
        ("2\\sqrt{5}", "\\boxed{\\sqrt{20}}", True),
        ("2\\sqrt{5}", "\\boxed{2\\sqrt5}", True),
        ("2\\sqrt{5}", "$2\\sqrt{5}$", False),  # not boxed
        ("\\frac{1}{6}", "\\boxed{\\frac{1}{6}} and also \\boxed{\\frac{1}{3}}", False),
        ("12", "\\boxed{12\\%}", True),
        ("4", "So $x = 3$ gives the minimum \\boxed{4}.", True),
    ],
)
def test_math500_checks_the_box_with_math_verify(gold, completion, correct):
    problem = MATH.problem({"problem": "p", "answer": gold, "subject": "Algebra", "level": 2}, 0)
    assert MATH.grade_completion(problem, completion).correct is correct


def test_math500_fixture_golds_verify_and_group_by_level_and_subject():
    rows = read_jsonl(data_path("evals", "math500.jsonl"))
    assert len(rows) == 10
    for i, row in enumerate(rows):
        assert {"problem", "solution", "answer", "subject", "level", "unique_id"} <= set(row)
        problem = MATH.problem(row, i)
        assert problem.subsets == {"level": str(row["level"]), "subject": row["subject"]}
        assert MATH.grade(problem, f"\\boxed{{{row['answer']}}}").correct, row
        assert f"\\boxed{{{row['answer']}}}" in row["solution"]


# ----- AIME --------------------------------------------------------------------------------------

AIME = make(AIMEEval)


@pytest.mark.parametrize(
    ("completion", "extracted", "correct"),
    [
        ("\\boxed{401}", "401", True),
        ("\\boxed{0401}", "0401", True),
        ("\\boxed{401.0}", "401.0", True),
        ("$\\boxed{401}$.", "401", True),
        ("\\boxed{\\frac{802}{2}}", "\\frac{802}{2}", True),  # math-verify's fallback
        ("\\boxed{400}", "400", False),
        ("\\boxed{401} or \\boxed{400}", "401 | 400", False),
        ("\\boxed{401} and once more \\boxed{0401}", "0401", True),
        ("The remainder is 401.", None, False),
    ],
)
def test_aime_reads_an_integer(completion, extracted, correct):
    problem = AIME.problem({"id": 2, "problem": "p", "answer": "401"}, 0)
    graded = AIME.grade_completion(problem, completion)
    assert (graded.extracted, graded.correct) == (extracted, correct)


def test_aime_refuses_a_gold_answer_that_is_not_an_integer():
    with pytest.raises(ValueError, match="not an integer"):
        AIME.problem({"problem": "p", "answer": "1/2"}, 0)


# ----- multiple choice (MMLU, GPQA) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "extracted", "correct"),
    [
        ("The best answer is: B", "B", True),
        ("The correct answer is (B).", "B", True),
        ("**Answer:** B", "B", True),
        ("**Answer**: B", "B", True),
        ("Final answer: B", "B", True),
        ("Answer: (B)", "B", True),
        ("B", "B", True),
        ("(b)", "B", True),
        ("**B**", "B", True),
        ("\\boxed{b}", "B", True),
        ("The answer is Mercury", "B", True),  # the right option's text
        ("The answer is B. To be sure: the best answer is B.", "B", True),  # the same twice
        ("The answer is B. No wait, the answer is C.", "B,C", False),  # two different letters
        ("The best answer is: D", "D", False),
        ("I would go with B, maybe.", None, False),  # no stated answer
        ("the answer is b", None, False),  # lower case after a phrase is no letter (mcqa's rule)
    ],
)
def test_choice_letters_are_read_like_mcqa(answer, extracted, correct):
    graded = grade_choice(answer, "B", "Mercury")
    assert (graded.extracted, graded.correct) == (extracted, correct)


def test_mmlu_prompt_grading_and_few_shot():
    env = make(MMLUEval)
    problem = env.problem(read_jsonl(data_path("evals", "mmlu.jsonl"))[3], 3)  # Mitochondrion
    assert (problem.gold, problem.subsets) == ("C", {"subject": "high_school_biology"})
    assert "C. Mitochondrion" in problem.prompt and "The best answer is: X" in problem.prompt
    assert env.grade_completion(problem, "<think>ATP</think>The answer is Mitochondrion").correct
    assert not env.grade_completion(problem, "<think>hm</think> The best answer is: A").correct
    shot = make(MMLUEval, few_shot=2).problem(read_jsonl(data_path("evals", "mmlu.jsonl"))[3], 3)
    assert shot.data["few_shot"] == 2
    assert (
        "carries the genetic information" in shot.prompt and "The best answer is: C" in shot.prompt
    )
    assert shot.prompt.index("Which blood cells") < shot.prompt.index("Which organelle")
    lettered = {"question": "q", "subject": "s", "choices": list("wxyz"), "answer": "D"}
    assert make(MMLUEval).problem(lettered, 0).gold == "D"


def test_gpqa_shuffles_each_item_the_same_way_every_time():
    rows = read_jsonl(data_path("evals", "gpqa.jsonl"))
    golds = []
    for row in rows:
        options, letter = shuffled(row)
        assert options[ord(letter) - 65] == row["Correct Answer"]
        wrong = [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        assert sorted(options) == sorted([row["Correct Answer"], *wrong])
        assert shuffled(dict(row)) == (options, letter)  # a copy: the same order
        golds.append(letter)
    assert golds == ["D", "B", "D", "D", "B", "B", "D", "A"]  # fixed by the record ids
    assert len(set(golds)) > 1  # not always the first option
    env = make(GPQAEval)
    problem = env.problem(rows[0], 0)
    assert (problem.id, problem.gold) == ("gpqa-fx-phys-1", "D")
    assert problem.subsets == {"domain": "Physics"}
    assert "D. It is divided by 4" in problem.prompt
    assert env.grade_completion(problem, "The answer is: It is divided by 4").correct
    assert not env.grade_completion(problem, "The best answer is: A").correct


# ----- IFEval ------------------------------------------------------------------------------------

IFEVAL = make(IFEvalEval)


def ifeval_problem(ids: list[str], kwargs: list[dict]) -> Problem:
    return IFEVAL.problem(
        {"key": 1, "prompt": "p", "instruction_id_list": ids, "kwargs": kwargs}, 0
    )


@pytest.mark.parametrize(
    ("response", "strict", "loose"),
    [
        ("all quiet on the water.", [True, True], [True, True]),
        ("All quiet, on the water.", [False, False], [False, False]),
        ("Sure:\nall quiet on the water.", [False, True], [True, True]),  # a preamble: loose only
        ("all quiet, on the water.", [True, False], [True, False]),
    ],
)
def test_ifeval_grades_strictly_and_loosely(response, strict, loose):
    problem = ifeval_problem(["change_case:english_lowercase", "punctuation:no_comma"], [{}, {}])
    graded = IFEVAL.grade_completion(problem, f"<think>Plan.</think>{response}")
    assert (graded.details["strict"], graded.details["loose"]) == (strict, loose)
    assert graded.correct is all(strict)


def test_ifeval_reads_hub_style_kwargs_with_unused_keys_set_to_none():
    kwargs = [{"num_words": 5, "relation": "at least", "keywords": None, "end_phrase": None}]
    problem = ifeval_problem(["length_constraints:number_words"], kwargs)
    assert IFEVAL.grade(problem, "one two three four five").correct
    assert not IFEVAL.grade(problem, "one two three").correct


def test_every_fixture_row_is_in_its_benchmarks_layout():
    layouts = {
        "gsm8k.jsonl": {"question", "answer"},
        "aime.jsonl": {"id", "problem", "answer"},
        "mmlu.jsonl": {"question", "subject", "choices", "answer"},
        "mmlu_dev.jsonl": {"question", "subject", "choices", "answer"},
        "gpqa.jsonl": {"Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 3"},
        "ifeval.jsonl": {"key", "prompt", "instruction_id_list", "kwargs"},
    }
    for name, keys in layouts.items():
        rows = read_jsonl(data_path("evals", name))
        assert rows and all(keys <= set(row) for row in rows), name
    for row in read_jsonl(data_path("evals", "aime.jsonl")):
        assert 0 <= int(row["answer"]) <= 999
    for row in read_jsonl(data_path("evals", "mmlu.jsonl")):
        assert len(row["choices"]) == 4 and row["answer"] in range(4)
    gsm8k = make(GSM8KEval)
    for i, row in enumerate(read_jsonl(data_path("evals", "gsm8k.jsonl"))):
        problem = gsm8k.problem(row, i)
        assert gsm8k.grade(problem, f"\\boxed{{{problem.gold}}}").correct, row
