"""Offline text embeddings for semantic dedup: WordLlama's static token embeddings (``wordllama`` on PyPI,
weights ``l2_supercat_256.safetensors`` and tokenizer config inside the wheel; never downloads).

A text's embedding is the mean of its tokens' vectors, L2-normalized (WordLlama's ``avg_pool``), computed
here as a sparse bag-of-tokens matrix times the embedding matrix (``scipy.sparse``): memory grows with the
tokens of a batch, not with ``batch × longest text × dim`` as in ``WordLlamaInference.embed`` (which pads every
batch to its longest text: a 100K-token conversation in a batch of 64 would take 6.5 GB), and each row's
vector is computed from its own tokens alone, so it does not depend on which rows share its batch or worker.
"""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _model(dim: int):
    """WordLlama's tokenizer and ``[vocab, dim]`` float32 table, read from the wheel's files by path
    (``WordLlama.load(disable_download=True)`` looks for the tokenizer under ``tokenizer/``, the wheel ships it
    under ``tokenizers/``, and fails)."""
    from pathlib import Path

    import wordllama
    from safetensors import safe_open
    from tokenizers import Tokenizer

    root = Path(wordllama.__file__).parent
    weights = root / "weights" / f"l2_supercat_{dim}.safetensors"
    if not weights.exists():
        shipped = sorted(p.stem.rsplit("_", 1)[-1] for p in (root / "weights").glob("l2_supercat_*.safetensors"))
        raise ValueError(f"params semdedup.dim: the wordllama wheel has no {dim}-wide weights (it has {shipped})")
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    with safe_open(str(weights), framework="np") as f:
        table = np.ascontiguousarray(f.get_tensor("embedding.weight"), dtype=np.float32)
    return tokenizer, table


def embed_texts(texts: list[str], dim: int = 256, max_tokens: int = 2048) -> np.ndarray:
    """Unit-norm embeddings of ``texts``: float32 ``[len(texts), dim]``; a text without tokens gets the zero
    vector (cosine 0 with everything).

    ``dim``: a WordLlama width shipped in the wheel (256). ``max_tokens``: tokens of a text used (its first
    ones), which bounds the cost of a very long conversation.
    """
    from scipy.sparse import csr_matrix

    tokenizer, table = _model(dim)
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    ids = [enc.ids[:max_tokens] for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = np.clip(np.fromiter((t for i in ids for t in i), dtype=np.int64, count=int(indptr[-1])), 0, len(table) - 1)
    bag = csr_matrix((np.ones(len(cols), dtype=np.float32), cols, indptr), shape=(len(ids), len(table)))
    bag.sum_duplicates()
    pooled = np.asarray(bag @ table, dtype=np.float32)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return np.divide(pooled, norms, out=np.zeros_like(pooled), where=norms > 0)

