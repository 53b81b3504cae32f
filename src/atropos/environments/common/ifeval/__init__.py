"""IFEval-style instruction checks, written for atropos, and strict/loose accuracy over them.

- `registry`: the checks by name (RLVR-IFeval `func_name`s), `verify`, `validate`, `get`
  (unknown names fail with "did you mean").
- `checks_content`, `checks_format`: the 26 checks (25 of RLVR-IFeval plus `validate_start`).
- `language`: offline response-language rules (no `langdetect`).
- `scoring`: loose variants, per-prompt strict/loose outcomes, IFEval's four accuracies, and
  `from_ifeval` for Google IFEval rows, for an evaluation environment to reuse.

>>> from atropos.environments.common import ifeval
>>> ifeval.verify("validate_lowercase", "all quiet here.")
True
>>> len(ifeval.names())
26
"""

from __future__ import annotations

from atropos.environments.common.ifeval import checks_content, checks_format
from atropos.environments.common.ifeval.registry import (
    CHECKS,
    Check,
    UnknownCheck,
    accepted_args,
    compare,
    get,
    names,
    validate,
    verify,
)
from atropos.environments.common.ifeval.scoring import (
    IFEVAL_INSTRUCTIONS,
    Instruction,
    PromptResult,
    accuracy,
    follow,
    from_ifeval,
    loose_variants,
)

__all__ = [
    # the registry
    "CHECKS",
    "Check",
    "UnknownCheck",
    "accepted_args",
    "compare",
    "get",
    "names",
    "validate",
    "verify",
    # accuracy
    "IFEVAL_INSTRUCTIONS",
    "Instruction",
    "PromptResult",
    "accuracy",
    "follow",
    "from_ifeval",
    "loose_variants",
    # the checks, by module
    "checks_content",
    "checks_format",
]
