"""The new suites' answer rules on hand-made answers: option letters, yes/no(/maybe) words, BBH's
targets per task kind, DROP's span EM/F1, OlympiadBench's several answers, and reading the
judges' verdicts (SimpleQA grades, MT-Bench ratings, Arena-Hard pairs)."""

from __future__ import annotations

import pytest

from atropos.environments.evals import (
    ARCEval,
    BBHEval,
    MTBenchEval,
    OlympiadBenchEval,
    PubMedQAEval,
)
from atropos.environments.evals.formats import Format
from atropos.environments.evals.judged import arena_points, majority_grade
from atropos.environments.evals.rows import drop_golds, labelled_index, listed
from atropos.environments.evals.rules import grade_target, grade_word, stated_answers
from atropos.environments.evals.spans import best_scores, normalize_span, scores
from atropos.envs.judge import boxed_choice, parse_rubric

from .helpers import make

# ----- option letters (ARC, with its two label styles) ------------------------------------------

ARC = make(ARCEval)
ARC_ROW = {
    "id": "t1",
    "question": "Which is a planet?",
    "choices": {"text": ["the Moon", "Mars", "the Sun"], "label": ["1", "2", "3"]},
    "answerKey": "2",
}


@pytest.mark.parametrize(
    ("completion", "correct"),
    [
        ("<think>Mars orbits the Sun.</think>The best answer is: B", True),
        ("The answer is Mars", True),  # the right option's text
        ("The best answer is: C", False),
        ("<think>it is B", False),  # an unclosed think block answers nothing
    ],
)
def test_option_letters_follow_the_label_of_the_right_option(completion, correct):
    problem = ARC.problem(ARC_ROW, 0)  # the letter rules themselves: test_answers.py
    assert (problem.id, problem.gold) == ("arc-t1", "B")  # label "2" is the second option
    assert "B. Mars" in problem.prompt and "The best answer is: X" in problem.prompt
    assert ARC.grade_completion(problem, completion).correct is correct


def test_an_answer_key_that_names_no_option_is_an_error():
    assert labelled_index({"choices": {"label": ["A", "B"]}, "answerKey": " B "}) == 1
    with pytest.raises(ValueError, match="is not in list"):
        ARC.problem({**ARC_ROW, "answerKey": "7"}, 0)


# ----- yes / no / maybe ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold", "extracted", "correct"),
    [
        ("Answer: yes", "yes", "yes", True),
        ("**Answer:** No.", "no", "no", True),
        ("The answer is Yes, because the passage says so.", "yes", "yes", True),
        ("Yes.", "yes", "yes", True),  # a one-line reply is its own answer
        ("\\boxed{no}", "no", "no", True),
        ("Answer: yes", "no", "yes", False),
        ("Answer: yes. On reflection, the answer is no.", "no", "yes,no", False),
        ("Answer: yes. Final answer: yes", "yes", "yes", True),  # the same word twice
        ("It could go either way.\nI am not sure.", "yes", None, False),
        ("Answer: perhaps", "yes", None, False),  # not a word of the set
    ],
)
def test_yes_no_words(answer, gold, extracted, correct):
    graded = grade_word(answer, gold)
    assert (graded.extracted, graded.correct) == (extracted, correct)


def test_pubmedqa_accepts_maybe_and_refuses_other_gold_words():
    env = make(PubMedQAEval)
    row = {
        "pubid": 1,
        "question": "Q?",
        "context": {"contexts": ["A.", "B."]},
        "final_decision": "maybe",
    }
    problem = env.problem(row, 0)
    assert problem.gold == "maybe" and problem.prompt.startswith("Context:\nA.\nB.\n\nQuestion: Q?")
    assert problem.prompt.endswith('"Answer: yes", "Answer: no", or "Answer: maybe".')
    assert env.grade(problem, "Answer: Maybe").correct
    assert not env.grade(problem, "Answer: yes").correct
    with pytest.raises(ValueError, match="'unsure' is not one of yes, no, maybe"):
        env.problem({**row, "final_decision": "unsure"}, 0)


