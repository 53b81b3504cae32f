"""Loading tokenizers: `transformers.AutoTokenizer`, quietly, with a name for the shipped one.

`"tiny"` names the small tokenizer that ships in `atropos.testing` (tests and demos run
offline with it); any other name goes to `AutoTokenizer.from_pretrained` (a local directory or
a hub id, as upstream did).
"""

from __future__ import annotations

import functools
import logging
import sys
from types import ModuleType
from typing import Any

TINY = "tiny"


class _DropTorchAdvice(logging.Filter):
    # transformers 5: "PyTorch was not found. Models won't be available ..."; 4.x: "None of
    # PyTorch, TensorFlow >= 2.0, or Flax have been found. Models won't be available ..."
    def filter(self, record: logging.LogRecord) -> bool:
        return "Models won't be available" not in record.getMessage()


def import_transformers_quietly() -> ModuleType:
    """Import transformers without its "PyTorch was not found" advice on stderr.

    Tokenizers need no torch. Only that one record is dropped, and only during the import: the
    logger is left as found.
    """
    if "transformers" in sys.modules:
        return sys.modules["transformers"]
    logger = logging.getLogger("transformers")
    quiet = _DropTorchAdvice()
    logger.addFilter(quiet)
    try:
        import transformers
    finally:
        logger.removeFilter(quiet)
    return transformers


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The tokenizer called `name`, loaded once per process."""
    if name == TINY:
        from atropos.testing import tiny_tokenizer_path

        name = str(tiny_tokenizer_path())
    transformers = import_transformers_quietly()
    try:
        return transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"could not load tokenizer {name!r} ({type(err).__name__}: {err}); set"
            " --env.tokenizer_name to a local directory, a model id your machine can reach,"
            f" or {TINY!r} for the small tokenizer that ships with atropos"
        ) from None
