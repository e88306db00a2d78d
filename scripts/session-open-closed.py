"""Compare a session trace replayed closed loop and open loop by `switchyard sim`
(docs/benchmarks.md, "Sessions recovered from the conversation trace").

    python3 scripts/session-open-closed.py SESSIONS.jsonl CLOSED.jsonl OPEN.jsonl

SESSIONS.jsonl is the trace (agentic form, as `synth analyze --sessions-out` writes it);
CLOSED and OPEN are `sim --requests-out` files of the same trace without and with
`--open-loop`. For the turns that continue an earlier one it prints how many were sent
before that one's answer had ended, the share of their prompt tokens found cached, and
their TTFT.
"""

import json
import sys


def main(trace_path, closed_path, open_path):
    rows = [json.loads(line) for line in open(trace_path) if line.strip()]
    index = {r["request_id"]: i for i, r in enumerate(rows)}
    for label, path in (("closed", closed_path), ("open", open_path)):
        requests = [json.loads(line) for line in open(path) if line.strip()]
        early = continuing = cached = prompt = 0
        ttft = []
        for i, row in enumerate(rows):
            if not row.get("wait_for"):
                continue
            request = requests[i]
            parent = requests[index[row["wait_for"][0]]]
            continuing += 1
            parent_end = parent["arrival_ms"] + (parent["e2e_ms"] or 0)
            if request["arrival_ms"] < parent_end - 1e-6:
                early += 1
            cached += request["cached_tokens"]
            prompt += row["input_length"]
            if request["ttft_ms"] is not None:
                ttft.append(request["ttft_ms"])
        ttft.sort()
        print(
            f"{label}: {continuing} continuing turns, {early} ({100 * early / max(continuing, 1):.1f} %) "
            f"sent before the previous answer ended, {100 * cached / max(prompt, 1):.1f} % of their "
            f"prompt tokens cached, TTFT p50 {ttft[len(ttft) // 2]:.0f} ms p99 "
            f"{ttft[int(0.99 * len(ttft))]:.0f} ms"
        )


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
