"""A KV event publisher speaking vLLM's ZMQ protocol, driven by a test over stdin.

PUB socket: three frames [topic, seq (8 bytes big-endian), payload].
ROUTER socket (replay): a request [identity, b"", start (8 bytes big-endian)] is answered
with [identity, b"", seq, payload] for every held batch from `start`, then
[identity, b"", -1 (signed), b""].

Commands, one JSON object per line; each is answered with a line "ok":
  {"op": "publish", "seq": N, "payload": BASE64, "send": true}
      hold the batch for replay; publish it unless "send" is false (a lost message)
  {"op": "forget"}     drop every held batch (replay can no longer fill a gap)
  {"op": "restart"}    close both sockets and bind them again, holding nothing
  {"op": "quit"}
"""

import base64
import json
import sys
import threading
import time

import zmq

pub_port, replay_port = int(sys.argv[1]), int(sys.argv[2])
context = zmq.Context()
lock = threading.Lock()
held = {}
state = {"pub": None, "router": None, "generation": 0}


def bound(kind, port):
    """A socket bound to the port, retried while a closed one still holds it (libzmq
    closes sockets in the background)."""
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    for _ in range(100):
        try:
            socket.bind(f"tcp://127.0.0.1:{port}")
            return socket
        except zmq.ZMQError as error:
            if error.errno != zmq.EADDRINUSE:
                raise
            time.sleep(0.05)
    raise RuntimeError(f"port {port} stays in use")


def bind():
    pub = bound(zmq.PUB, pub_port)
    router = bound(zmq.ROUTER, replay_port)
    state["pub"], state["router"] = pub, router
    state["generation"] += 1
    threading.Thread(target=serve_replay, args=(router, state["generation"]), daemon=True).start()


def serve_replay(router, generation):
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while state["generation"] == generation:
        try:
            if not poller.poll(50):
                continue
            with lock:
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue
                identity, _, start = frames
                start = int.from_bytes(start, "big")
                for seq in sorted(s for s in held if s >= start):
                    router.send_multipart([identity, b"", seq.to_bytes(8, "big"), held[seq]])
                router.send_multipart([identity, b"", (-1).to_bytes(8, "big", signed=True), b""])
        except zmq.ZMQError:
            return


bind()
for line in sys.stdin:
    command = json.loads(line)
    op = command["op"]
    if op == "publish":
        payload = base64.b64decode(command["payload"])
        seq = command["seq"]
        with lock:
            held[seq] = payload
            if command.get("send", True):
                state["pub"].send_multipart([b"", seq.to_bytes(8, "big"), payload])
    elif op == "forget":
        with lock:
            held.clear()
    elif op == "restart":
        with lock:
            state["generation"] += 1
            state["pub"].close()
            state["router"].close()
            held.clear()
        bind()
    elif op == "quit":
        print("ok", flush=True)
        break
    print("ok", flush=True)
