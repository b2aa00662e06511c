"""NeMo-Gym: the verifier registry as a resources server's ``verify``.

A NeMo-Gym rollout ends in ``POST /verify`` with a body holding the dataset row's fields (the RL
release's rows are NeMo-Gym rows: ``responses_create_params``, ``agent_ref``, ``ground_truth``...)
and ``response``, the OpenAI Responses API object the agent produced. :func:`verify` grades it::

    class CascadeServer(SimpleResourcesServer):
        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**verify(body))
"""

from __future__ import annotations

from typing import Any

from validators.rewards import TIMEOUT_S, WORKERS, grade, think_block, tool_call_block


def _texts(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    return "".join(p.get("text") or "" for p in parts or [] if isinstance(p, dict))


def response_text(response: dict[str, Any]) -> str:
    """The response a verifier grades, from a Responses API ``response``: its ``output`` items in order,
    ``reasoning`` as ``<think>...</think>`` (its ``content`` texts, else its ``summary``), assistant
    ``message`` texts, ``function_call`` items as ``<tool_call>`` blocks. Tool outputs
    (``function_call_output``) and other items are the environment's, never graded.

    Raises:
        ValueError: ``response`` has no ``output`` list.
    """
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        raise ValueError("verify body: response.output must be the Responses API output list")
    text = []
    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            text.append(think_block(_texts(item.get("content")) or _texts(item.get("summary"))))
        elif kind == "message" and item.get("role", "assistant") == "assistant":
            text.append(_texts(item.get("content")))
        elif kind == "function_call":
            text.append(tool_call_block(item.get("name"), item.get("arguments")))
    return "".join(text)


def verify(body: Any, timeout_s: float = TIMEOUT_S, workers: int = WORKERS) -> dict[str, Any]:
    """Grade a NeMo-Gym verify request with the row's verifier (``agent_ref``).

    Args:
        body: the request as a dict or a pydantic model (``model_dump()``): the row's fields plus
            ``response``. JSON fields (``ground_truth``, ``kwargs``, ``metadata``, ``tools``) may be
            strings, as in the release, or already decoded.

    Returns:
        ``body`` plus ``reward`` (in [0, 1]), ``passed``, ``reason`` and ``grader_error`` (the
        grader's failure, reward 0, or ``None``): NeMo-Gym's verify response.

    Raises:
        ValueError: no ``response``, or the row's verifier does not grade single responses
            (``genrm``, ``swe``), or names no installed verifier.
    """
    body = body.model_dump() if hasattr(body, "model_dump") else dict(body)
    if "response" not in body:
        raise ValueError("verify body has no response")
    row = {k: v for k, v in body.items() if k != "response"}
    verdict = grade([response_text(body["response"])], [row], workers, timeout_s)[0]
    if verdict is None:
        raise ValueError(f"row {row.get('uuid')!r}: agent_ref {row.get('agent_ref')!r} grades groups or episodes, "
                         "not one response")
    return {**body, "reward": 0.0 if verdict.error else float(verdict.reward), "passed": verdict.passed,
            "reason": verdict.reason, "grader_error": verdict.error}
