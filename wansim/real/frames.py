"""Wire frames: a fixed 56-byte binary header followed by raw tensor bytes. Never pickle.

Header (little-endian, ``HEADER``)::

    magic 'WSF1' | kind u8 | dtype u8 | ndim u8 | bits u8 | step u32 | pos u32 | group u16 |
    request u16 | shape 4 x u32 | payload_len u64 | send_ns u64 | header_crc32 u32

``kind`` says what the frame is (activations, draft ids, draft probabilities, verdict, job
config, shutdown, error, a draft tree's shape); ``step`` is the verify step (or pass) it belongs to; ``request`` says which of the requests in flight a pass
belongs to (each stage keeps a KV cache per request); ``pos`` is the
absolute position of the pass's first token (every stage crops its KV cache to ``pos`` before
running the pass: that is the rollback); ``send_ns`` is the sender's ``time.monotonic_ns()``
(system-wide on Linux, so one-way delays are measurable across processes). ``payload_len`` must
equal what ``dtype``, ``shape`` (and ``bits``/``group`` for quantized tensors) imply; anything
else, a bad magic, a bad CRC or a short read is a :class:`FrameError`.

This module needs numpy only (the link relay parses frames without torch).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import socket
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = b"WSF1"
HEADER = struct.Struct("<4sBBBBIIHH4IQQI")
HEADER_BYTES = HEADER.size  # 56
MAX_PAYLOAD_BYTES = 1 << 30
MAX_NDIM = 4


class Kind(enum.IntEnum):
    """What a frame carries."""

    JOB = 1  # uint8 JSON: job settings, travels the pipeline in-band before a job's passes
    HIDDEN = 2  # activations of one pass (float32/float16 or quantized)
    DRAFT_IDS = 3  # int32 token ids of the pass (input ids for stage 0's pass, drafts to verify)
    DRAFT_PROBS = 4  # float32 [k, vocab]: the drafter's distributions (lossless sampling only)
    VERDICT = 5  # int32 [accepted, next_token]: last stage -> stage 0 over the return hop
    SHUTDOWN = 6  # empty: stop after forwarding
    ERROR = 7  # uint8 utf-8 message from a stage that failed
    TREE = 8  # int32 [n, m, parent_1..parent_{n-1}, keep_1..keep_m]: a tree pass's shape
    CANCEL = 9  # empty, ``step``: its request's last valid pass (later ones before it are stale)
    BATCH = 10  # int32 [m, 4]: a batched pass's blocks (request, pos, n_tokens, n_drafts)


class DType(enum.IntEnum):
    """Payload element types; Q* are the quantized codec (``wansim.real.codec``)."""

    F32 = 1
    F16 = 2
    I32 = 3
    U8 = 4
    I64 = 5
    QUANT = 8  # bits in the header's ``bits`` field, group size in ``group``


RAW_NUMPY = {
    DType.F32: np.dtype("<f4"),
    DType.F16: np.dtype("<f2"),
    DType.I32: np.dtype("<i4"),
    DType.U8: np.dtype("u1"),
    DType.I64: np.dtype("<i8"),
}
NUMPY_TO_DTYPE = {v: k for k, v in RAW_NUMPY.items()}
QUANT_BITS = (3, 4, 8)


class FrameError(Exception):
    """A malformed, truncated or unexpected frame; ``str()`` says what was wrong."""


class ConnectionClosed(FrameError):
    """The peer closed the connection cleanly between frames."""


@dataclass(frozen=True)
class FrameHeader:
    """A decoded, validated header."""

    kind: Kind
    dtype: DType
    shape: tuple[int, ...]
    payload_len: int
    step: int = 0
    pos: int = 0
    bits: int = 0
    group: int = 0
    send_ns: int = 0
    request: int = 0


def quant_payload_len(shape: tuple[int, ...], bits: int, group: int) -> int:
    """Bytes of a quantized tensor: fp16 scale per group of the last axis + packed codes."""
    n = math.prod(shape)
    last = shape[-1] if shape else 1
    rows = n // last if last else 0
    groups = rows * -(-last // group)
    return 2 * groups + -(-n * bits // 8)


def expected_payload_len(dtype: DType, shape: tuple[int, ...], bits: int, group: int) -> int:
    """Payload bytes implied by a header's dtype and shape."""
    if dtype == DType.QUANT:
        return quant_payload_len(shape, bits, group)
    return math.prod(shape) * RAW_NUMPY[dtype].itemsize


