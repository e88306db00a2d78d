"""Hostile clients against a running `serve` while a normal client runs (docs/benchmarks.md).

    python3 scripts/hostile-clients.py HOST:PORT SERVER_PID [--idle 20000] [--slow 500] [--seconds 30]

Phases, each `--seconds` long: a baseline with the normal client alone, then the same with
`--idle` connections that never send a byte and `--slow` ones trickling a body a byte a
second (each reconnects when the server closes it, as an attacker would). Reports the
normal client's success rate and time to first token, how often `/health` answered, the
server's RSS, and how long a 10 MB prompt takes to be refused. Standard library only; the
attackers run in several processes (a process may hold at most `ulimit -n` sockets).
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import time

MODEL = "switchyard-mock"
PER_PROCESS = 9000


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def source(n):
    """Attackers connect from 127.0.0.2-9 (the normal client from 127.0.0.1), so that they
    do not exhaust its ephemeral ports."""
    return (f"127.0.0.{2 + n % 8}", 0)


async def idle_one(host, port, stop, n):
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=source(n))
            await reader.read()  # until the server closes it
            writer.close()
        except OSError:
            await asyncio.sleep(0.1)


async def slow_one(host, port, stop, n):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000000\r\n\r\n").encode()
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=source(n))
            writer.write(head)
            while time.monotonic() < stop and not reader.at_eof():
                writer.write(b" ")
                await writer.drain()
                try:
                    await asyncio.wait_for(reader.read(4096), 1.0)
                except asyncio.TimeoutError:
                    pass
            writer.close()
        except OSError:
            await asyncio.sleep(0.1)


def attacker(host, port, idle, slow, seconds):
    async def run():
        stop = time.monotonic() + seconds
        tasks = [idle_one(host, port, stop, n) for n in range(idle)]
        tasks += [slow_one(host, port, stop, n) for n in range(slow)]
        await asyncio.gather(*tasks)
    asyncio.run(run())


async def request(host, port, raw, first_marker=b"data: "):
    """Sends `raw` on a new connection; returns (status, seconds to first marker, whole)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    await writer.drain()
    data, first = b"", None
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        data += chunk
        if first is None and first_marker in data.split(b"\r\n\r\n", 1)[-1]:
            first = time.monotonic() - started
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1") else 0
    return status, first, data


def chat_request(stream=True):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}],
                       "max_tokens": 16, "stream": stream}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def normal_client(host, port, seconds, concurrency=4):
    stop = time.monotonic() + seconds
    outcomes, ttfts, failures = [], [], {}

    async def loop():
        while time.monotonic() < stop:
            try:
                status, first, data = await asyncio.wait_for(request(host, port, chat_request()), 30)
                ok = status == 200 and b"[DONE]" in data
                why = status if not ok else None
            except (OSError, asyncio.TimeoutError, ValueError, IndexError) as e:
                ok, first, why = False, None, str(e)[:60]
            outcomes.append(ok)
            if why is not None:
                failures[why] = failures.get(why, 0) + 1
            if ok and first is not None:
                ttfts.append(first)
    await asyncio.gather(*[loop() for _ in range(concurrency)])
    return outcomes, ttfts, failures


async def health_poller(host, port, seconds):
    stop = time.monotonic() + seconds
    answers = []
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    while time.monotonic() < stop:
        try:
            status, _, _ = await asyncio.wait_for(request(host, port, raw, b"{"), 2)
            answers.append(status == 200)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError):
            answers.append(False)
        await asyncio.sleep(0.25)
    return answers


async def phase(host, port, pid, seconds):
    rss = []

    async def sample():
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            rss.append(rss_mib(pid))
            await asyncio.sleep(1)
    (outcomes, ttfts, failures), health, _ = await asyncio.gather(
        normal_client(host, port, seconds), health_poller(host, port, seconds), sample())
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) >= 2 else [float("nan")] * 99
    return {
        "requests": len(outcomes),
        "success": sum(outcomes) / max(len(outcomes), 1),
        "failures": failures,
        "ttft_p50_ms": q[49] * 1e3,
        "ttft_p99_ms": q[98] * 1e3,
        "health": f"{sum(health)}/{len(health)}",
        "rss_max_mib": max(rss) if rss else 0.0,
    }


async def big_prompt(host, port):
    prompt = "word " * (2 * 1024 * 1024)  # 10 MiB
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw + body.encode())
    await writer.drain()
    sent = time.monotonic()  # the body is in the kernel's buffers: the server reads it now
    data = await reader.read()
    took = time.monotonic() - sent
    writer.close()
    return data.split(b"\r\n", 1)[0].decode(), took


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("pid", type=int)
    parser.add_argument("--idle", type=int, default=20000)
    parser.add_argument("--slow", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    port = int(port)
    print("rss at rest (MiB):", round(rss_mib(args.pid), 1))
    print("baseline:", asyncio.run(phase(host, port, args.pid, args.seconds)))
    # Attackers ramp up for a few seconds, then the measured phase.
    ramp = 8.0
    processes, idle, slow = [], args.idle, args.slow
    while idle > 0 or slow > 0:
        take_idle = min(idle, PER_PROCESS)
        take_slow = min(slow, PER_PROCESS - take_idle)
        p = multiprocessing.Process(target=attacker, args=(host, port, take_idle, take_slow, args.seconds + ramp + 5))
        p.start()
        processes.append(p)
        idle, slow = idle - take_idle, slow - take_slow
    time.sleep(ramp)
    print("under attack:", asyncio.run(phase(host, port, args.pid, args.seconds)))
    status, took = asyncio.run(big_prompt(host, port))
    print(f"10 MiB prompt: {status} in {took * 1e3:.1f} ms")
    for p in processes:
        p.join()


if __name__ == "__main__":
    main()