# ----- BBH: the target, matched by its kind ------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "answer", "correct"),
    [
        ("(B)", "So the answer is (B).", True),  # an option: by its letter
        ("(B)", "So the answer is B.", True),
        ("(B)", "So the answer is (B) 03/08/2021.", True),
        ("(B)", "So the answer is (C).", False),
        ("(B)", "So the answer is b.", False),
        ("True", "So the answer is True.", True),  # a single word: in any case
        ("True", "So the answer is true", True),
        ("True", "So the answer is False.", False),
        ("valid", "So the answer is invalid.", False),
        ("invalid", "So the answer is **invalid**.", True),
        ("no", "So the answer is No.", True),
        ("-21", "So the answer is -21.", True),  # an integer: by value
        ("-21", "So the answer is -21.0", True),
        ("1200", "So the answer is 1,200.", True),
        ("-21", "So the answer is 21.", False),
        ("> )", "So the answer is >).", True),  # brackets: spaces do not matter
        ("> )", "So the answer is ) >.", False),
        ("apple mango pear", "So the answer is apple  mango pear.", True),  # free text
        ("apple mango pear", "So the answer is apple pear mango.", False),
        ("(A)", "I would pick (B) at first. So the answer is (A).", True),  # the last one counts
        ("(A)", "Let me think about the options.\nThey all look close.", False),  # none stated
    ],
)
def test_bbh_targets_per_task_kind(target, answer, correct):
    assert grade_target(answer, target).correct is correct


def test_stated_answers_are_read_in_order():
    text = "The answer is 4.\nFinal answer: **5**\nAlso \\boxed{6} and Answer: 7"
    assert stated_answers(text) == ["4", "5", "6", "7"]
    assert stated_answers("just 12") == ["just 12"]
    assert stated_answers("two\nlines") == []


# ----- DROP: spans, exact match and F1 ----------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "gold", "em", "f1"),
    [
        (["2"], ["2"], 1.0, 1.0),
        (["two"], ["2"], 0.0, 0.0),  # the gold's number must appear
        (["2 field goals"], ["2"], 0.0, 0.5),
        (["Ellis Dunn"], ["Dunn"], 0.0, 2 / 3),
        (["the textile mill", "the railway yard"], ["railway yard", "textile mill"], 1.0, 1.0),
        (["the textile mill"], ["textile mill", "railway yard"], 0.0, 0.5),
        (["May 1821"], ["May 1821"], 1.0, 1.0),
        (["1,000"], ["1000"], 1.0, 1.0),
        ([""], ["3"], 0.0, 0.0),
    ],
)
def test_drop_span_scores(predicted, gold, em, f1):
    assert scores(predicted, gold) == (em, pytest.approx(f1))


def test_drop_takes_the_best_gold_and_reads_numbers_dates_and_spans():
    row = {
        "answer": {"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": ["Dunn"]},
        "validated_answers": {
            "number": ["", "3"],
            "date": [{"day": "4", "month": "July", "year": ""}, {}],
            "spans": [[], []],
        },
    }
    golds = drop_golds(row)
    assert golds == [["Dunn"], ["4 July"], ["3"]]
    assert best_scores(["3"], golds) == (1.0, 1.0)
    assert best_scores(["July 4"], golds) == (0.0, 1.0)  # F1 is on bags of tokens, EM is not
    assert normalize_span("An Army of 3,000!") == "army of 3000"


