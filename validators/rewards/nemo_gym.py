"""NeMo-Gym: the verifier registry as a resources server's ``verify``.

A NeMo-Gym rollout ends in ``POST /verify`` with a body holding the dataset row's fields (the RL
release's rows are NeMo-Gym rows: ``responses_create_params``, ``agent_ref``, ``ground_truth``...; so
are NVIDIA's, whose NeMo-Gym agents :mod:`corpora.nemo_gym` maps to verifiers here)
and ``response``, the OpenAI Responses API object the agent produced. :func:`verify` grades it::

    class CascadeServer(SimpleResourcesServer):
        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**verify(body))
"""

from __future__ import annotations

from typing import Any

from corpora.nemo_gym import verify_row
from validators.rewards import TIMEOUT_S, WORKERS, grade, graded_text, text_of, tool_call_block


def response_text(response: dict[str, Any]) -> str:
    """The response a verifier grades, from a Responses API ``response``: its ``output`` items in order
    as a trajectory (:func:`validators.rewards.graded_text`): ``reasoning`` (its ``content`` texts,
    else its ``summary``), assistant ``message`` texts and ``function_call`` items (as ``<tool_call>``
    blocks) are the policy's; a tool output (``function_call_output``) ends a turn and is never graded,
    and a reasoning item after a turn's text starts the next turn. A response cut off while reasoning
    (``status`` ``incomplete``, last item reasoning) ends on reasoning alone: no final answer.

    Raises:
        ValueError: ``response`` has no ``output`` list, or an item of another shape.
    """
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        raise ValueError("verify body: response.output must be the Responses API output list")
    turns: list[list[Any]] = [[None, ""]]
    for k, item in enumerate(output):
        where = f"response.output[{k}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} is a {type(item).__name__}, not an output item")
        kind, turn = item.get("type"), turns[-1]
        if kind == "function_call_output":
            turns.append([None, ""])
        elif kind == "reasoning":
            if turn[1]:
                turns.append(turn := [None, ""])
            turn[0] = (turn[0] or "") + (text_of(item.get("content"), where) or text_of(item.get("summary"), where))
            # a reasoning item with no text is still reasoning: a turn ending on it has no final answer
        elif kind == "message" and item.get("role", "assistant") == "assistant":
            turn[1] += text_of(item.get("content"), where)
        elif kind == "function_call":
            turn[1] += tool_call_block(item.get("name"), item.get("arguments"))
    return graded_text([(r, t) for r, t in turns if r is not None or t])


def verify(body: Any, timeout_s: float = TIMEOUT_S, workers: int = WORKERS) -> dict[str, Any]:
    """Grade a NeMo-Gym verify request with the row's verifier (``agent_ref``).

    Args:
        body: the request as a dict or a pydantic model (``model_dump()``): the row's fields plus
            ``response``. The row is one of this package's release or one in NeMo-Gym's own layout
            (NVIDIA's rows: ``agent_ref`` a NeMo-Gym agent, translated by
            :func:`corpora.nemo_gym.verify_row`). JSON fields (``ground_truth``, ``kwargs``,
            ``metadata``, ``tools``) may be strings, as in the release, or already decoded.

    Returns:
        ``body`` plus ``reward`` (in [0, 1]), ``passed``, ``reason`` and ``grader_error`` (the
        grader's failure, reward 0, or ``None``): NeMo-Gym's verify response.

    Raises:
        ValueError: no ``response``, or the row's verifier does not grade single responses
            (``genrm``), or names no installed verifier or NeMo-Gym agent, or has nothing
            to verify against.
    """
    body = body.model_dump() if hasattr(body, "model_dump") else body
    if not isinstance(body, dict):
        raise TypeError(f"verify body is a {type(body).__name__}: expected a dict or a pydantic model")
    if "response" not in body:
        raise ValueError("verify body has no response")
    row = verify_row({k: v for k, v in body.items() if k != "response"})
    verdict = grade([response_text(body["response"])], [row], workers, timeout_s)[0]
    if verdict is None:
        raise ValueError(f"row {row.get('uuid')!r}: agent_ref {row.get('agent_ref')!r} grades groups or episodes, "
                         "not one response")
    return {**body, "reward": 0.0 if verdict.error else float(verdict.reward), "passed": verdict.passed,
            "reason": verdict.reason, "grader_error": verdict.error}
