"""Shared plumbing every layer may use (the bottom layer; it imports no other package of this repo):
atomic writes, rejects and step metrics (:mod:`.io`), the local / Ray executors (:mod:`.executor`,
:mod:`.ray_exec`), text normalization and hashing (:mod:`.text`), the response format (reasoning,
final answer, boxed answers: :mod:`.answers`) and the extension registry (:mod:`.plugins`)."""
