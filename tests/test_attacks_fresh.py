"""Every attack of ``benchmarks/attacks_fresh.py`` must earn reward 0 with a verdict (no exception,
no hang, no dropped sample); every ``MUST_PAY`` answer must earn 1. Samples are graded in a worker
process under a wall clock (``benchmarks.attacks_fresh.Runner``), so a grader that hangs fails its
test instead of hanging the suite. The state before the fixes: `python -m benchmarks.attacks --table` with
``ATTACKS_TARGET`` an older checkout."""

from __future__ import annotations

import pytest

from benchmarks.attacks_fresh import ATTACKS, MUST_PAY, Runner, outcome

TIMEOUT_S = {"code": 30.0}  # others: DEFAULT_TIMEOUT_S
DEFAULT_TIMEOUT_S = 10.0

# real rows whose tests a constant passes: cascade build refuses them (CodeVerifier.check_trainable)
REFUSED_ROWS = {"code_mbpp_constant_2", "code_mbpp_constant_2_divisor", "code_mbpp_hardcoded_output"}


def _params(samples: dict) -> list:
    return [pytest.param(family, name, response, row, id=f"{family}-{name}")
            for family, items in samples.items() for name, response, row in items]


@pytest.fixture(scope="module")
def runner():
    r = Runner()
    yield r
    r.close()


def test_counts():
    assert sum(len(a) for a in ATTACKS.values()) >= 48
    assert all(len(ATTACKS[f]) >= 5 for f in ("math", "mcqa", "instruction_following", "structured_output",
                                             "tool_call", "long_context", "code", "genrm"))
    names = [n for a in ATTACKS.values() for n, _, _ in a] + [n for a in MUST_PAY.values() for n, _, _ in a]
    assert len(names) == len(set(names))
    assert REFUSED_ROWS <= set(names)


@pytest.mark.parametrize(("family", "name", "response", "row"), _params(ATTACKS))
def test_attack_earns_nothing(runner, family, name, response, row):
    res = runner.run(response, row, TIMEOUT_S.get(family, DEFAULT_TIMEOUT_S))
    assert outcome(res) == ("refused" if name in REFUSED_ROWS else "ok"), res
    assert res["reward"] == 0.0


@pytest.mark.parametrize(("family", "name", "response", "row"), _params(MUST_PAY))
def test_correct_answer_pays(runner, family, name, response, row):
    res = runner.run(response, row, TIMEOUT_S.get(family, DEFAULT_TIMEOUT_S))
    assert res["status"] == "ok" and res["error"] is None, res
    assert res["reward"] == 1.0, res
