"""The CPU engine end to end with the official `openai` client: a streamed chat that says
something sensible, then the same conversation again, whose prompt comes from the prefix
cache (usage.prompt_tokens_details.cached_tokens).

Usage: python candle_e2e.py BASE_URL MODEL
"""

import sys

import openai


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def streamed(client, model, messages):
    text, usage = "", None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    return text, usage


def main(base_url: str, model: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    messages = [
        {"role": "system", "content": "You are a concise assistant who knows geography well."},
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    ]
    first, usage = streamed(client, model, messages)
    words = first.split()
    check(len(words) >= 3, f"too little text: {first!r}")
    check(sum(w.isalpha() for w in words) >= len(words) // 2, f"not words: {first!r}")
    check(usage is not None and 0 < usage.completion_tokens <= 24, f"usage {usage}")
    print("first:", repr(first), usage.prompt_tokens, "prompt tokens")

    second, usage = streamed(client, model, messages)
    check(second == first, f"greedy decoding differs: {first!r} then {second!r}")
    cached = usage.prompt_tokens_details.cached_tokens
    check(cached >= 16, f"the repeated prompt was not served from the prefix cache: {usage}")
    print("second: cached", cached, "of", usage.prompt_tokens)
    print("all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