def encode_header(h: FrameHeader) -> bytes:
    """Pack a header (with its CRC)."""
    shape = list(h.shape) + [0] * (MAX_NDIM - len(h.shape))
    body = HEADER.pack(
        MAGIC,
        int(h.kind),
        int(h.dtype),
        len(h.shape),
        h.bits,
        h.step,
        h.pos,
        h.group,
        h.request,
        *shape,
        h.payload_len,
        h.send_ns,
        0,
    )[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def decode_header(buf: bytes) -> FrameHeader:
    """Unpack and validate a header; raise :class:`FrameError` naming the bad field."""
    if len(buf) != HEADER_BYTES:
        raise FrameError(f"truncated header: {len(buf)} of {HEADER_BYTES} bytes")
    magic, kind, dtype, ndim, bits, step, pos, group, req, s0, s1, s2, s3, plen, send_ns, crc = (
        HEADER.unpack(buf)
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (expected {MAGIC!r})")
    if zlib.crc32(buf[:-4]) != crc:
        raise FrameError("header checksum mismatch")
    try:
        kind = Kind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    try:
        dtype = DType(dtype)
    except ValueError:
        raise FrameError(f"unknown dtype code {dtype}") from None
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} > {MAX_NDIM}")
    dims = (s0, s1, s2, s3)
    if any(dims[ndim:]):
        raise FrameError(f"shape has nonzero entries beyond ndim {ndim}: {dims}")
    shape = tuple(dims[:ndim])
    if dtype == DType.QUANT:
        if bits not in QUANT_BITS:
            raise FrameError(f"quantized frame with bits {bits} (allowed {QUANT_BITS})")
        if group < 1:
            raise FrameError("quantized frame with group size 0")
        if not shape:
            raise FrameError("quantized frame needs ndim >= 1")
    elif bits or group:
        raise FrameError(f"raw {dtype.name} frame with bits={bits} group={group}")
    if plen > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload {plen} bytes > limit {MAX_PAYLOAD_BYTES}")
    want = expected_payload_len(dtype, shape, bits, group)
    if plen != want:
        raise FrameError(f"payload_len {plen} != {want} implied by {dtype.name}{list(shape)}")
    return FrameHeader(kind, dtype, shape, plen, step, pos, bits, group, send_ns, req)


@dataclass(frozen=True)
class Frame:
    """A header and its payload bytes."""

    header: FrameHeader
    payload: bytes

    @property
    def kind(self) -> Kind:
        return self.header.kind

    def array(self) -> np.ndarray:
        """The payload as a numpy array (raw dtypes only; quantized: use ``codec.decode``)."""
        h = self.header
        if h.dtype == DType.QUANT:
            raise FrameError("quantized payload: decode it with wansim.real.codec")
        return np.frombuffer(self.payload, dtype=RAW_NUMPY[h.dtype]).reshape(h.shape)

    def to_bytes(self) -> bytes:
        return encode_header(self.header) + self.payload

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + len(self.payload)


def array_frame(kind: Kind, arr: np.ndarray, step: int = 0, pos: int = 0) -> Frame:
    """A raw frame holding a numpy array (float32/float16/int32/uint8/int64)."""
    arr = np.ascontiguousarray(arr)
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    if dt not in NUMPY_TO_DTYPE:
        raise FrameError(f"unsupported array dtype {arr.dtype}")
    if arr.ndim > MAX_NDIM:
        raise FrameError(f"ndim {arr.ndim} > {MAX_NDIM}")
    payload = arr.astype(dt, copy=False).tobytes()
    h = FrameHeader(kind, NUMPY_TO_DTYPE[dt], tuple(arr.shape), len(payload), step, pos)
    return Frame(h, payload)


def with_request(frame: Frame, request: int) -> Frame:
    """The same frame tagged with ``request`` (0..65535)."""
    if not 0 <= request <= 0xFFFF:
        raise FrameError(f"request id {request} outside 0..65535")
    return Frame(dataclasses.replace(frame.header, request=request), frame.payload)


def message_frame(kind: Kind, text: str, step: int = 0) -> Frame:
    """A frame carrying UTF-8 text (JOB settings as JSON, ERROR messages)."""
    return array_frame(kind, np.frombuffer(text.encode(), dtype=np.uint8), step)


def frame_text(frame: Frame) -> str:
    return frame.payload.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- blocking sockets
def send_frame(sock: socket.socket, frame: Frame) -> int:
    """Stamp ``send_ns`` and send; returns bytes sent."""
    h = frame.header
    stamped = FrameHeader(
        h.kind,
        h.dtype,
        h.shape,
        h.payload_len,
        h.step,
        h.pos,
        h.bits,
        h.group,
        time.monotonic_ns(),
        h.request,
    )
    data = encode_header(stamped) + frame.payload
    sock.sendall(data)
    return len(data)


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    chunks = []
    got = 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if got == 0 and what == "header":
                raise ConnectionClosed("connection closed")
            raise FrameError(f"truncated {what}: connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> Frame:
    """Read one frame (blocking; the socket's timeout applies)."""
    header = decode_header(_recv_exact(sock, HEADER_BYTES, "header"))
    payload = _recv_exact(sock, header.payload_len, "payload") if header.payload_len else b""
    return Frame(header, payload)


# ----------------------------------------------------------------------------- tree passes
def tree_frame(parents: list[int], keep: list[int], step: int = 0, pos: int = 0) -> Frame:
    """A ``TREE`` frame: the pass's node parents (node 0 the root, ``parents[0] == -1`` not
    sent) and ``keep``: the previous tree pass's nodes to keep in the KV cache (its root and
    accepted path; empty when the previous pass was not a tree)."""
    n = len(parents)
    arr = np.array([n, len(keep), *parents[1:], *keep], dtype=np.int32)
    return array_frame(Kind.TREE, arr, step, pos)


BATCHED_POS = 0xFFFFFFFF  # header ``pos`` of a batched pass (each block has its own, in BATCH)


def batch_frame(blocks: list[tuple[int, int, int, int]], step: int) -> Frame:
    """A ``BATCH`` frame: the blocks of a batched pass in row order, ``(request, pos, n_tokens,
    n_drafts)`` each (the activation rows and the draft ids are packed in that order)."""
    arr = np.array(blocks, dtype=np.int32).reshape(len(blocks), 4)
    return array_frame(Kind.BATCH, arr, step, 0)


def read_batch(frame: Frame) -> list[tuple[int, int, int, int]]:
    """The blocks of a ``BATCH`` frame; checks the shape and the values."""
    a = frame.array()
    if a.ndim != 2 or a.shape[1] != 4 or a.shape[0] < 1:
        raise FrameError(f"malformed batch frame of shape {list(a.shape)}")
    blocks = [tuple(int(v) for v in row) for row in a]
    for r, pos, n, k in blocks:
        if r < 0 or pos < 0 or n < 1 or not 0 <= k <= n - 1:
            raise FrameError(f"batch frame: bad block (request {r}, pos {pos}, n {n}, drafts {k})")
    if len({b[0] for b in blocks}) != len(blocks):
        raise FrameError("batch frame: a request appears twice")
    return blocks


def read_tree(frame: Frame) -> tuple[list[int], list[int]]:
    """(parents with the root's -1 first, keep) from a ``TREE`` frame; checks the shape."""
    a = frame.array().astype(int).tolist()
    if len(a) < 2 or a[0] < 1 or a[1] < 0 or len(a) != 2 + a[0] - 1 + a[1]:
        raise FrameError(f"malformed tree frame of {len(a)} values")
    n, m = a[0], a[1]
    parents = [-1, *a[2 : 2 + n - 1]]
    if any(not 0 <= parents[i] < i for i in range(1, n)):
        raise FrameError("tree frame: every node's parent must be an earlier node")
    return parents, a[2 + n - 1 : 2 + n - 1 + m]
