"""The openai client's Responses API against a Switchyard endpoint whose engine echoes the
last message (crates/switchyard/tests/responses.rs): a function call, its output sent back
with `previous_response_id`, streamed and not; retrieve, delete, `store: false`.

Usage: python responses_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import json
import sys

import openai

TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
RESULT = "18 degrees and sunny"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def only_call(response):
    calls = [item for item in response.output if item.type == "function_call"]
    check(len(calls) == 1, f"calls in {response.output}")
    call = calls[0]
    check(call.name == "get_weather" and call.call_id, f"call {call}")
    check(json.loads(call.arguments) == {"city": "Paris"}, f"arguments {call.arguments}")
    return call


def whole(client, model):
    first = client.responses.create(model=model, input=CALL, tools=TOOLS, max_output_tokens=100)
    check(first.status == "completed", f"status {first.status}")
    call = only_call(first)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    final = client.responses.create(
        model=model, previous_response_id=first.id, input=[output], tools=TOOLS, max_output_tokens=100)
    check(final.output_text == RESULT, f"final {final.output}")
    check(final.previous_response_id == first.id, f"previous {final.previous_response_id}")
    check(final.usage.input_tokens > 0 and final.usage.output_tokens > 0, f"usage {final.usage}")
    # Stored: read back as answered; deleted: gone, and no longer continued.
    check(client.responses.retrieve(final.id).output_text == RESULT, "retrieved")
    client.responses.delete(final.id)
    for attempt in (lambda: client.responses.retrieve(final.id),
                    lambda: client.responses.create(model=model, previous_response_id=final.id, input="more")):
        try:
            attempt()
            raise AssertionError("a deleted response was found")
        except openai.NotFoundError as e:
            check(final.id in str(e), f"error {e}")
    # `store: false` keeps nothing.
    unstored = client.responses.create(model=model, input="hello", store=False, max_output_tokens=10)
    try:
        client.responses.retrieve(unstored.id)
        raise AssertionError("an unstored response was found")
    except openai.NotFoundError:
        pass


def streamed(client, model):
    # The SDK's stream helper checks the events' order and indices as it accumulates them.
    with client.responses.stream(model=model, input=CALL, tools=TOOLS, max_output_tokens=100) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_response()
    check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"events {kinds}")
    check("response.function_call_arguments.delta" in kinds, f"events {kinds}")
    call = only_call(first)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    text = ""
    for event in client.responses.create(model=model, previous_response_id=first.id, input=[output],
                                         tools=TOOLS, max_output_tokens=100, stream=True):
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            check(event.response.output_text == RESULT, f"completed {event.response.output}")
    check(text == RESULT, f"streamed text {text!r}")


def main(base_url: str, model: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    whole(client, model)
    streamed(client, model)
    print("responses e2e: all checks passed")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except AssertionError as failure:
        print(f"responses e2e failed: {failure}", file=sys.stderr)
        sys.exit(1)