# ----- OlympiadBench: several answers in one box ------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "correct"),
    [
        ("\\boxed{0, 4}", True),
        ("\\boxed{4,0}", True),  # any order
        ("\\boxed{4}", False),  # one missing
        ("\\boxed{0, 4, 5}", False),  # one too many
        ("\\boxed{0} and \\boxed{4}", False),  # two boxes that differ: answer spraying
    ],
)
def test_olympiadbench_multiple_answers(completion, correct):
    env = make(OlympiadBenchEval)
    row = {"id": 1, "question": "Solve x^2 = 4x.", "final_answer": ["$0$", "$4$"]}
    problem = env.problem({**row, "is_multiple_answer": True}, 0)
    assert problem.gold == ["0", "4"] and "several answers" in problem.prompt
    assert env.grade(problem, completion).correct is correct


def test_olympiadbench_single_answer_and_unit():
    env = make(OlympiadBenchEval)
    row = {"id": 2, "question": "How far?", "final_answer": ["$20$"], "unit": "m"}
    problem = env.problem({**row, "is_multiple_answer": False}, 0)
    assert problem.gold == "20" and problem.prompt.endswith(
        "Give the answer in m, without the unit."
    )
    assert env.grade(problem, "\\boxed{20}").correct and not env.grade(problem, "20").correct


# ----- the judges' verdicts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("votes", "grade"),
    [(["A"], "A"), (["A", "B", "A"], "A"), (["A", "B"], "B"), (["A", "C"], "C"), (["C", "B"], "B")],
)
def test_simpleqa_majority_grade_breaks_ties_toward_the_worse(votes, grade):
    assert majority_grade(votes) == grade


def test_simpleqa_grades_are_boxed_letters():
    assert boxed_choice("It matches the reference. \\boxed{A}", ("A", "B", "C")) == "A"
    assert boxed_choice("\\boxed{C}", ("A", "B", "C")) == "C"
    assert boxed_choice("CORRECT", ("A", "B", "C")) is None


@pytest.mark.parametrize(
    ("text", "model", "points"),
    [
        ("[[A>>B]]", "A", (1.0, 3)),
        ("[[A>B]]", "A", (1.0, 1)),
        ("[[A=B]]", "A", (0.5, 1)),
        ("[[B>A]]", "A", (0.0, 1)),
        ("[[B>>A]]", "B", (1.0, 3)),
        ("[[A<B]]", "B", (1.0, 1)),  # written the other way round
        ("[[a>b]]", "B", (0.0, 1)),
        ("first [[A>B]], then on reflection [[A=B]]", "A", (0.5, 1)),  # the last verdict
        ("A is better", "A", None),
        ("[[A>A]]", "A", None),
    ],
)
def test_arena_verdicts(text, model, points):
    assert arena_points(text, model) == points


def test_mt_bench_ratings_are_read_from_a_rating_line():
    assert parse_rubric("Good answer.\nRating: 8", ["rating"]) == {"rating": 8.0}
    assert parse_rubric("Rating: 11", ["rating"]) is None  # off the 1-10 scale
    assert parse_rubric("I give it [[8]]", ["rating"]) is None
    problem = make(MTBenchEval).load_problems()[1]
    assert problem.data["turns"][1].startswith("If it keeps that speed")
    assert problem.gold == ["80 km/h", "2.5 hours"] and problem.subsets == {"category": "math"}


def test_musr_choices_stored_as_python_text():
    assert listed("['a', 'b c']") == ["a", "b c"] and listed(["x"]) == ["x"]


def test_a_format_without_rules_says_so():
    with pytest.raises(NotImplementedError):
        Format().problem({}, "x")


def test_bbh_reads_rows_with_separate_options_too():
    env = make(BBHEval)
    row = {"input": "Which colour is the sky?", "choices": ["green", "blue"], "target_idx": 1}
    problem = env.problem(row, 0)  # lighteval/bbh's layout: the options apart, an index
    assert problem.gold == "(B)" and "Options:\n(A) green\n(B) blue" in problem.prompt
    assert env.grade(problem, "So the answer is (B).").correct
    plain = env.problem({"input": "not True is", "target": "False"}, 1)  # lukaemon/bbh's
    assert plain.gold == "False" and "Options" not in plain.prompt
