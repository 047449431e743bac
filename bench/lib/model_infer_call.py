#!/usr/bin/env python3
"""Writes one KServe v2 ModelInfer call, gRPC-framed, to the file named by
argv[1]: model "cv", an 8x8 RGB UINT8 frame as raw contents (the protobuf
wire format of inference.ModelInferRequest written out by hand, so the
benchmarks need no generated code). Used by bench/grpc_throughput.sh and
bench/router_allocs.sh as h2load's request body."""
import struct
import sys


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, payload):  # length-delimited
    return varint(num << 3 | 2) + varint(len(payload)) + payload


shape = b"".join(varint(d) for d in (8, 8, 3))
tensor = field(1, b"IMAGE") + field(2, b"UINT8") + field(3, shape)
msg = field(1, b"cv") + field(3, b"bench") + field(5, tensor) + field(7, bytes(range(192)))
with open(sys.argv[1], "wb") as f:
    f.write(b"\0" + struct.pack(">I", len(msg)) + msg)
