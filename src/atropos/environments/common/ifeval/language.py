"""Offline response-language checks: by writing system, and by function words for Latin script.

IFEval and upstream use `langdetect`, a statistical model. This is a smaller, explainable
stand-in that needs no download, and it is only as good as its rules:

- **Script languages** pass when at least half of the letters are in the language's script:
  Greek, Hebrew, Thai, Georgian, Armenian, Korean (Hangul), Japanese (kana required), Chinese
  (Han, no kana), Hindi (Devanagari), Bengali, Tamil, Telugu, Gujarati, Kannada, Malayalam,
  Punjabi (Gurmukhi). Within a shared script a few letters decide: Russian is Cyrillic without
  Ukrainian letters (і ї є ґ), Ukrainian has them; Persian has پ چ ژ گ and Urdu ٹ ڈ ڑ ں ے,
  which Arabic has neither of.
- **Latin-script languages** (en, fr, de, es, it, pt, nl, sw) pass when the text is mostly
  Latin letters and has more of the language's common function words than of any other's.
- Other codes (bg, mr, ne, tr, pl, vi, ...) are **not supported**: `detects` raises
  ValueError, so an item asking for one is reported and dropped rather than scored wrongly.

>>> detects("Le chat est sur la table et il dort.", "fr")
True
>>> detects("The cat is on the table and it is asleep.", "fr")
False
>>> detects("Кошка спит на столе.", "ru"), detects("Η γάτα κοιμάται.", "el")
(True, True)
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["SUPPORTED", "detects"]

# language code -> the Unicode script name prefix its letters carry (unicodedata.name)
_SCRIPT = {
    "el": "GREEK",
    "he": "HEBREW",
    "th": "THAI",
    "ka": "GEORGIAN",
    "hy": "ARMENIAN",
    "ko": "HANGUL",
    "hi": "DEVANAGARI",
    "bn": "BENGALI",
    "ta": "TAMIL",
    "te": "TELUGU",
    "gu": "GUJARATI",
    "kn": "KANNADA",
    "ml": "MALAYALAM",
    "pa": "GURMUKHI",
    "ru": "CYRILLIC",
    "uk": "CYRILLIC",
    "ar": "ARABIC",
    "fa": "ARABIC",
    "ur": "ARABIC",
}
# letters that mark one language within a shared script: (required for, forbidden for)
_MARKS = {
    "uk": set("іїєґІЇЄҐ"),
    "fa": set("پچژگ"),
    "ur": set("ٹڈڑںےۓ"),
}
_EXCLUDES = {"ru": ("uk",), "ar": ("fa", "ur"), "fa": ("ur",)}

# distinctive function words (words shared between these languages are left out on purpose)
_WORDS = {
    "en": "the and is are was were of to that it with for this you have not be they what which"
    " would there their will",
    "fr": "le les est et une des du pas dans pour sur avec nous vous ils elle sont ce cette au"
    " aux je été être très",
    "de": "der die das und ist nicht ein eine ich mit auf für den dem zu auch sind wir von wie"
    " oder sie werden haben",
    "es": "el los las y muy más está también sus su hay cuando esto ella pero fue donde están"
    " nosotros usted",
    "it": "gli della delle di che sono per anche questo questa più nel alla degli molto hanno"
    " essere è",
    "pt": "não é os do da dos das em um uma você são isso muito também ele ela seu sua pelo"
    " pela ao aos",
    "nl": "het een en van niet dat zijn op voor ook maar wij hij ze naar wordt deze bij",
    "sw": "na ya wa ni kwa za katika hii kuwa hiyo lakini sana yake wao mimi wewe yeye hapa"
    " kama pia",
}
_FUNCTION_WORDS = {code: frozenset(words.split()) for code, words in _WORDS.items()}
SUPPORTED = frozenset({*_SCRIPT, "ja", "zh", *_FUNCTION_WORDS})


def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    if name.startswith("CJK") or name.startswith("KANGXI"):
        return "HAN"
    if name.startswith("HIRAGANA") or name.startswith("KATAKANA"):
        return "KANA"
    return name.split(" ", 1)[0]


def detects(text: str, language: str) -> bool:
    """Whether `text` reads as `language` (an ISO 639-1 code such as "en" or "ja").

    Raises:
        ValueError: `language` is not one these rules can check (see the module docstring).
    """
    code = str(language).strip().lower()
    if code not in SUPPORTED:
        raise ValueError(
            f"response language {language!r} cannot be checked offline"
            f" (supported: {', '.join(sorted(SUPPORTED))})"
        )
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return False
    scripts = [_script(ch) for ch in letters]
    share = {s: scripts.count(s) / len(scripts) for s in set(scripts)}
    if code == "ja":
        return share.get("KANA", 0) > 0 and share.get("KANA", 0) + share.get("HAN", 0) >= 0.5
    if code == "zh":
        return share.get("HAN", 0) >= 0.5 and "KANA" not in share
    if code in _SCRIPT:
        if share.get(_SCRIPT[code], 0) < 0.5:
            return False
        if code in _MARKS and not _MARKS[code] & set(letters):
            return False
        return not any(_MARKS[other] & set(letters) for other in _EXCLUDES.get(code, ()))
    if share.get("LATIN", 0) < 0.8:
        return False
    words = re.findall(r"[^\W\d_]+", text.lower())
    hits = {c: sum(w in vocab for w in words) for c, vocab in _FUNCTION_WORDS.items()}
    best = max(hits.values())
    return best > 0 and hits[code] == best and list(hits.values()).count(best) == 1
