"""The Responses API on the mocker (crates/switchyard/tests/responses.rs) and on a real model
(the CPU engine serving SmolLM2-135M; crates/switchyard/tests/candle_engine.rs): the openai
client's tool loop through `previous_response_id`, streamed and not; then the OpenAI Agents
SDK with its default model class (Responses) runs an agent with one tool to completion.

Usage: python agent_responses_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import asyncio
import json
import sys
from typing import Annotated

import openai
from pydantic import Field
from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def calls_of(response):
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        check(call.name == "get_weather" and call.call_id, f"call {call}")
        parsed = json.loads(call.arguments)
        check(set(parsed) == {"city"} and isinstance(parsed["city"], str), f"arguments {call.arguments}")
    return calls


def answered(client, model, first, **common):
    """The tool's results sent back on `first`; the model's next answer (text or calls)."""
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "18 degrees and sunny"}
               for c in calls_of(first)]
    final = client.responses.create(model=model, previous_response_id=first.id, input=outputs, **common)
    check(final.status in ("completed", "incomplete"), f"final status {final.status}")
    check(final.output_text.strip() or calls_of(final), f"an empty final answer: {final.output}")
    return final


def tool_loop(client, model):
    common = dict(tools=[WEATHER], temperature=0.0, max_output_tokens=64)
    question = "What is the weather in Paris?"
    # `required`, whole: the model must call; the call is well formed.
    first = client.responses.create(model=model, input=question, tool_choice="required", **common)
    check(calls_of(first), f"required: {first.output}")
    final = answered(client, model, first, **common)
    print("tool loop:", [c.arguments for c in calls_of(first)], "->", repr(final.output_text))
    # A named function, streamed: the SDK's helper accumulates the events.
    named = {"type": "function", "name": "get_weather"}
    with client.responses.stream(model=model, input=question, tool_choice=named, **common) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_response()
    check("response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed", f"events {kinds}")
    check(len(calls_of(first)) == 1, f"named: {first.output}")
    final = answered(client, model, first, **common)
    print("streamed tool loop:", calls_of(first)[0].arguments, "->", repr(final.output_text))


async def agent_run(base_url, model):
    set_tracing_disabled(True)
    asked = []

    # The city's length is bounded, so the forced call (JSON under a grammar) fits its budget
    # however the small model spells it.
    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=24)]) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"18 degrees and sunny in {city}"

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    # The SDK's default model class speaks the Responses API.
    set_default_openai_client(client, use_for_tracing=False)
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather. Call get_weather.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=96),
        # The run ends with the tool's result. The SDK takes a response cut at its token limit
        # (`incomplete`) for a failure, and a 135M model's free answer after the tool does not
        # reliably end within a budget (its greedy answer changes with the cache's floating
        # point); the tool's output going back and answered is checked by the client's loop.
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=6)
    check(asked, "the agent never called its tool")
    check(result.final_output == f"18 degrees and sunny in {asked[0]}", f"final output {result.final_output!r}")
    kinds = {type(r).__name__ for r in result.raw_responses}
    print("agent:", asked, "->", repr(result.final_output), kinds)


def main(base_url, model):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    tool_loop(client, model)
    asyncio.run(agent_run(base_url, model))
    print("all checks passed")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except AssertionError as failure:
        print(f"agent responses e2e failed: {failure}", file=sys.stderr)
        sys.exit(1)
