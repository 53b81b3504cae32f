"""`python tests/envs/addition_env.py serve|process|evaluate ...`: the Addition env as a program."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.envs.arith import Addition  # noqa: E402

if __name__ == "__main__":
    Addition.cli()
