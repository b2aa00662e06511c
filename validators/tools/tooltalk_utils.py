"""Stand-in for ``tooltalk/apis/utils.py`` inside the tool sandbox (standard library only).

ToolTalk's own module imports torch and transformers and compares free text (an email body, an
event name) by the cosine of DistilBERT embeddings downloaded from the Hub at first use. Neither is
available offline, and an embedding cosine (like a bag of words) barely moves for a negation or reordered
words. :func:`semantic_str_compare` here is stricter: the two texts' words (lower-cased, contractions
expanded) must carry the same negations, and their similarity is difflib's order-aware ratio of the word
sequences, in [0, 1], at ToolTalk's own thresholds (0.8 / 0.9). The two format checks are ToolTalk's patterns.
"""

import difflib
import re

WORD = re.compile(r"[a-z0-9]+")
CONTRACTIONS = (("cannot", "can not"), (r"can't", "can not"), (r"won't", "will not"), (r"n't", " not"), (r"'ll", " will"),
                (r"'ve", " have"), (r"'re", " are"), (r"'m", " am"), (r"'d", " would"))
NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor"})


def verify_phone_format(phone_number):
    return re.match(r"^\d{3}-\d{3}-\d{4}$", phone_number) is not None


def verify_email_format(email):
    return re.match(r"^[\w\-\d\.]+@[\w\-\d\.]+$", email) is not None


def words(text):
    text = str(text).lower().replace("\u2019", "'")
    for short, long in CONTRACTIONS:
        text = text.replace(short, long)
    return WORD.findall(text)


def semantic_str_compare(prediction_text, ground_truth_text):
    """Similarity in [0, 1] (module doc): 0 for a missing text or different negations, else the ratio of
    matching words in order (``difflib.SequenceMatcher`` over the word sequences)."""
    if prediction_text is None or ground_truth_text is None:
        return 0.0
    a, b = words(prediction_text), words(ground_truth_text)
    if {w for w in a if w in NEGATIONS} != {w for w in b if w in NEGATIONS}:
        return 0.0
    if not a or not b:
        return float(a == b)
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
