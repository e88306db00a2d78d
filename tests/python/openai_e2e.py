"""End-to-end checks of a Switchyard endpoint with the official `openai` client.

Usage: python openai_e2e.py BASE_URL MODEL
Exits non-zero (with a message) on the first failed check.
"""

import sys

import openai


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main(base_url: str, model: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

    models = client.models.list()
    check(any(m.id == model for m in models.data), f"{model} not in /v1/models")

    messages = [{"role": "user", "content": "Say something about trains. " * 20}]

    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=16)
    check(chat.object == "chat.completion", f"object {chat.object}")
    check(chat.choices[0].message.role == "assistant", "role")
    check(chat.choices[0].finish_reason in ("length", "stop"), f"finish {chat.choices[0].finish_reason}")
    check(0 < chat.usage.completion_tokens <= 16, f"usage {chat.usage}")
    check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, "total")
    check(chat.usage.prompt_tokens_details is not None, "prompt_tokens_details missing")

    # The same prompt again is served from the prefix cache.
    again = client.chat.completions.create(model=model, messages=messages, max_tokens=16)
    check(again.usage.prompt_tokens_details.cached_tokens > 0, f"no cache hit: {again.usage}")

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check(finish in ("length", "stop"), f"stream finish {finish}")
    check(usage is not None and usage.completion_tokens > 0, f"stream usage {usage}")
    check(len("".join(pieces)) > 0, "no streamed text")

    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8)
    check(completion.object == "text_completion", f"object {completion.object}")
    check(0 < completion.usage.completion_tokens <= 8, f"usage {completion.usage}")

    text = []
    for chunk in client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, stream=True):
        for choice in chunk.choices:
            text.append(choice.text)
    check(len("".join(text)) > 0, "no streamed completion text")

    # Errors surface as the client's typed exceptions.
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"status {e.status_code}")
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=129)
        raise AssertionError("n=129 accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"status {e.status_code}")

    # Several choices, as the SDK reads them, streamed and not.
    several = client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=2, seed=5)
    check([c.index for c in several.choices] == [0, 1], f"choices {several.choices}")
    check(several.choices[0].message.content != several.choices[1].message.content,
          f"two seeded choices alike: {several.choices}")
    parts = {}
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=2, seed=5,
                                                stream=True):
        for choice in chunk.choices:
            parts[choice.index] = parts.get(choice.index, "") + (choice.delta.content or "")
    check([parts.get(i) for i in (0, 1)] == [c.message.content for c in several.choices],
          f"streamed choices {parts}")

    print("openai e2e: all checks passed")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except AssertionError as failure:
        print(f"openai e2e failed: {failure}", file=sys.stderr)
        sys.exit(1)
