"""One Latin reading of text for checks a policy could dodge with look-alike characters.

:func:`latin_fold`: NFKC (fullwidth ``ｒａｔｅ`` and ``，``, ligatures, superscripts become plain),
format characters removed (Unicode category Cf: zero-width spaces and joiners, bidi marks, soft
hyphens), accents and other combining marks dropped, casefolded, and the Cyrillic, Greek and Latin
letters that look like other Latin letters mapped to them (:data:`CONFUSABLES`, the letters of
Unicode's confusables list that a font renders alike). Used where a word must not appear (IF
``forbidden_words``, the GenRM screen): ``fоrbidden`` with a Cyrillic ``о`` is ``forbidden``.
"""

from __future__ import annotations

import re
import unicodedata

CONFUSABLES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d", "ԛ": "q", "ԝ": "w",
    "ɡ": "g", "һ": "h", "ӏ": "l", "ո": "n", "ս": "u", "ց": "g",
    # Greek
    "α": "a", "β": "b", "γ": "y", "δ": "d", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ς": "s", "σ": "o", "μ": "u", "ϲ": "c", "ϳ": "j",
    # Latin look-alikes NFKC keeps
    "ı": "i", "ȷ": "j", "ł": "l", "ø": "o", "đ": "d", "ß": "ss", "ſ": "s", "ɑ": "a", "ɩ": "i", "ʀ": "r",
})
COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")


def plain_fold(text: str) -> str:
    """``text`` NFKC-normalized, without format characters (Cf) and combining marks, casefolded."""
    text = "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")
    return COMBINING.sub("", unicodedata.normalize("NFKC", text)).casefold()


def latin_fold(text: str) -> str:
    """:func:`plain_fold`, then accents dropped and look-alike letters read as Latin (see the module doc)."""
    return unicodedata.normalize("NFC", COMBINING.sub("", unicodedata.normalize("NFD", plain_fold(text)))).translate(
        CONFUSABLES)
