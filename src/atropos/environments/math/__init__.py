"""`math`: competition math in four modes (normal, judge, self-correct, rlaif), checked by
math-verify; upstream's `MathEnv` (`environments/math_server.py`). Details: docs/math.md.

Modules: `env` (the environment and its config), `scoring` (the rules as plain functions),
`groups` (stored sequences and the groups replayed from them),
`prompts`, `data` (fixtures and hub sets), `demo` (an offline stand-in policy).
"""

from __future__ import annotations

from atropos.environments.math.demo import demo_responder
from atropos.environments.math.env import MODES, MathConfig, MathEnv

__all__ = ["MODES", "MathConfig", "MathEnv", "demo_responder"]
