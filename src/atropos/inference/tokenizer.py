"""Loading tokenizers: `transformers.AutoTokenizer`, quietly, with a name for the shipped one.

`"tiny"` names the small tokenizer that ships in `atropos.tiny` (tests and demos run
offline with it); any other name goes to `AutoTokenizer.from_pretrained` (a local directory or
a hub id, as upstream did).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import weakref
from types import ModuleType
from typing import Any, ClassVar, cast

from atropos.inference.bytelevel import ByteTable
from atropos.inference.errors import FatalError
from atropos.inference.words import WordCodec

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
    module: ModuleType = transformers  # untyped (Any) in older releases
    return module


def quiet_progress_bars() -> ModuleType:
    """`import_transformers_quietly()`, with transformers' progress bars off in this process
    (`from_pretrained`'s "Loading weights" bar): our servers, trainer and demo say their own
    progress, and a bar in their output is noise."""
    transformers = import_transformers_quietly()
    disable: Any = transformers.utils.logging.disable_progress_bar  # untyped in some releases
    disable()
    return transformers


class TokenizerError(FatalError, ValueError):
    """A tokenizer that cannot be loaded: fatal to a run (every item needs it)."""


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The tokenizer called `name`, loaded once per process."""
    if name == TINY:
        from atropos.tiny import tokenizer_path

        name = tokenizer_path()
    transformers = import_transformers_quietly()
    try:
        return transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise TokenizerError(
            f"could not load tokenizer {name!r} ({type(err).__name__}: {err}); set"
            " --env.tokenizer_name to a local directory, a model id your machine can reach,"
            f" or {TINY!r} for the small tokenizer that ships with atropos"
        ) from None


class TokenCodec:
    """`encode(text)` (no special tokens added) and `decode(ids)` (special tokens skipped), as
    the tokenizer's own `encode(text, add_special_tokens=False)` and
    `decode(ids, skip_special_tokens=True)` return them, only cheaper where that is safe.

    For a transformers fast tokenizer these calls go through several layers of Python
    (argument normalization, truncation and padding setup, a batch of one, `to_py_obj`) around
    one call of its Rust `backend_tokenizer`: about 65 us for a 40-token prompt and 5 us per
    short decode, against 50 and 1.5 us direct. The direct calls are used only when they
    give the same answer: the tokenizer's class keeps transformers' own `encode`/`decode`
    code, the backend has no truncation or padding of its own, special tokens are not split,
    no clean-up of tokenization spaces is configured, and a probe text (with the special
    tokens) encodes and decodes the same both ways. Otherwise the tokenizer's methods are used.
    A byte-level tokenizer's ids are decoded by a table of each id's bytes where that gives the
    Rust decoder's text (`bytelevel.ByteTable`: 2-4x less CPU than the Rust call).

    Pieces: a tokenizer cuts its input at its added tokens (`<|im_start|>`, `<|im_end|>`, ...)
    before anything else, and tokenizes the text between them piece by piece. A rendered chat
    template repeats most of its pieces from call to call (the system prompt, the role
    headers, earlier turns of a conversation), so `encode` cuts the text the same way and
    keeps the ids of the last `PIECES` distinct pieces (least recently used out): only new
    text is tokenized. Used only where it is exact (added tokens matched on the raw text, with
    no stripping or word boundaries; no pre-tokenizer that looks at a piece's position in the
    whole text, such as `Metaspace` with `prepend_scheme: first`) and where probes, among them
    a rendered chat template, encode the same both ways. A new piece of ASCII text is encoded
    word by word from a cache of each word's ids where the tokenizer's pipeline allows it
    exactly (`words.WordCodec`: a regex split and byte-level BPE, as GPT-2, Qwen and Llama 3
    have), else by one Rust call.

    >>> from atropos.testing.fake_engine import load_tokenizer
    >>> tok = load_tokenizer()
    >>> codec = TokenCodec.of(tok)
    >>> text = "<|im_start|>user\\nhi<|im_end|>\\n"
    >>> codec.direct, codec.pieces, codec.encode(text) == tok.encode(text, add_special_tokens=False)
    (True, True, True)
    """

    PIECES = 256
    """Distinct pieces whose ids are kept (a few per conversation shape; new text churns)."""

    _cache: ClassVar[weakref.WeakKeyDictionary[Any, TokenCodec]] = weakref.WeakKeyDictionary()
    _last: ClassVar[TokenCodec | None] = None

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._backend: Any = None
        self._splitter: re.Pattern[str] | None = None
        self._added: dict[str, int] = {}
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._words: WordCodec | None = None
        self._bytes: ByteTable | None = None
        self._bytes_made = False
        self.direct = False
        backend = _backend_of(tokenizer)
        if backend is not None and _agrees(tokenizer, backend):
            self._backend = backend
            self.direct = True
            self._use_pieces(tokenizer, backend)

    @property
    def pieces(self) -> bool:
        """Whether `encode` reuses the ids of pieces it has seen."""
        return self._splitter is not None

    @classmethod
    def of(cls, tokenizer: Any) -> TokenCodec:
        """The codec of `tokenizer` (made once per tokenizer object; the last one asked for is
        found without the weak map's lookup: a session asks once per rollout)."""
        last = cls._last
        if last is not None and last.tokenizer is tokenizer:
            return last
        try:
            found = cls._cache.get(tokenizer)
        except TypeError:  # not weak-referenceable: no caching
            return cls(tokenizer)
        if found is None:
            found = cls._cache[tokenizer] = cls(tokenizer)
        cls._last = found  # keeps the tokenizer alive no longer than its entry above does
        return found

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        if self._splitter is not None:
            return self._encode_pieces(text)
        if self._backend is not None:
            ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
            return ids
        from atropos.inference.tokenize import as_token_ids

        return as_token_ids(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, special tokens skipped (unless `skip_special_tokens` is False)."""
        if self._backend is not None:
            if skip_special_tokens and (table := self._byte_table()) is not None:
                text = table.decode(ids)
                if text is not None:
                    return text
            return str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def decode_all(self, rows: list[list[int]]) -> list[str]:
        """`decode` of each row (special tokens skipped), without a layer per row. One call
        per row: the backend's `decode_batch` gives the same texts but runs them on its thread
        pool, several times the CPU for a group's few short rows."""
        if self._backend is not None:
            table = self._byte_table()
            if table is not None:
                texts = [table.decode(row) for row in rows]
                if None not in texts:
                    return cast("list[str]", texts)
            decode = self._backend.decode
            return [decode(row, skip_special_tokens=True) for row in rows]
        return [self.decode(row) for row in rows]

    def _byte_table(self) -> ByteTable | None:
        """The byte-level table of the backend (`bytelevel.py`), made at the first decode."""
        if not self._bytes_made:
            self._bytes, self._bytes_made = ByteTable.of(self._backend), True
        return self._bytes

    # --- pieces -----------------------------------------------------------------------------

    def _encode_pieces(self, text: str) -> list[int]:
        assert self._splitter is not None
        ids: list[int] = []
        added, at = self._added, 0
        for match in self._splitter.finditer(text):
            if match.start() > at:
                ids += self._piece(text[at : match.start()])
            ids.append(added[match.group()])
            at = match.end()
        if at < len(text):
            ids += self._piece(text[at:])
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        cache = self._pieces
        found = cache.pop(piece, None)  # popped and put back: the most recently used is last
        if found is None:
            words = self._words
            ids = words.encode(piece) if words is not None else None
            if ids is None:
                ids = self._backend.encode(piece, add_special_tokens=False).ids
            found = tuple(ids)
            if len(cache) >= self.PIECES:
                with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                    del cache[next(iter(cache))]  # (another thread may be here too)
        cache[piece] = found
        return found

    def _use_pieces(self, tokenizer: Any, backend: Any) -> None:
        """Turn piece reuse on when it is exact for this tokenizer (see the class docstring)."""
        try:
            added = backend.get_added_tokens_decoder()
            config = json.loads(backend.to_str())
        except Exception:  # an older tokenizers: no piece reuse
            return
        if not added or not _position_free(config.get("pre_tokenizer")):
            return
        has_normalizer = config.get("normalizer") is not None
        for token in added.values():
            if token.lstrip or token.rstrip or token.single_word:
                return
            if token.normalized and has_normalizer:
                return  # matched after normalization: the raw text does not show where
        self._added = {str(t.content): int(i) for i, t in added.items()}
        contents = sorted(self._added, key=len, reverse=True)  # leftmost, then longest
        self._splitter = re.compile("|".join(re.escape(c) for c in contents))
        probes = [_PROBE + "".join(contents), "".join(contents[:3]) + _PROBE, _PROBE.strip()]
        with contextlib.suppress(Exception):  # a template that cannot render the sample
            chat = tokenizer.apply_chat_template(_SAMPLE_CHAT, tokenize=False)
            probes.append(str(chat))
        for probe in probes:
            expected = backend.encode(probe, add_special_tokens=False).ids
            if self._encode_pieces(probe) != expected:
                self._splitter = None
                break
        self._pieces.clear()
        if self._splitter is not None:
            self._words = WordCodec.of(backend, config)


_PROBE = " Hello world! 12 + 7 = 19.\n  ok?\tDone é "
_SAMPLE_CHAT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": " It is 4."},
]

_POSITION_FREE_PRE_TOKENIZERS = frozenset(
    {
        "BertPreTokenizer",
        "ByteLevel",
        "CharDelimiterSplit",
        "Digits",
        "Punctuation",
        "Split",
        "UnicodeScripts",
        "Whitespace",
        "WhitespaceSplit",
    }
)


def _position_free(pre_tokenizer: Any) -> bool:
    """Whether this pre-tokenizer treats a piece the same wherever it stands in the text."""
    if pre_tokenizer is None:
        return True
    if not isinstance(pre_tokenizer, dict):
        return False
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_position_free(p) for p in pre_tokenizer.get("pretokenizers") or [])
    if kind == "Metaspace":  # "first" prepends to the text's first piece only
        return pre_tokenizer.get("prepend_scheme") in ("always", "never")
    return kind in _POSITION_FREE_PRE_TOKENIZERS


