"""Evaluation environments with pass@k (run with `atropos env evaluate NAME`): the suites of
`catalog.SUITES` (`eval_gsm8k`, `eval_arc`, `eval_bbh`, `eval_mt_bench`, ...), each built from a
`suite.Suite` spec, plus `eval_mmlu` and `eval_ifeval`.

Each samples `--env.eval_n` completions per problem and logs `eval/pass@k` for every k of
`--env.eval_k`, `eval/accuracy` and per-subset accuracies to `metrics.json` and
`samples.jsonl`; see `base.EvalEnv` and docs/evals.md.
"""

from __future__ import annotations

from atropos.environments.evals.base import (
    EvalConfig,
    EvalEnv,
    EvaluationOnly,
    Graded,
    Problem,
    Sample,
    summarize,
)
from atropos.environments.evals.catalog import (
    ENVS,
    SUITES,
    AGIEvalEval,
    AIMEEval,
    ARCEval,
    ArenaHardEval,
    BBHEval,
    BoolQEval,
    DROPEval,
    GPQAEval,
    GSM8KEval,
    HellaSwagEval,
    Math500Eval,
    MMLUProEval,
    MTBenchEval,
    MuSREval,
    OlympiadBenchEval,
    OpenBookQAEval,
    PIQAEval,
    PubMedQAEval,
    SimpleQAEval,
    SIQAEval,
    WinoGrandeEval,
)
from atropos.environments.evals.ifeval import IFEvalEval
from atropos.environments.evals.mmlu import MMLUConfig, MMLUEval
from atropos.environments.evals.suite import Part, Suite, SuiteConfig, SuiteEval, suite_env

__all__ = [
    "ENVS",
    "SUITES",
    "AGIEvalEval",
    "AIMEEval",
    "ARCEval",
    "ArenaHardEval",
    "BBHEval",
    "BoolQEval",
    "DROPEval",
    "EvalConfig",
    "EvalEnv",
    "EvaluationOnly",
    "GPQAEval",
    "GSM8KEval",
    "Graded",
    "HellaSwagEval",
    "IFEvalEval",
    "MMLUConfig",
    "MMLUEval",
    "MMLUProEval",
    "MTBenchEval",
    "Math500Eval",
    "MuSREval",
    "OlympiadBenchEval",
    "OpenBookQAEval",
    "PIQAEval",
    "Part",
    "Problem",
    "PubMedQAEval",
    "SIQAEval",
    "Sample",
    "SimpleQAEval",
    "Suite",
    "SuiteConfig",
    "SuiteEval",
    "WinoGrandeEval",
    "summarize",
    "suite_env",
]
