"""Tool calls on a real model (the CPU engine serving SmolLM2-135M;
crates/switchyard/tests/candle_engine.rs): the openai client's tool loop with `required`, a
named function and a strict tool left to the model, streamed and not; then the OpenAI Agents
SDK (its chat-completions model) runs an agent with one tool to its final answer.

Usage: python agent_tools_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import asyncio
import json
import sys

import openai
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from streamed_message import streamed

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def city_of(name, arguments):
    check(name == "get_weather", f"a call of {name}")
    parsed = json.loads(arguments)
    check(set(parsed) == {"city"} and isinstance(parsed["city"], str), f"arguments {arguments}")
    return parsed["city"]


def tool_loop(client, model):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    common = dict(model=model, tools=[WEATHER], temperature=0.0, max_tokens=64)
    # `required`, whole: the model must call; the call is well formed.
    first = client.chat.completions.create(messages=question, tool_choice="required", **common)
    choice = first.choices[0]
    check(choice.finish_reason == "tool_calls", f"required: {choice}")
    calls = choice.message.tool_calls
    cities = [city_of(c.function.name, c.function.arguments) for c in calls]
    # A named function, streamed: the same call (greedy), name first, then its arguments.
    named = {"type": "function", "function": {"name": "get_weather"}}
    content, streamed_calls, finish = streamed(client, messages=question, tool_choice=named, **common)
    check(finish == "tool_calls" and len(streamed_calls) == 1 and streamed_calls[0]["id"], f"named: {streamed_calls}")
    city_of(streamed_calls[0]["name"], streamed_calls[0]["arguments"])
    # The tool's result goes back; the model answers, the strict tool still offered (`auto`).
    messages = question + [
        {"role": "assistant", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls]},
    ] + [{"role": "tool", "tool_call_id": c.id, "content": "18 degrees and sunny"} for c in calls]
    final = client.chat.completions.create(messages=messages, **common)
    choice = final.choices[0]
    check(choice.finish_reason in ("stop", "length", "tool_calls"), f"final: {choice}")
    for call in choice.message.tool_calls or []:
        city_of(call.function.name, call.function.arguments)
    check(choice.message.content or choice.message.tool_calls, f"an empty final answer: {choice}")
    print("tool loop:", cities, "->", repr(choice.message.content), choice.finish_reason)


async def agent_run(base_url, model):
    set_tracing_disabled(True)
    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"18 degrees and sunny in {city}"

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather. Call get_weather, then answer in one sentence.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        # The first turn must call the tool; the SDK then sets the choice back to `auto`.
        model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=64),
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=6)
    check(asked, "the agent never called its tool")
    check(isinstance(result.final_output, str) and result.final_output.strip(), f"final output {result.final_output!r}")
    print("agent:", asked, "->", repr(result.final_output))


def main(base_url, model):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    tool_loop(client, model)
    asyncio.run(agent_run(base_url, model))
    print("all checks passed")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except AssertionError as failure:
        print(f"agent tools e2e failed: {failure}", file=sys.stderr)
        sys.exit(1)
