"""Frame header and activation codec: round trips and rejection of malformed input."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wansim.real import codec
from wansim.real.errors import RealConfigError
from wansim.real.frames import (
    HEADER_BYTES,
    ConnectionClosed,
    Frame,
    FrameError,
    Kind,
    array_frame,
    decode_header,
    recv_frame,
    send_frame,
)

pytestmark = pytest.mark.real


def _roundtrip(frame: Frame) -> Frame:
    raw = frame.to_bytes()
    return Frame(decode_header(raw[:HEADER_BYTES]), raw[HEADER_BYTES:])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.int64])
def test_raw_roundtrip_exact(dtype):
    arr = (np.arange(24).reshape(2, 3, 4) * 3 - 7).astype(dtype)
    back = _roundtrip(array_frame(Kind.HIDDEN, arr, step=5, pos=9))
    assert back.header.step == 5 and back.header.pos == 9
    np.testing.assert_array_equal(back.array(), arr)


@pytest.mark.parametrize(
    ("bits", "rel_err"), [(32, 0.0), (16, 1e-3), (8, 0.02), (4, 0.2), (3, 0.4)]
)
def test_activation_codec_error_and_size(bits, rel_err):
    x = np.random.default_rng(0).standard_normal((5, 200)).astype(np.float32) * 4
    f = codec.encode(Kind.HIDDEN, x, bits, group=64)
    y = codec.decode(_roundtrip(f))
    assert y.shape == x.shape and y.dtype == np.float32
    rms = np.sqrt(np.mean((x - y) ** 2)) / x.std()
    assert rms <= rel_err
    if bits < 16:  # packed codes + one fp16 scale per group of 64 (4 groups per row of 200)
        assert len(f.payload) == -(-x.size * bits // 8) + 2 * 5 * 4
    # quantization levels: at most 2^(bits-1)-1 magnitudes per group
    if bits in (3, 4):
        levels = np.unique(np.round(y[0, :64] / np.abs(y[0, :64]).max() * (2 ** (bits - 1) - 1)))
        assert len(levels) <= 2**bits - 1


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 70),
    bits=st.sampled_from([3, 4, 8]),
    group=st.integers(1, 80),
    scale=st.floats(1e-3, 1e3),
)
def test_quantized_roundtrip_bounded(rows, cols, bits, group, scale):
    x = (np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)) * scale).astype(
        np.float32
    )
    y = codec.decode(_roundtrip(codec.encode(Kind.HIDDEN, x, bits, group)))
    qmax = 2 ** (bits - 1) - 1
    # per value error <= half a step of its group's scale (plus fp16 rounding of the scale)
    g = -(-cols // group)
    pad = np.zeros((rows, g * group))
    pad[:, :cols] = np.abs(x)
    step = pad.reshape(rows, g, group).max(axis=2) / qmax
    bound = np.repeat(step, group, axis=1)[:, :cols] * 0.5 * 1.01 + 1e-6
    assert np.all(np.abs(x - y) <= bound + np.abs(x) * 2e-3)


def test_bad_bits_is_one_line_config_error():
    with pytest.raises(
        RealConfigError, match=r"activation_bits: must be one of \[32, 16, 8, 4, 3\], got 5"
    ):
        codec.encode(Kind.HIDDEN, np.zeros((1, 4), np.float32), 5)


def _header(frame: Frame) -> bytearray:
    return bytearray(frame.to_bytes()[:HEADER_BYTES])


def test_malformed_headers_rejected():
    f = array_frame(Kind.HIDDEN, np.zeros((2, 8), np.float32))
    h = _header(f)
    h[0] = ord("X")
    with pytest.raises(FrameError, match="bad magic"):
        decode_header(bytes(h))
    h = _header(f)
    h[20] ^= 1  # a shape byte: the checksum catches it
    with pytest.raises(FrameError, match="checksum"):
        decode_header(bytes(h))
    with pytest.raises(FrameError, match="truncated header"):
        decode_header(bytes(_header(f))[:30])


def _reheader(frame: Frame, **changes) -> bytes:
    """Re-encode a header with inconsistent fields (valid checksum), to test the semantic checks."""
    import dataclasses

    from wansim.real.frames import encode_header

    return encode_header(dataclasses.replace(frame.header, **changes))


def test_inconsistent_headers_rejected():
    f = array_frame(Kind.HIDDEN, np.zeros((2, 8), np.float32))
    with pytest.raises(FrameError, match="payload_len 10 != 64"):
        decode_header(_reheader(f, payload_len=10))
    with pytest.raises(FrameError, match=r"payload \d+ bytes > limit"):
        decode_header(_reheader(f, payload_len=1 << 40))
    q = codec.encode(Kind.HIDDEN, np.ones((2, 8), np.float32), 4, group=4)
    with pytest.raises(FrameError, match="bits 5"):
        decode_header(_reheader(q, bits=5))
    raw = bytearray(f.to_bytes()[:HEADER_BYTES])
    raw[4] = 99  # unknown kind, checksum recomputed
    import struct
    import zlib

    raw[-4:] = struct.pack("<I", zlib.crc32(bytes(raw[:-4])))
    with pytest.raises(FrameError, match="unknown frame kind 99"):
        decode_header(bytes(raw))


def test_out_of_range_codes_rejected():
    q = codec.encode(Kind.HIDDEN, np.ones((1, 8), np.float32), 3, group=8)
    bad = Frame(q.header, q.payload[:2] + b"\xff" * (len(q.payload) - 2))  # code 7 > 2*qmax
    with pytest.raises(FrameError, match="out of range"):
        codec.decode(bad)


def test_socket_truncation_and_clean_close():
    a, b = socket.socketpair()
    f = array_frame(Kind.HIDDEN, np.arange(64, dtype=np.float32))
    data = f.to_bytes()
    t = threading.Thread(
        target=lambda: (send_frame(a, f), a.sendall(data[: HEADER_BYTES + 10]), a.close())
    )
    t.start()
    got = recv_frame(b)
    np.testing.assert_array_equal(got.array(), np.arange(64, dtype=np.float32))
    assert got.header.send_ns > 0
    with pytest.raises(FrameError, match="truncated payload: connection closed after 10 of 256"):
        recv_frame(b)
    t.join()
    b.close()
    a, b = socket.socketpair()
    a.close()
    with pytest.raises(ConnectionClosed):
        recv_frame(b)
    b.close()
