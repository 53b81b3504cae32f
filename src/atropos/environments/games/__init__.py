"""Gymnasium games played as multi-turn chats: `blackjack`, `blackjack_thinking`, `taxi`.

Each episode is one conversation (rules as the system turn, each observation as a user turn,
each move as an assistant turn), generated token-exactly through `ManagedServer` (see
`episodes.py` and `docs/games.md`). gymnasium is the `games` extra; it is imported when an env
is set up, not here.
"""

from __future__ import annotations

from types import ModuleType

from atropos.install import install_hint

__all__ = ["require_gymnasium"]


def require_gymnasium() -> ModuleType:
    """The `gymnasium` module, or an ImportError that names the extra to install."""
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(f"the game environments need gymnasium: {install_hint('games')}") from err
    return gymnasium
