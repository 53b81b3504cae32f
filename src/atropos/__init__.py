"""Atropos: reinforcement learning of language models through environments that run as services.

Importing this package has no side effects and pulls in nothing heavy; subpackages load on use.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
