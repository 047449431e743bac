#!/usr/bin/env python3
"""Hostile clients for bench/hostile_floods.sh, HTTP/2 by hand (RFC 9113) so
that each says what no client library would, and a UDP flooder.

  floods.py window-shut PORT CONNS SECONDS   gRPC ModelStreamInfer calls that
      keep their receive window at 0 (SETTINGS_INITIAL_WINDOW_SIZE 0) and send
      small messages as fast as the router's window for them lets them.
  floods.py ping-holder PORT CONNS SECONDS   unary ModelInfer calls that send
      their body up to the router's window and never end it, with a PING every
      100 ms; says how long each connection lasted.
  floods.py sniff PORT                       the session number of the first
      heartbeat datagram sent to PORT on loopback (root: a packet socket).
  floods.py udp PORT SECONDS SESSION_HEX     1,400-byte datagrams carrying a
      real session number and a random MAC, as fast as one core sends them.

Each prints one JSON line of counts. Only the standard library.
"""
import json
import os
import select
import socket
import struct
import sys
import time

DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8
END_STREAM, END_HEADERS = 1, 4


def frame(kind, flags, stream, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def literal(name, value):  # HPACK literal without indexing, new name
    def hint(v, bits):
        top = (1 << bits) - 1
        if v < top:
            return bytes([v])
        out, v = bytearray([top]), v - top
        while v >= 128:
            out.append(v % 128 + 128)
            v //= 128
        return bytes(out + bytes([v]))
    return b"\x00" + hint(len(name), 7) + name + hint(len(value), 7) + value


def grpc_headers(method):
    block = b""
    for n, v in ((b":method", b"POST"), (b":scheme", b"http"),
                 (b":path", b"/inference.GRPCInferenceService/" + method),
                 (b":authority", b"r"), (b"content-type", b"application/grpc"),
                 (b"te", b"trailers"), (b"x-api-key", b"k1"), (b"x-gpuha-stream", b"cam-0")):
        block += literal(n, v)
    return block


class Conn:
    """One attacker connection; tracks the router's windows for what it sends."""

    def __init__(self, port, settings=b""):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setblocking(False)
        self.inbuf = b""
        self.conn_window = 65535
        self.initial_window = 65535  # until the router's SETTINGS_INITIAL_WINDOW_SIZE
        self.windows = {}  # stream -> what the router lets it send
        self.closed = False
        self.goaway = None
        self.out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0, settings)

    def pump(self, wait=0.0):
        """Writes what is queued, reads and parses what came; False once closed."""
        if self.closed:
            return False
        r, w, _ = select.select([self.s], [self.s] if self.out else [], [], wait)
        if w:
            try:
                n = self.s.send(self.out)
                self.out = self.out[n:]
            except BlockingIOError:
                pass
            except OSError:
                self.closed = True
        if r:
            try:
                data = self.s.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":
                self.closed = True
            elif data:
                self.inbuf += data
                self.parse()
        return not self.closed

    def parse(self):
        while len(self.inbuf) >= 9:
            n = (self.inbuf[0] << 16) | (self.inbuf[1] << 8) | self.inbuf[2]
            if len(self.inbuf) < 9 + n:
                return
            kind, flags = self.inbuf[3], self.inbuf[4]
            stream = struct.unpack(">I", self.inbuf[5:9])[0] & 0x7FFFFFFF
            payload = self.inbuf[9:9 + n]
            self.inbuf = self.inbuf[9 + n:]
            if kind == SETTINGS and not flags & 1:
                for i in range(0, len(payload) - 5, 6):
                    ident, value = struct.unpack(">HI", payload[i:i + 6])
                    if ident == 4:
                        for k in self.windows:
                            self.windows[k] += value - self.initial_window
                        self.initial_window = value
                self.out += frame(SETTINGS, 1, 0)  # ACK
            elif kind == WINDOW_UPDATE and len(payload) == 4:
                inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                if stream == 0:
                    self.conn_window += inc
                else:
                    self.windows[stream] = self.window(stream) + inc
            elif kind == GOAWAY and len(payload) >= 8:
                self.goaway = struct.unpack(">I", payload[4:8])[0]

    def window(self, stream):
        return self.windows.setdefault(stream, self.initial_window)

    def send_data(self, payload, stream=1):
        """Queues DATA within the windows; False when they are shut."""
        if len(payload) > min(self.conn_window, self.window(stream)) or len(self.out) > 1 << 16:
            return False
        self.conn_window -= len(payload)
        self.windows[stream] -= len(payload)
        self.out += frame(DATA, 0, stream, payload)
        return True


