#!/usr/bin/env python3
"""An inference server that is not ours: the router's second test backend.

One process, Python's asyncio, the standard library only, and no code shared
with gpuha or gpuha-test-backend, so a result that holds only because the
router and its test backend were written together shows here. It serves the
KServe v2 health paths and answers every other path as an inference:

  GET /v2/health/ready, /v2/health/live   200 "ready" (always, even half-hung)
  anything else                           200 JSON {"backend", "path"}
                                          ?delay_ms=N answers after N ms

It behaves as common Python servers do (uvicorn's defaults): HTTP/1.1
keep-alive with pipelined requests answered in order, idle connections
closed after --idle-timeout seconds (uvicorn: 5) with a Keep-Alive: timeout
header saying so.

Faults, by signal, as an operator sees them:
  SIGUSR1  half-hang: the health paths keep answering 200; every inference
           request from now on is held, its connection open, never answered
           (a deadlocked engine). Requests already past admission (a slow one
           sleeping) still finish, as a real engine's last batch does.
  SIGUSR2  the half-hang ends; held requests are answered.
  SIGTERM  exits.

  bench/backends/asyncio_backend.py --port 19401 --name a
prints "backend NAME listening on 127.0.0.1:PORT" once it listens.
"""

import argparse
import asyncio
import json
import signal
import sys
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024


class Server:
    def __init__(self, name, idle_timeout):
        self.name = name
        self.idle_timeout = idle_timeout
        self.unstuck = asyncio.Event()
        self.unstuck.set()

    def set_stuck(self, on):
        if on:
            self.unstuck.clear()
        else:
            self.unstuck.set()

    async def handle(self, reader, writer):
        try:
            while True:
                try:
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), self.idle_timeout)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                    return  # idle past the timeout, or closed between requests
                except asyncio.LimitOverrunError:
                    await self.reply(writer, 431, b"head too large\n", close=True)
                    return
                request = self.parse(head)
                if request is None:
                    await self.reply(writer, 400, b"malformed request\n", close=True)
                    return
                method, target, version, headers = request
                body_len = headers.get("content-length", "0")
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    body = await self.read_chunked(reader)
                    if body is None:
                        await self.reply(writer, 400, b"bad chunked body\n", close=True)
                        return
                elif not body_len.isdigit() or int(body_len) > MAX_BODY:
                    await self.reply(writer, 400, b"bad content-length\n", close=True)
                    return
                elif int(body_len) > 0:
                    await reader.readexactly(int(body_len))
                close = (headers.get("connection", "").lower() == "close"
                         or version == "HTTP/1.0")
                await self.answer(writer, method, target, close)
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @staticmethod
    def parse(head):
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            return None
        if not version.startswith("HTTP/1."):
            return None
        headers = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                return None
            headers[name.strip().lower()] = value.strip()
        return method, target, version, headers

    @staticmethod
    async def read_chunked(reader):
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                return None
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent to us
                return bytes(body)
            if len(body) + size > MAX_BODY:
                return None
            body += await reader.readexactly(size)
            await reader.readexactly(2)

    async def answer(self, writer, method, target, close):
        url = urlsplit(target)
        if url.path in ("/v2/health/ready", "/v2/health/live"):
            await self.reply(writer, 200, b"ready\n", close=close)
            return
        # Inference: held while half-hung, the connection left open.
        await self.unstuck.wait()
        query = parse_qs(url.query)
        delay = query.get("delay_ms", ["0"])[0]
        if delay.isdigit() and int(delay) > 0:
            await asyncio.sleep(int(delay) / 1000)
        body = json.dumps({"backend": self.name, "path": url.path}).encode() + b"\n"
        await self.reply(writer, 200, body, close=close, json_body=True)

    async def reply(self, writer, status, body, close, json_body=False):
        reason = {200: "OK", 400: "Bad Request", 431: "Request Header Fields Too Large"}
        head = [f"HTTP/1.1 {status} {reason.get(status, 'Error')}",
                "Content-Type: " + ("application/json" if json_body else "text/plain"),
                f"Content-Length: {len(body)}",
                f"X-Backend: {self.name}"]
        if close:
            head.append("Connection: close")
        else:
            head.append(f"Keep-Alive: timeout={int(self.idle_timeout)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="py")
    ap.add_argument("--idle-timeout", type=float, default=5.0,
                    help="close keep-alive connections idle this long (s)")
    args = ap.parse_args()
    if not args.host.startswith("127."):
        sys.exit("asyncio_backend: --host must be a loopback address (127.0.0.0/8)")
    srv = Server(args.name, args.idle_timeout)
    server = await asyncio.start_server(srv.handle, args.host, args.port,
                                        limit=MAX_HEAD, backlog=4096, reuse_address=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, srv.set_stuck, True)
    loop.add_signal_handler(signal.SIGUSR2, srv.set_stuck, False)
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    port = server.sockets[0].getsockname()[1]
    print(f"backend {args.name} listening on {args.host}:{port}", flush=True)
    async with server:
        await done.wait()


if __name__ == "__main__":
    asyncio.run(main())
