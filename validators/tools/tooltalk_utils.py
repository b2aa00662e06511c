"""Stand-in for ``tooltalk/apis/utils.py`` inside the tool sandbox (standard library only).

ToolTalk's own module imports torch and transformers and compares free text (an email body, an
event name) by the cosine of DistilBERT embeddings downloaded from the Hub at first use. Neither is
available offline, so :func:`semantic_str_compare` here is the cosine of word-count vectors
(lower-cased alphanumeric words): a lexical stand-in, stricter on paraphrases, at ToolTalk's own
thresholds (0.8 / 0.9). The two format checks are ToolTalk's patterns.
"""

import math
import re
from collections import Counter

WORD = re.compile(r"[a-z0-9]+")


def verify_phone_format(phone_number):
    return re.match(r"^\d{3}-\d{3}-\d{4}$", phone_number) is not None


def verify_email_format(email):
    return re.match(r"^[\w\-\d\.]+@[\w\-\d\.]+$", email) is not None


def semantic_str_compare(prediction_text, ground_truth_text):
    """Cosine similarity in [0, 1] of the two texts' word counts (0 for a missing prediction)."""
    if prediction_text is None or ground_truth_text is None:
        return 0.0
    a, b = Counter(WORD.findall(str(prediction_text).lower())), Counter(WORD.findall(str(ground_truth_text).lower()))
    if not a or not b:
        return float(a == b)
    dot = sum(a[w] * b[w] for w in a)
    return dot / (math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values())))
