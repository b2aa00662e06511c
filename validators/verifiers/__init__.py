r"""Response verifiers shared by rewards (stage runners) and difficulty filtering.

Verifiers are entry points of group ``cascade_rl.verifiers`` keyed by the RL row's ``agent_ref``
(:mod:`.registry`, :mod:`common.plugins`), loaded on first use; one module per domain:
``math`` and ``reasoning_gym`` (:mod:`.math`), ``code`` (:mod:`.code`, run in :mod:`.sandbox`),
``mcqa`` (:mod:`.mcqa`), ``instruction_following`` (:mod:`.ifeval` + :mod:`.ifbench` + :mod:`.iftrain`),
``tool_call`` (:mod:`.tool_call`), ``structured_output`` (:mod:`.structured_output`),
``long_context`` (:mod:`.long_context`) and ``genrm`` (:mod:`.genrm`, pairwise judge parsing).
:func:`verify_batch` (:mod:`.batch`) grades many samples in worker processes under a wall clock
(:class:`VerifierPool` keeps those workers between calls);
:func:`pass_at_k` (:mod:`.passk`) is the unbiased estimator.

>>> from validators.verifiers import verify
>>> import json
>>> row = {"agent_ref": "math", "ground_truth": json.dumps({"answer": r"\frac{3}{4}"})}
>>> verify(r"<think>3 over 4</think>The answer is $\boxed{0.75}$.", row).reward
1.0
"""

from common.answers import final_answer
from validators.verifiers.batch import VerifierPool, verify_batch
from validators.verifiers.passk import pass_at_k
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    check_row,
    get_verifier,
    verify,
)

__all__ = ["Verdict", "Verifier", "VerifierPool", "check_row", "final_answer", "get_verifier", "pass_at_k", "verify",
           "verify_batch"]
