"""llama.cpp (llama-cpp-python) on a GGUF file, measured as `candle-bench` measures the
candle engine: single-stream decode, time to first token for 128/512/2,048-token prompts
(cold), and the 2,048-token prompt again (llama.cpp reuses the KV of a repeated prefix).
Prints Markdown table rows. Usage: python bench-llama-cpp.py MODEL.gguf THREADS
"""

import sys
import time

from llama_cpp import Llama

path, threads = sys.argv[1], int(sys.argv[2])


def prompt(n, salt):
    return [300 + (i * 31 + salt * 977) % 40000 for i in range(n)]


def load():
    return Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, verbose=False)


def first_token(llm, tokens):
    """Time to the first token; `generate` reuses the KV of the longest prefix it shares
    with what the context last evaluated."""
    start = time.perf_counter()
    for _ in llm.generate(tokens, temp=0.0, top_k=1):
        return time.perf_counter() - start


llm = load()
first_token(llm, prompt(64, 0))
start = time.perf_counter()
n, first = 0, None
for _ in llm.generate(prompt(16, 1), temp=0.0, top_k=1):
    n += 1
    if first is None:
        first = time.perf_counter()
    if n == 129:
        break
print(f"| single-stream decode | {(n - 1) / (time.perf_counter() - first):.1f} tokens/s |")
print("| batch of 1/4/16 | (no multi-sequence batching in llama-cpp-python's API) |")
for size in (128, 512, 2048):
    llm = load()
    first_token(llm, prompt(8, 99))
    cold = first_token(llm, prompt(size, 7))
    print(f"| TTFT, {size}-token prompt, cold | {cold * 1e3:.1f} ms |")
    if size == 2048:
        cached = first_token(llm, prompt(size, 7))
        print(f"| TTFT, {size}-token prompt, fully cached | {cached * 1e3:.1f} ms ({cold / cached:.1f}x faster) |")
