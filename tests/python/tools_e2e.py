"""The openai client's tool loop against a Switchyard endpoint whose engine echoes the last
message (crates/switchyard/tests/tools.rs): the user's message is the model's answer.

Usage: python tools_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import json
import sys

import openai
from streamed_message import streamed

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main(base_url: str, model: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": CALL}]
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=100)
    check(first.choices[0].finish_reason == "tool_calls", f"finish {first.choices[0].finish_reason}")
    call = first.choices[0].message.tool_calls[0]
    check(call.function.name == "get_weather", f"call {call}")
    check(json.loads(call.function.arguments) == {"city": "Paris"}, f"arguments {call.function.arguments}")
    # The loop: the assistant's message as the SDK returned it, then the tool's result.
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=100)
    check(final.choices[0].finish_reason == "stop", f"final finish {final.choices[0].finish_reason}")
    check(final.choices[0].message.content == "18 degrees and sunny", f"final {final.choices[0].message}")
    check(not final.choices[0].message.tool_calls, "a call in the final answer")

    content, calls, finish = streamed(client, model=model, messages=messages[:1], tools=TOOLS, max_tokens=100)
    check(finish == "tool_calls", f"streamed finish {finish}")
    check(len(calls) == 1 and calls[0]["id"] and calls[0]["name"] == "get_weather", f"streamed calls {calls}")
    check(json.loads(calls[0]["arguments"]) == {"city": "Paris"}, f"streamed arguments {calls}")
    check(content.strip() == "", f"streamed content {content!r}")
    messages[1] = {"role": "assistant", "tool_calls": [
        {"id": calls[0]["id"], "type": "function",
         "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}]}
    messages[2]["tool_call_id"] = calls[0]["id"]
    content, calls, finish = streamed(client, model=model, messages=messages, tools=TOOLS, max_tokens=100)
    check(finish == "stop" and not calls and content == "18 degrees and sunny", f"streamed final {content!r}")
    print("tools e2e: all checks passed")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except AssertionError as failure:
        print(f"tools e2e failed: {failure}", file=sys.stderr)
        sys.exit(1)
