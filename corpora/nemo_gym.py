"""NeMo-Gym's agents in this package: the table that maps an upstream ``agent_ref`` to a verifier.

NeMo-Gym routes a row to the environment its ``agent_ref`` names (``{"type": "responses_api_agents",
"name": "mcqa_simple_agent"}``), and each environment reads the ground truth from fields of its own
(``expected_answer`` + ``options`` + ``template_metadata.output_regex`` for MCQA, a list of
``{name, arguments}`` for the workplace assistant, ``schema_str`` for structured outputs...). NVIDIA's
``nvidia/Nemotron-Cascade-2-RL-data`` rows are such rows. :data:`AGENTS` names them here: each
:class:`NemoGymAgent` gives the verifier of this package that grades the agent's rows, the RL domain,
and a ``translate`` function from the upstream row to the ``ground_truth`` (and ``metadata`` keys)
that verifier reads. The table is the entry-point group ``cascade_rl.nemo_gym_agents`` (a plugin adds
an agent with one line: ``my_agent = "my_pkg.gym:MY_AGENT"``, a :class:`NemoGymAgent`).

:func:`canonical_fields` is the one translation, used by ingest (``corpora.adapters.hf.nemo_gym_rl``)
and by the NeMo-Gym verify wrapper (``validators.rewards.nemo_gym``), which receives rows in the
upstream layout. An unknown agent name or a row with nothing to verify against is a
:class:`~corpora.schema.RecordError` naming it: never a row that passes through ungraded.

Agent names are those of NeMo-Gym's configs (``resources_servers/*/configs``, ``responses_api_agents``);
the release's SWE-RL agent name is not documented: the SWE names below are NeMo-Gym's SWE agents.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import plugins
from corpora.adapters._common import json_value, jsonable, text
from corpora.schema import RecordError

#: How :func:`canonical_fields` names an upstream row's agent in ``metadata``.
UPSTREAM_AGENT_KEY = "nemo_gym_agent_ref"
#: The ``metadata`` key of a row's exact upstream JSON line (what the NeMo-Gym export writes back).
UPSTREAM_ROW_KEY = "nemo_gym_row"

Translate = Callable[[dict[str, Any]], tuple[dict[str, Any] | None, dict[str, Any]]]


@dataclass(frozen=True)
class NemoGymAgent:
    """One NeMo-Gym agent as this package grades it.

    Attributes:
        name: the agent's NeMo-Gym name.
        verifier: the ``agent_ref`` of this package's verifier (entry-point group ``cascade_rl.verifiers``).
        domain: the RL domain of its rows (entry-point group ``cascade_rl.domains``).
        translate: ``fn(upstream_row) -> (ground_truth or None, metadata keys)``; raises
            :class:`RecordError` naming the field when the row has nothing to verify against.
    """

    name: str
    verifier: str
    domain: str
    translate: Translate


def nothing_to_verify(what: str) -> RecordError:
    """The reject of a row whose ground truth is absent (the audit's 615 rows), category ``no_ground_truth``."""
    return RecordError(f"nothing to verify against ({what})", category="no_ground_truth")


def _present(raw: dict[str, Any], *fields: str) -> Any:
    """The first of ``fields`` set in ``raw`` (top level, then ``metadata``), else None."""
    meta = json_value(raw.get("metadata"), "metadata") if raw.get("metadata") is not None else {}
    for field in fields:
        for where in (raw, meta if isinstance(meta, dict) else {}):
            if where.get(field) not in (None, "", []):
                return where[field]
    return None


# ------------------------------------------------------------------ translations
def instruction_following(raw: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    """IF rows: the verifier reads ``instruction_id_list`` and ``kwargs`` (columns of their own)."""
    if not raw.get("instruction_id_list"):
        raise nothing_to_verify("instruction_id_list is empty")
    return None, {}


def _options(value: Any) -> dict[str, str]:
    """NeMo-Gym's ``options`` (a list of one-key ``{letter: text}`` objects), a ``{letter: text}``
    object, or a list of texts (lettered A, B, ...) as ``{letter: text}``."""
    value = json_value(value, "options")
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list) and all(isinstance(v, dict) and len(v) == 1 for v in value):
        items = [next(iter(v.items())) for v in value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = [(chr(ord("A") + i), v) for i, v in enumerate(value)]
    else:
        raise RecordError("options: expected [{letter: text}, ...], {letter: text} or [text, ...]")
    out = {}
    for letter, option in items:
        if not (isinstance(letter, str) and re.fullmatch(r"[A-Za-z]", letter.strip())) or not isinstance(option, str):
            raise RecordError(f"options: {letter!r} is not a letter with an option text")
        out[letter.strip().upper()] = option
    return out


_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[:.)]\s+(\S.*?)\s*$", re.M)


def options_in_prompt(prompt: str) -> dict[str, str]:
    """``{letter: text}`` of the option lines (``A: ...``, ``A. ...``, ``(A) ...``) of ``prompt`` when they
    run A, B, C... in order (at least two), else ``{}``."""
    found: dict[str, str] = {}
    for m in _OPTION_LINE.finditer(prompt):
        letter = m.group(1)
        if letter == "A":
            found = {}
        if letter == chr(ord("A") + len(found)):
            found[letter] = m.group(2)
    return found if len(found) >= 2 else {}


def _last_user(raw: dict[str, Any]) -> str:
    rcp = json_value(raw.get("responses_create_params"), "responses_create_params") or {}
    turns = rcp.get("input") if isinstance(rcp, dict) else None
    if isinstance(turns, str):
        return turns
    users = [t.get("content") for t in turns or [] if isinstance(t, dict) and t.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else ""


def mcqa(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """MCQA rows (NeMo-Gym ``mcqa``): ``expected_answer`` (a letter) and ``options`` (else the option lines
    of the question or prompt) -> ``{answer, options}``; ``template_metadata.output_regex`` (a regex or a
    list) -> ``metadata.output_regex``; a ``lenient_*`` ``grading_mode`` -> ``metadata.mcqa_lenient``."""
    answer = _present(raw, "expected_answer", "answer")
    if not isinstance(answer, str) or not answer.strip():
        raise nothing_to_verify("no expected_answer")
    options_raw = _present(raw, "options")
    options = (_options(options_raw) if options_raw is not None
               else options_in_prompt(str(raw.get("question") or "")) or options_in_prompt(_last_user(raw)))
    if not options:
        raise nothing_to_verify("no options, and no option lines in the question")
    meta: dict[str, Any] = {}
    template = json_value(raw.get("template_metadata"), "template_metadata")
    if isinstance(template, dict) and template.get("output_regex"):
        meta["output_regex"] = template["output_regex"]
    if str(raw.get("grading_mode") or "").startswith("lenient"):
        meta["mcqa_lenient"] = True
    return {"answer": answer.strip().upper(), "options": options}, meta


def math(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Math rows (NeMo-Gym ``math_with_judge``, AceReason in MOPD): ``expected_answer`` -> ``{answer}``
    (math-verify; the LLM judge NeMo-Gym adds for equivalences it cannot parse is not run)."""
    answer = _present(raw, "expected_answer", "answer")
    if answer is None or not str(answer).strip():
        raise nothing_to_verify("no expected_answer")
    return {"answer": str(answer).strip()}, {}


def strict_schema(schema: Any) -> Any:
    """A copy of ``schema`` made strict as NeMo-Gym's structured-outputs server makes it before validating
    (``strictify_schema``, OpenAI's strict mode): every object node that lists ``properties`` requires all
    of them and allows no other key."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if isinstance(out.get("properties"), dict):
        out["required"], out["additionalProperties"] = list(out["properties"]), False
    return out


def structured_output(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Structured-output rows (NeMo-Gym ``structured_outputs``): ``schema_str`` (a JSON Schema as a JSON
    string; ``schema``/``json_schema`` objects too) -> ``{schema}`` made strict as NeMo-Gym validates it
    (:func:`strict_schema`), and ``metadata.fenced`` ``reject`` (NeMo-Gym parses the whole answer as JSON,
    so a fenced block scores 0 there). Only ``schema_type`` ``json`` with the answer in the text (no
    ``response_mode`` ``tool_call``) is graded here: others are refused by name."""
    kind = raw.get("schema_type") or "json"
    if kind != "json":
        raise RecordError(f"schema_type: {kind!r} is not graded here (json only)")
    if raw.get("response_mode") not in (None, "text"):
        raise RecordError(f"response_mode: {raw['response_mode']!r} is not graded here (answers in the text only)")
    schema = _present(raw, "schema_str", "schema", "json_schema")
    if schema is None:
        raise nothing_to_verify("no schema_str")
    schema = json_value(schema, "schema_str")
    if not isinstance(schema, (dict, bool)):
        raise RecordError("schema_str: not a JSON Schema object")
    return {"schema": strict_schema(schema)}, {"fenced": "reject"}


def workplace(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Workplace-assistant rows (NeMo-Gym ``workplace_assistant``, ``environment_name`` ``workbench``):
    ``ground_truth``, a list of ``{name, arguments}`` (``arguments`` a JSON string or an object) ->
    ``{calls: [{name, arguments: object}]}`` for :mod:`validators.verifiers.workplace`."""
    calls = json_value(raw.get("ground_truth"), "ground_truth")
    if not calls:
        raise nothing_to_verify("ground_truth has no calls")
    if not isinstance(calls, list):
        raise RecordError("ground_truth: expected a list of {name, arguments}")
    out = []
    for i, call in enumerate(calls):
        call = json_value(call, f"ground_truth[{i}]")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise RecordError(f"ground_truth[{i}]: expected {{name, arguments}}")
        args = json_value(call.get("arguments") or {}, f"ground_truth[{i}].arguments")
        if not isinstance(args, dict):
            raise RecordError(f"ground_truth[{i}].arguments: must encode a JSON object")
        out.append({"name": call["name"], "arguments": jsonable(args)})
    return {"calls": out}, {}


def swe(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """SWE rows (NeMo-Gym SWE agents; SWE-Gym / R2E-Gym instances): the SWE-bench fields at the top
    level or in ``responses_create_params.metadata`` (``golden_patch`` for ``patch``) -> the task
    :class:`validators.swe.environment.SWEEnvironment` runs (see :func:`corpora.adapters.swe.swe_task`)."""
    from corpora.adapters.swe import swe_task

    rcp = json_value(raw.get("responses_create_params"), "responses_create_params") or {}
    inner = json_value(rcp.get("metadata"), "responses_create_params.metadata") if isinstance(rcp, dict) else None
    fields = {**(inner if isinstance(inner, dict) else {}), **{k: v for k, v in raw.items() if v is not None}}
    if fields.get("golden_patch") and not fields.get("patch"):
        fields["patch"] = fields["golden_patch"]
    task = swe_task(fields)
    return task, {"question": text(task.pop("problem_statement"), "problem_statement")}


# ------------------------------------------------------------------ the table
# The built-in agents; the entry points of group ``cascade_rl.nemo_gym_agents`` in ``pyproject.toml``
# name them (the SWE agent under each of NeMo-Gym's SWE agent names).
IF = NemoGymAgent("instruction_following_simple_agent", "instruction_following", "instruction_following",
                  instruction_following)
MCQA = NemoGymAgent("mcqa_simple_agent", "mcqa", "stem_mcqa", mcqa)
MATH = NemoGymAgent("math_with_judge_simple_agent", "math", "math", math)
STRUCTURED_OUTPUT = NemoGymAgent("structured_outputs_simple_agent", "structured_output", "structured_output",
                                 structured_output)
WORKPLACE = NemoGymAgent("workplace_assistant_simple_agent", "workplace", "tool_calling", workplace)
SWE = NemoGymAgent("swe_agents", "swe", "swe", swe)


def agent_ref(value: Any) -> tuple[str, Any]:
    """``(name, the value as upstream had it)`` of an ``agent_ref``: a string, ``{type, name}`` or its JSON.

    Raises:
        RecordError: no name.
    """
    value = json_value(value, "agent_ref") if isinstance(value, str) and value[:1] == "{" else value
    name = value.get("name") if isinstance(value, dict) else value
    if not isinstance(name, str) or not name:
        raise RecordError("agent_ref: needs a name")
    return name, value


def agent(name: str) -> NemoGymAgent:
    """The :class:`NemoGymAgent` registered as ``name``.

    Raises:
        RecordError: category ``unknown_agent``, naming it and the registered agents.
    """
    if name not in plugins.names("nemo_gym_agents"):
        raise RecordError(f"NeMo-Gym agent {name!r} names no verifier here (registered: "
                          f"{', '.join(plugins.names('nemo_gym_agents'))}; add one to entry-point group "
                          f"'cascade_rl.nemo_gym_agents')", category="unknown_agent")
    return plugins.load("nemo_gym_agents", name)


def canonical_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The verifier-facing fields of an upstream NeMo-Gym row: ``agent_ref`` (this package's verifier),
    ``domain``, ``ground_truth`` (or None), and ``metadata`` keys (the translation's, plus the upstream
    ``agent_ref`` under :data:`UPSTREAM_AGENT_KEY`).

    Raises:
        RecordError: the agent is unknown (category ``unknown_agent``), the row has nothing to verify
            against (``no_ground_truth``), or a ground-truth field is malformed (named).
    """
    name, upstream = agent_ref(raw.get("agent_ref"))
    spec = agent(name)
    truth, meta = spec.translate(raw)
    return {"agent_ref": spec.verifier, "domain": spec.domain, "ground_truth": truth,
            "metadata": {**meta, UPSTREAM_AGENT_KEY: jsonable(upstream)}}


def verify_row(body: dict[str, Any]) -> dict[str, Any]:
    """A NeMo-Gym verify body's row (its fields but ``response``) as this package's verifiers read it.

    A row of a registered NeMo-Gym agent (NVIDIA's release as NeMo-RL sends it) is translated by
    :func:`canonical_fields` (``kwargs`` entries cleaned as at ingest); a row this package exported
    (``agent_ref.name`` a verifier's name) only has its ``agent_ref`` reduced to the name.

    Raises:
        RecordError: as :func:`canonical_fields`, or malformed ``kwargs``.
    """
    from corpora.adapters.instructions import clean_kwargs

    name, _ = agent_ref(body.get("agent_ref"))
    if name not in plugins.names("nemo_gym_agents"):
        return {**body, "agent_ref": name}
    fields = canonical_fields(body)
    meta = json_value(body.get("metadata"), "metadata") if body.get("metadata") is not None else {}
    row = {**body, "agent_ref": fields["agent_ref"], "ground_truth": fields["ground_truth"],
           "metadata": {**(meta if isinstance(meta, dict) else {}), **fields["metadata"]}}
    ids = body.get("instruction_id_list")
    if isinstance(ids, list) and body.get("kwargs") is not None:
        row["kwargs"] = clean_kwargs(body["kwargs"], len(ids))
    return row
