"""Structured output through the openai client against a Switchyard endpoint whose engines
enforce constraints (the mocker; crates/switchyard/tests/structured.rs).

Usage: python structured_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import json
import re
import sys
from typing import Literal

import openai
import pydantic


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[Literal["red", "green", "blue"]]
    admin: bool
    nickname: str | None


class GetWeather(pydantic.BaseModel):
    city: str
    days: int


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main(base_url, model):
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    user = lambda i: [{"role": "user", "content": f"Describe person {i} as JSON."}]

    # parse(): the SDK sends the model's strict JSON schema and validates every answer.
    reasons = {}
    for i in range(100):
        r = client.chat.completions.parse(model=model, messages=user(i), response_format=Person, seed=i)
        choice = r.choices[0]
        reasons[choice.finish_reason] = reasons.get(choice.finish_reason, 0) + 1
        check(choice.finish_reason == "stop", f"answer {i} ended with {choice.finish_reason}: {choice.message.content!r}")
        check(isinstance(choice.message.parsed, Person), f"answer {i} did not parse: {choice.message.content!r}")
    print("parse: 100 of 100 valid", reasons)

    # The same, streamed: the deltas add up to a valid object.
    with client.chat.completions.stream(model=model, messages=user(100), response_format=Person) as stream:
        final = stream.get_final_completion()
    check(isinstance(final.choices[0].message.parsed, Person), f"streamed: {final.choices[0].message.content!r}")

    # JSON mode: an object.
    for i in range(10):
        r = client.chat.completions.create(model=model, messages=user(i), seed=i, response_format={"type": "json_object"})
        check(isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content)

    # vLLM's spellings: a regex, a choice.
    pattern = r"(yes|no)-[0-9]{2,4}"
    for i in range(10):
        r = client.chat.completions.create(model=model, messages=user(i), seed=i, extra_body={"guided_regex": pattern})
        check(re.fullmatch(pattern, r.choices[0].message.content), f"regex: {r.choices[0].message.content!r}")
        r = client.chat.completions.create(
            model=model, messages=user(i), seed=i, extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}
        )
        check(r.choices[0].message.content in ("alpha", "beta", "gamma"), f"choice: {r.choices[0].message.content!r}")

    # A budget too small for the object: cut short, and said so.
    r = client.chat.completions.create(model=model, messages=user(0), max_tokens=3, response_format={"type": "json_object"})
    check(r.choices[0].finish_reason == "length", f"short: {r.choices[0].finish_reason}")

    # A malformed constraint is a 400 naming its parameter.
    bad = {
        "guided_regex": {"guided_regex": "a(b"},
        "response_format": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
        "guided_choice": {"guided_regex": "a", "guided_choice": ["b"]},
    }
    for param, body in bad.items():
        try:
            client.chat.completions.create(model=model, messages=user(0), extra_body=body)
            check(False, f"{body} was not refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == param, f"{body}: {e.body}")
    # Forced tool calls, in the SDK's tool loop: a strict pydantic tool, `required` then a
    # named function; each call parses into the model; the tool's result goes back in, and
    # the model answers with the strict tool still offered (`auto`: text or a valid call).
    tools = [openai.pydantic_function_tool(GetWeather)]
    for i, choice in enumerate(["required", {"type": "function", "function": {"name": "GetWeather"}}]):
        messages = user(i)
        r = client.chat.completions.parse(model=model, messages=messages, tools=tools, tool_choice=choice, seed=i)
        check(r.choices[0].finish_reason == "tool_calls", f"forced: {r.choices[0]}")
        calls = r.choices[0].message.tool_calls
        check(calls and all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls), f"forced calls: {calls}")
        messages.append({"role": "assistant", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls]})
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees"})
        final = client.chat.completions.create(model=model, messages=messages, tools=tools, seed=i, max_tokens=30)
        check(final.choices[0].finish_reason in ("stop", "length"), f"after the tool: {final.choices[0]}")
    print("all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
