"""Loading tokenizers: `transformers.AutoTokenizer`, quietly, with a name for the shipped one.

`"tiny"` names the small tokenizer that ships in `atropos.testing` (tests and demos run
offline with it); any other name goes to `AutoTokenizer.from_pretrained` (a local directory or
a hub id, as upstream did).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

TINY = "tiny"


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The tokenizer called `name` (cached per process)."""
    if name == TINY:
        from atropos.testing import tiny_tokenizer_path

        name = str(tiny_tokenizer_path())
    # transformers announces at import that PyTorch is missing; tokenizers need no torch
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"could not load tokenizer {name!r} ({type(err).__name__}: {err}); set"
            " --env.tokenizer_name to a local directory, a model id your machine can reach,"
            f" or {TINY!r} for the small tokenizer that ships with atropos"
        ) from None
