"""What one write to a waiting peer over loopback TCP costs the writer's CPU on this machine.

Both hot paths of issue 38 end every call in socket writes: the env writes each group's request
to the inference server, the rollout proxy writes each call to the server and its answer to
the agent. Where the peer sleeps in its wait for bytes, the kernel delivers the bytes and wakes
the peer inside the writer's `send` (on a virtual machine, waking a process on another core is
an interrupt between virtual CPUs), so the writer pays for that wakeup. This measures it with
plain blocking sockets, one request and one answer at a time (the peer always asleep when the
request comes): CPU of each `send` and each `recv` (thread CPU time around the call), and of a
whole round trip, for a few request sizes.

    python benchmarks/loopback_send.py --sizes 200 2000 8000 --round-trips 20000
"""

from __future__ import annotations

import argparse
import os
import socket
import time

ANSWER = b"x" * 200


def _serve(listener: socket.socket) -> None:
    """The peer: answer each request (one recv) with ANSWER until the writer closes."""
    peer, _ = listener.accept()
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while peer.recv(1 << 16):
        peer.send(ANSWER)
    os._exit(0)


def measure(size: int, round_trips: int) -> dict[str, float]:
    """CPU us of the writer per send, per recv and per round trip, for `size`-byte requests."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    child = os.fork()
    if child == 0:
        _serve(listener)
    conn = socket.create_connection(listener.getsockname())
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, clock = b"y" * size, time.thread_time_ns
    sending = receiving = 0
    started = time.process_time()
    for _ in range(round_trips):
        a = clock()
        conn.send(payload)
        b = clock()
        conn.recv(1 << 16)
        sending, receiving = sending + b - a, receiving + clock() - b
    whole = time.process_time() - started
    conn.close()
    os.waitpid(child, 0)
    listener.close()
    return {
        "send_us": sending / round_trips / 1e3,
        "recv_us": receiving / round_trips / 1e3,
        "round_trip_us": whole / round_trips * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 8000])
    parser.add_argument("--round-trips", type=int, default=20000)
    args = parser.parse_args()
    for size in args.sizes:
        got = measure(size, args.round_trips)
        print(
            f"request {size:>6} B: send {got['send_us']:.1f} us CPU, recv {got['recv_us']:.1f},"
            f" round trip {got['round_trip_us']:.1f}"
        )


if __name__ == "__main__":
    main()
