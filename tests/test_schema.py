import pytest

from corpora.schema import RecordError, validate_row


def _sft(messages, **kw):
    row = {"uuid": "u1", "messages": messages, "domain": "chat", "source": "s", "source_version": "1",
           "license": "MIT"}
    row.update(kw)
    return row


def test_valid_row_is_completed_with_optional_fields():
    row = validate_row("sft", _sft([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]))
    assert row["messages"][0] == {"role": "user", "content": "hi", "reasoning_content": None,
                                  "tool_calls": None, "tool_call_id": None}
    assert row["tools"] == "[]" and row["metadata"] == "{}" and row["generator"] is None


@pytest.mark.parametrize("messages, kw, expected", [
    ([{"role": "narrator", "content": "x"}], {}, "messages[0].role: Input should be 'system', 'user'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}], {},
     "messages[1]: empty turn"),
    ([{"role": "user", "content": "hi"}], {}, "messages: last turn is 'user', expected 'assistant'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], {"domain": "poetry"},
     "domain: Input should be"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], {"tools": "[{"},
     "tools: tools is not valid JSON"),
    ([{"role": "user", "content": "bad \udc80 byte"}, {"role": "assistant", "content": "yo"}], {},
     "messages[0].content: text is not valid UTF-8"),
    ([{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}], {},
     "messages[1].tool_calls[0].function.arguments: arguments must encode a JSON object"),
])
def test_schema_errors_name_the_field(messages, kw, expected):
    with pytest.raises(RecordError) as exc:
        validate_row("sft", _sft(messages, **kw))
    assert str(exc.value).startswith(expected), str(exc.value)


def test_rl_row_needs_a_user_turn_and_valid_ground_truth():
    row = {"uuid": "r", "domain": "math", "agent_ref": "math", "source": "s", "source_version": "1",
           "license": "MIT", "responses_create_params": {"input": [{"role": "system", "content": "be nice"}]}}
    with pytest.raises(RecordError, match=r"responses_create_params.input: .*no user turn"):
        validate_row("rl", row)
    row["responses_create_params"]["input"].append({"role": "user", "content": "1+1?"})
    row["ground_truth"] = "{'answer': 2}"
    with pytest.raises(RecordError, match="ground_truth: ground_truth is not valid JSON"):
        validate_row("rl", row)
    row["ground_truth"] = '{"answer": 2}'
    assert validate_row("rl", row)["pass_rate"] is None
