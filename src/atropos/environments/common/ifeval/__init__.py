"""IFEval-style instruction checks, written for atropos, and strict/loose accuracy over them.

- `registry`: the checks by name (RLVR-IFeval `func_name`s), `verify`, `validate`, `get`
  (unknown names fail with "did you mean").
- `checks_content`, `checks_format`: the 26 checks (25 of RLVR-IFeval plus `validate_start`).
- `language`: offline response-language rules (no `langdetect`).
- `scoring`: loose variants, per-prompt strict/loose outcomes, IFEval's four accuracies, and
  `from_ifeval` for Google IFEval rows, for an evaluation environment to reuse
  (`ifeval.scoring.follow`, ...).

>>> from atropos.environments.common import ifeval
>>> ifeval.verify("validate_lowercase", "all quiet here.")
True
>>> len(ifeval.names())
26
"""

from __future__ import annotations

from atropos.environments.common.ifeval import checks_content, checks_format, scoring
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
    # the modules: the checks, and accuracy over them
    "checks_content",
    "checks_format",
    "scoring",
]
