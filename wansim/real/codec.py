"""Activation codec for the wire: raw fp32/fp16, or symmetric integer quantization.

Quantized (3/4/8 bits): the last axis is cut into groups of ``group`` values; each group gets one
fp16 scale ``s = absmax / qmax`` (``qmax = 2**(bits-1) - 1``, so 3 bits use levels -3..3) and
each value the code ``round(x / s)`` stored offset by ``qmax`` as an unsigned ``bits``-bit field,
bit-packed little-endian across the whole tensor. Payload = fp16 scales (row-major, one per
group) then the packed codes; the size matches ``wansim.links.wire_bytes.activation_bytes_per_token``.
Scales beyond fp16's range are clipped (values past them saturate). numpy only.
"""

from __future__ import annotations

import numpy as np

from wansim.real.errors import RealConfigError
from wansim.real.frames import (
    DType,
    Frame,
    FrameError,
    FrameHeader,
    Kind,
    array_frame,
    quant_payload_len,
)

ACTIVATION_BITS = (32, 16, 8, 4, 3)
FP16_MAX = 65504.0


def check_bits(bits: int, field: str = "activation_bits") -> int:
    """Validate an activation bit width."""
    if bits not in ACTIVATION_BITS:
        raise RealConfigError(field, f"must be one of {list(ACTIVATION_BITS)}", bits)
    return bits


def _pack(codes: np.ndarray, bits: int) -> bytes:
    if bits == 8:
        return codes.astype(np.uint8).tobytes()
    planes = (codes.astype(np.uint8)[:, None] >> np.arange(bits, dtype=np.uint8)) & 1
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def _unpack(buf: bytes, n: int, bits: int) -> np.ndarray:
    raw = np.frombuffer(buf, dtype=np.uint8)
    if bits == 8:
        return raw[:n]
    planes = np.unpackbits(raw, count=n * bits, bitorder="little").reshape(n, bits)
    return planes @ (1 << np.arange(bits, dtype=np.int64))


def _grouped(x: np.ndarray, group: int) -> tuple[np.ndarray, int]:
    """Reshape [..., last] to [rows, groups, group] (zero padded); return it and ``last``."""
    last = x.shape[-1]
    rows = x.reshape(-1, last)
    ngroups = -(-last // group)
    pad = ngroups * group - last
    if pad:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], pad), rows.dtype)], axis=1)
    return rows.reshape(rows.shape[0], ngroups, group), last


def quantize(x: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(fp16 scales [rows, groups], integer codes shaped like ``x``) for ``bits`` in 3/4/8."""
    qmax = 2 ** (bits - 1) - 1
    g, last = _grouped(np.asarray(x, dtype=np.float32), group)
    absmax = np.abs(g).max(axis=2)
    scale = np.minimum(absmax / qmax, FP16_MAX).astype(np.float16)
    s32 = scale.astype(np.float32)
    safe = np.where(s32 > 0, s32, 1.0)[:, :, None]
    codes = np.clip(np.rint(g / safe), -qmax, qmax).astype(np.int16)
    codes = codes.reshape(codes.shape[0], -1)[:, :last].reshape(x.shape)
    return scale, codes


def dequantize(scale: np.ndarray, codes: np.ndarray, group: int) -> np.ndarray:
    """Inverse of :func:`quantize` (float32, shaped like ``codes``)."""
    g, last = _grouped(codes.astype(np.float32), group)
    out = g * scale.astype(np.float32)[:, :, None]
    return out.reshape(out.shape[0], -1)[:, :last].reshape(codes.shape)


def encode(
    kind: Kind, x: np.ndarray, bits: int, group: int = 128, step: int = 0, pos: int = 0
) -> Frame:
    """A frame holding float activations ``x`` at ``bits`` (32: fp32, 16: fp16, 8/4/3: quantized)."""
    check_bits(bits)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if bits == 32:
        return array_frame(kind, x, step, pos)
    if bits == 16:
        return array_frame(kind, x.astype(np.float16), step, pos)
    if not 1 <= group <= 65535:
        raise RealConfigError("group_size", "must be in 1..65535", group)
    if x.ndim < 1 or x.size == 0:
        raise FrameError("quantized frame needs a non-empty tensor")
    qmax = 2 ** (bits - 1) - 1
    scale, codes = quantize(x, bits, group)
    payload = scale.astype("<f2").tobytes() + _pack((codes + qmax).reshape(-1), bits)
    expected = quant_payload_len(x.shape, bits, group)
    assert len(payload) == expected, (len(payload), expected)
    h = FrameHeader(kind, DType.QUANT, tuple(x.shape), len(payload), step, pos, bits, group)
    return Frame(h, payload)


def decode(frame: Frame) -> np.ndarray:
    """Float32 activations from a frame written by :func:`encode`."""
    h = frame.header
    if h.dtype in (DType.F32, DType.F16):
        return frame.array().astype(np.float32)
    if h.dtype != DType.QUANT:
        raise FrameError(f"activation frame with dtype {h.dtype.name}")
    shape = h.shape
    n = int(np.prod(shape))
    last = shape[-1]
    ngroups = (n // last) * -(-last // h.group) if last else 0
    scale = np.frombuffer(frame.payload[: 2 * ngroups], dtype="<f2").reshape(
        -1, -(-last // h.group)
    )
    qmax = 2 ** (h.bits - 1) - 1
    codes = _unpack(frame.payload[2 * ngroups :], n, h.bits).astype(np.int64) - qmax
    if codes.size and (codes.max() > qmax or codes.min() < -qmax):
        raise FrameError(f"quantized code out of range for {h.bits} bits")
    return dequantize(scale, codes.reshape(shape), h.group)