def window_shut(port, conns, seconds):
    # SETTINGS_INITIAL_WINDOW_SIZE 0: the router may send it nothing.
    cs = [Conn(port, struct.pack(">HI", 4, 0)) for _ in range(conns)]
    for c in cs:
        c.out += frame(HEADERS, END_HEADERS, 1, grpc_headers(b"ModelStreamInfer"))
    message = b"\x00\x00\x00\x00\x00"  # one empty ModelInferRequest
    sent = [0] * conns
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, c in enumerate(cs):
            for _ in range(256):
                if not c.send_data(message):
                    break
                sent[i] += 1
            c.pump(0.001)
    print(json.dumps({"flood": "window-shut", "connections": conns, "seconds": seconds,
                      "messages_sent": sum(sent),
                      "connections_ended": sum(c.closed for c in cs)}))


def ping_holder(port, conns, seconds):
    streams = range(1, 33, 2)  # 16 calls a connection
    message = (1 << 20) - 64  # each says this many bytes and sends 5 fewer
    cs = [Conn(port) for _ in range(conns)]
    opened = time.monotonic()
    ended_after = [None] * conns
    for c in cs:
        for sid in streams:
            c.out += frame(HEADERS, END_HEADERS, sid, grpc_headers(b"ModelInfer"))
    sent = [{sid: 0 for sid in streams} for _ in cs]
    next_ping = 0.0
    end = opened + seconds
    while time.monotonic() < end and not all(c.closed for c in cs):
        now = time.monotonic()
        for i, c in enumerate(cs):
            if c.closed:
                if ended_after[i] is None:
                    ended_after[i] = now - opened
                continue
            for sid in streams:
                while sent[i][sid] < message:
                    n = min(16384, message - sent[i][sid])
                    head = struct.pack(">BI", 0, message) if sent[i][sid] == 0 else b""
                    if not c.send_data(head + b"x" * (n - len(head)), sid):
                        break
                    sent[i][sid] += n
            if now >= next_ping:
                c.out += frame(PING, 0, 0, b"12345678")
            c.pump(0.001)
        if now >= next_ping:
            next_ping = now + 0.1
    for i, c in enumerate(cs):  # the last to close ended the loop before it was noted
        if c.closed and ended_after[i] is None:
            ended_after[i] = time.monotonic() - opened
    done = [e for e in ended_after if e is not None]
    print(json.dumps({"flood": "ping-holder", "connections": conns, "calls": conns * len(streams),
                      "seconds": seconds, "body_bytes_sent": sum(sum(x.values()) for x in sent),
                      "connections_ended": len(done),
                      "ended_after_s_max": round(max(done), 2) if done else None}))


def udp(port, seconds, session_hex):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    head = b"GHB1" + bytes.fromhex(session_hex)
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(256):
            s.sendto(head + os.urandom(32) + b"\x00" * (1400 - 44), ("127.0.0.1", port))
        sent += 256
    print(json.dumps({"flood": "udp", "seconds": seconds, "datagrams_sent": sent}))


def sniff(port):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind(("lo", 0))
    s.settimeout(10)
    while True:
        pkt = s.recv(65535)[14:]  # past the Ethernet header loopback carries
        if len(pkt) < 28 or pkt[0] >> 4 != 4 or pkt[9] != 17:
            continue
        udp_at = (pkt[0] & 0xF) * 4
        dport = struct.unpack(">H", pkt[udp_at + 2:udp_at + 4])[0]
        body = pkt[udp_at + 8:]
        if dport == port and body[:4] == b"GHB1":
            print(body[4:12].hex())
            return


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "window-shut":
        window_shut(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    elif what == "ping-holder":
        ping_holder(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    elif what == "sniff":
        sniff(int(sys.argv[2]))
    elif what == "udp":
        udp(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(__doc__)