_TRANSFORMERS_TOKENIZER_MODULES = frozenset(
    {
        "transformers.tokenization_utils_base",
        "transformers.tokenization_utils_fast",
        "transformers.tokenization_utils_tokenizers",
    }
)


def _backend_of(tokenizer: Any) -> Any:
    """The tokenizer's Rust `tokenizers.Tokenizer`, when calling it directly is equivalent."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a dependency
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        return None
    cls = type(tokenizer)
    for name in ("encode", "decode", "_decode", "_encode_plus"):
        method = getattr(cls, name, None)
        if method is not None and method.__module__ not in _TRANSFORMERS_TOKENIZER_MODULES:
            return None  # the class changes what encode/decode do
    if getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    if getattr(tokenizer, "split_special_tokens", False):
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    if getattr(backend, "encode_special_tokens", False):
        return None
    return backend


def _agrees(tokenizer: Any, backend: Any) -> bool:
    """Both ways give the same ids and text on a probe with every special token."""
    specials = [str(t) for t in getattr(tokenizer, "all_special_tokens", None) or []]
    probe = "Hello world! 12 + 7 = 19.\n  ok?" + "".join(specials) + " Done\tend é"
    try:
        from atropos.inference.tokenize import as_token_ids

        ids = as_token_ids(tokenizer.encode(probe, add_special_tokens=False))
        if backend.encode(probe, add_special_tokens=False).ids != ids:
            return False
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return bool(backend.decode(ids, skip_special_tokens=True) == text)
    except Exception:  # any surprise: use the tokenizer's own methods
        return False
