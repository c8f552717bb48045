#!/usr/bin/env python3
"""A TCP relay that delays each direction by a fixed time: a WAN link for the benchmark.

    python3 tests/bench/wan_relay.py --listen 127.0.0.100 --to 127.0.0.1:2222 [--delay-ms 50]
    python3 tests/bench/wan_relay.py --selftest      # measure the relay against an echo server

Every chunk read from one side is written to the other DELAY after it was read, whatever its
size (no bandwidth limit), in the order it was read, on as many connections at once as come.
A TCP handshake takes a round trip that a userspace relay cannot add to the client's connect()
(the kernel answers the SYN), so the relay reaches the target 3 × DELAY after it accepted the
client and holds what the client sent until then: the server's first byte reaches the client
2 round trips after its connect() began, and the client's first byte reaches the server after
1.5, as over a real link with that delay. End-of-file is passed on (half-close), delayed like
data; a reset on either side closes both. Prints "listening ADDRESS PORT" when ready, then runs
until SIGTERM or SIGINT. `--nice -10` (as root) keeps the machine's load from stretching the
delays: a real link does not wait for the endpoints' CPUs. Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import socket
import statistics
import sys
import time

CHUNK = 256 * 1024
QUEUE_LIMIT = 16 * 1024 * 1024   # bytes in flight in one direction before reading pauses
HANDSHAKE_TRIPS = 3              # SYN, SYN-ACK, ACK: when the server's accept() returns


class Direction:
    """Chunks read from one side, each with the time it is due on the other (b"": end of file)."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.arrived = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    async def read_from(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(CHUNK)
            self.chunks.append((loop.time() + self.delay_s, data))
            self.arrived.set()
            if not data:
                return
            self.queued += len(data)
            if self.queued > QUEUE_LIMIT:
                self.room.clear()
                await self.room.wait()

    async def write_to(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.chunks:
                self.arrived.clear()
                await self.arrived.wait()
                continue
            due, data = self.chunks[0]
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
                continue
            self.chunks.popleft()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            self.queued -= len(data)
            if self.queued <= QUEUE_LIMIT:
                self.room.set()
            await writer.drain()


class Relay:
    def __init__(self, target: tuple[str, int], delay_s: float):
        self.target = target
        self.delay_s = delay_s
        self.connections = 0

    async def serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        up, down = Direction(self.delay_s), Direction(self.delay_s)
        upstream_w: asyncio.StreamWriter | None = None

        async def upstream() -> None:
            nonlocal upstream_w
            await asyncio.sleep(max(0.0, accepted + HANDSHAKE_TRIPS * self.delay_s - loop.time()))
            r, upstream_w = await asyncio.open_connection(*self.target)
            pumps = [asyncio.ensure_future(up.write_to(upstream_w)),
                     asyncio.ensure_future(down.read_from(r))]
            try:
                await asyncio.gather(*pumps)
            finally:
                for t in pumps:
                    t.cancel()

        tasks = [asyncio.ensure_future(t) for t in
                 (up.read_from(client_r), upstream(), down.write_to(client_w))]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = any(t.exception() for t in done)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        except asyncio.CancelledError:
            failed = True
            for t in tasks:
                t.cancel()
        for w in (client_w, upstream_w):
            if w is None:
                continue
            if failed:
                w.transport.abort()
            else:
                w.close()


async def start(listen: str, port: int, target: tuple[str, int], delay_s: float):
    relay = Relay(target, delay_s)
    server = await asyncio.start_server(relay.serve, listen, port, backlog=1024,
                                        reuse_address=True)
    return server, relay


async def run_relay(args) -> int:
    host, _, port = args.to.rpartition(":")
    server, _ = await start(args.listen, args.port, (host, int(port)), args.delay_ms / 1000)
    bound = server.sockets[0].getsockname()
    print(f"listening {bound[0]} {bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    return 0


# ----------------------------------------------------------------------------- self-test

async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"BANNER\n")            # like sshd: the server speaks first
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    writer.close()


async def timed_session(address: tuple[str, int], rounds: int, size: int) -> list[float]:
    """ms from connect() to the banner, then ms of each echo round trip of SIZE bytes."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(*address)
    await reader.readexactly(7)
    times = [(time.monotonic() - t0) * 1000]
    payload = b"x" * size
    for _ in range(rounds):
        t = time.monotonic()
        writer.write(payload)
        await reader.readexactly(size)
        times.append((time.monotonic() - t) * 1000)
    writer.close()
    return times


async def selftest(delay_ms: float, concurrent: int, nice: int) -> int:
    """The relay in its own process, as the benchmark runs it, in front of an echo server here.
    A check fails when a delay is shorter than asked, or more than half as long again."""
    echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = echo_server.sockets[0].getsockname()[:2]
    relay = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--listen", "127.0.0.1", "--to", f"{target[0]}:{target[1]}",
        "--delay-ms", str(delay_ms), "--nice", str(nice), stdout=asyncio.subprocess.PIPE)
    words = (await relay.stdout.readline()).decode().split()
    address = (words[1], int(words[2]))
    rtt = 2 * delay_ms
    checks = []

    def report(label: str, got: float, expect: float) -> None:
        ok = expect - 1 <= got <= expect * 1.5
        checks.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {label}: {got:.1f} ms (expected {expect:.0f} ms)")

    print(f"relay {delay_ms:g} ms each way; load average {os.getloadavg()[0]:.2f}")
    try:
        one = await timed_session(address, 5, 1)
        report("connect() to the server's first byte", one[0], 2 * rtt)
        report("echo of 1 byte, median of 5", statistics.median(one[1:]), rtt)
        big = await timed_session(address, 3, 1024 * 1024)
        report("echo of 1 MiB, median of 3", statistics.median(big[1:]), rtt)
        many = await asyncio.gather(*(timed_session(address, 3, 100) for _ in range(concurrent)))
        report(f"{concurrent} connections at once, median connect",
               statistics.median(m[0] for m in many), 2 * rtt)
        report(f"{concurrent} connections at once, median echo",
               statistics.median(x for m in many for x in m[1:]), rtt)
        report(f"{concurrent} connections at once, slowest echo", max(max(m[1:]) for m in many), rtt)
        await asyncio.sleep(4 * delay_ms / 1000)     # the closes travel the link too
    finally:
        relay.terminate()
        await relay.wait()
        echo_server.close()
    return 0 if all(checks) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: any free)")
    ap.add_argument("--to", help="HOST:PORT to relay to")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="delay each way (default 50)")
    ap.add_argument("--nice", type=int, default=0,
                    help="change the relay's priority by this much (negative: root only)")
    ap.add_argument("--selftest", action="store_true", help="measure the relay, then exit")
    ap.add_argument("--concurrent", type=int, default=100, help="connections in the self-test")
    args = ap.parse_args(argv)
    if args.delay_ms < 0:
        ap.error("--delay-ms must be ≥ 0")
    if args.selftest:
        return asyncio.run(selftest(args.delay_ms, args.concurrent, args.nice))
    if not args.to or ":" not in args.to:
        ap.error("--to HOST:PORT is required")
    socket.inet_aton(args.listen)   # an address, never a name to resolve
    if args.nice:
        os.nice(args.nice)
    return asyncio.run(run_relay(args))


if __name__ == "__main__":
    sys.exit(main())
