#!/usr/bin/python3
"""Independent reference tables for the FP8 formats of train_gpt (llmc/precision/fp8.h).

Run with Debian's python3:   /usr/bin/python3 dev/reference/make_fp8_tables.py
It writes test/data/fp8_tables.json (deterministic: the same bytes on every run), which
test/test_fp8.cpp checks the C++ encoder/decoder against.

The formats, defined here from their bit fields with exact rational arithmetic (fractions):
  E4M3 ("E4M3FN", OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
       S.1111.111 is NaN; max finite 448; smallest subnormal 2^-9.
  E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: exponent 31 is inf (mantissa 0)
       or NaN; max finite 57344; smallest subnormal 2^-16.
Encoding (float32 -> code), as NVIDIA's cvt with .satfinite does it:
  - NaN -> 0x7F (whatever the input's sign);
  - |x| > max (finite or inf) -> +-max (saturation);
  - otherwise the representable value nearest to |x|, ties to the even code (mantissa LSB 0),
    with x's sign bit (so -0.0 and tiny negatives give 0x80).

The expected encodings come from an exhaustive search over the representable values (no bit
tricks), so they share nothing with the C++ code. Cross-checks, each where available:
  - E5M2 decoding against numpy's IEEE half (E5M2 is the top byte of a binary16);
  - both formats, every table input, against NVIDIA's own host implementation of the
    conversion (__nv_cvt_float_to_fp8 / __nv_cvt_fp8_to_halfraw in cuda_fp8.h), compiled
    with g++ when the CUDA toolkit's headers are present;
  - torch.float8_e4m3fn / float8_e5m2 when this torch has them (Debian's 1.13 does not;
    torch casts overflow to NaN, so only in-range inputs are compared).

Table layout:
  {"e4m3": {"max": 448, "decode": [256 values], "encode": [{"bits": "0x...", "x": "...", "code": n,
            "why": "..."}, ...]}, "e5m2": {...}}
  decode values are exact decimals (JSON numbers), or the strings "nan", "inf", "-inf";
  encode inputs are float32 bit patterns (exact for NaN, -0.0, inf, denormals) with a
  readable "x" and the reason the case is there.
"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

FORMATS = {
    # name: (exponent bits, mantissa bits, bias, has_inf)
    "e4m3": (4, 3, 7, False),
    "e5m2": (5, 2, 15, True),
}


def decode_code(fmt, code):
    """Value of a code: a Fraction, or 'nan' / 'inf' / '-inf'."""
    ebits, mbits, bias, has_inf = FORMATS[fmt]
    sign = -1 if code & 0x80 else 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    emax_field = (1 << ebits) - 1
    if has_inf and e == emax_field:
        if m == 0:
            return "inf" if sign > 0 else "-inf"
        return "nan"
    if not has_inf and e == emax_field and m == (1 << mbits) - 1:
        return "nan"
    if e == 0:  # subnormal: m * 2^(1 - bias - mbits)
        mag = Fraction(m) * Fraction(2) ** (1 - bias - mbits)
    else:
        mag = Fraction((1 << mbits) + m) * Fraction(2) ** (e - bias - mbits)
    return sign * mag


def finite_positive_codes(fmt):
    """[(value, code)] of all non-negative finite codes, sorted by value."""
    out = []
    for code in range(0x80):
        v = decode_code(fmt, code)
        if isinstance(v, Fraction):
            out.append((v, code))
    out.sort()
    return out


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def is_f32(x):
    """True if the Python float x is exactly a float32."""
    return math.isnan(x) or bits_f32(f32_bits(x)) == x


def encode_reference(fmt, bits):
    """Expected code for the float32 with these bits (exhaustive nearest search)."""
    x = bits_f32(bits)
    if math.isnan(x):
        return 0x7F
    negative = bool(bits & 0x80000000)
    table = finite_positive_codes(fmt)
    vmax, cmax = table[-1]
    if math.isinf(x):
        mag_code = cmax
    else:
        ax = abs(Fraction(x))
        if ax > vmax:
            mag_code = cmax
        else:
            best = None
            for v, c in table:
                d = abs(v - ax)
                # strictly nearer wins; on a tie the even code wins
                if best is None or d < best[0] or (d == best[0] and c % 2 == 0 and best[1] % 2 == 1):
                    best = (d, c)
            mag_code = best[1]
    return mag_code | (0x80 if negative else 0)


def next_up(x):
    """Next float32 above x (x finite, >= 0)."""
    return bits_f32(f32_bits(x) + 1)


def next_down(x):
    """Next float32 below x (x > 0)."""
    return bits_f32(f32_bits(x) - 1)


def encode_inputs(fmt, rng):
    """[(float32 bits, why)] exercising every rounding boundary of the format."""
    cases = []

    def add(x, why, negative_too=True):
        assert is_f32(x), (x, why)
        cases.append((f32_bits(x), why))
        if negative_too and not math.isnan(x):
            cases.append((f32_bits(-x), "negative " + why))

    table = finite_positive_codes(fmt)
    vmax = float(table[-1][0])
    for v, c in table:
        add(float(v), "representable value (code 0x%02x)" % c)
    for (a, ca), (b, cb) in zip(table, table[1:]):
        mid = float((a + b) / 2)  # exact: one more bit than the format has
        add(mid, "midpoint of 0x%02x and 0x%02x (tie to even)" % (ca, cb))
        add(next_down(mid), "just below the midpoint of 0x%02x and 0x%02x" % (ca, cb))
        add(next_up(mid), "just above the midpoint of 0x%02x and 0x%02x" % (ca, cb))
    smallest = float(table[1][0])
    add(smallest / 4, "a quarter of the smallest subnormal (-> 0)")
    add(bits_f32(1), "smallest float32 denormal (-> 0)")
    add(bits_f32(0x00100000), "float32 denormal (-> 0)")
    ulp_max = float(table[-1][0] - table[-2][0])
    add(vmax + ulp_max / 2, "max + half an ulp (would round up: saturates)")
    add(next_down(vmax + ulp_max / 2), "just below max + half an ulp")
    add(vmax + ulp_max, "max + one ulp (saturates)")
    add(vmax * 2, "twice max (saturates)")
    add(bits_f32(f32_bits(1e30)), "about 1e30 (saturates)")
    add(bits_f32(0x7F7FFFFF), "largest float32 (saturates)")
    add(float("inf"), "infinity (saturates to max)")
    add(float("nan"), "NaN", negative_too=False)
    cases.append((0xFFC00000, "negative quiet NaN"))
    cases.append((0x7F800001, "signalling NaN"))
    # random values over the whole dynamic range and beyond, both signs
    lo = math.log2(smallest) - 3
    hi = math.log2(vmax) + 3
    for _ in range(300):
        x = bits_f32(f32_bits(2.0 ** rng.uniform(lo, hi)))
        add(x, "random", negative_too=rng.random() < 0.5)
    return cases


def fmt_value(v):
    if isinstance(v, str):
        return v
    f = float(v)
    assert Fraction(f) == v
    return int(f) if f == int(f) and abs(f) < 2**53 else f


def build():
    rng = random.Random(20240807)
    out = {}
    for fmt in FORMATS:
        decode = [fmt_value(decode_code(fmt, c)) for c in range(256)]
        encode = []
        for bits, why in encode_inputs(fmt, rng):
            encode.append({"bits": "0x%08x" % bits, "x": repr(bits_f32(bits)), "code": encode_reference(fmt, bits),
                           "why": why})
        vmax = finite_positive_codes(fmt)[-1][0]
        out[fmt] = {"max": fmt_value(vmax), "decode": decode, "encode": encode}
    return out


# ---- cross-checks ----------------------------------------------------------------------

def decode_as_float(v):
    return float(v) if not isinstance(v, str) else float(v)


def check_numpy_e5m2(tables):
    import numpy as np
    for code in range(256):
        h = np.array([code << 8], dtype=np.uint16).view(np.float16)[0]
        want = tables["e5m2"]["decode"][code]
        got = float(h)
        if isinstance(want, str) and want == "nan":
            assert math.isnan(got), code
        else:
            assert got == decode_as_float(want), (code, got, want)
    print("numpy float16: E5M2 decoding of all 256 codes agrees")


NVIDIA_HELPER = r"""
#include <cuda_fp8.h>
#include <cstdio>
#include <cstring>
// stdin: lines "d <code>" or "e <float32 bits hex>"; stdout: e4m3 and e5m2 results.
int main() {
    char op;
    unsigned v;
    while (std::scanf(" %c %x", &op, &v) == 2) {
        if (op == 'd') {
            __half_raw a = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
            __half_raw b = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E5M2);
            std::printf("%04x %04x\n", (unsigned)a.x, (unsigned)b.x);
        } else {
            float f;
            std::memcpy(&f, &v, 4);
            std::printf("%02x %02x\n", (unsigned)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3),
                        (unsigned)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2));
        }
    }
    return 0;
}
"""


def half_bits_to_float(h):
    import numpy as np
    return float(np.array([h], dtype=np.uint16).view(np.float16)[0])


def check_nvidia(tables):
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    header = os.path.join(cuda, "include", "cuda_fp8.h")
    cxx = shutil.which("g++")
    if not (os.path.exists(header) and cxx):
        print("NVIDIA host conversion: skipped (no %s or no g++)" % header)
        return
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "fp8_nv.cpp"), os.path.join(tmp, "fp8_nv")
        with open(src, "w") as f:
            f.write(NVIDIA_HELPER)
        subprocess.run([cxx, "-O1", "-I" + os.path.join(cuda, "include"), src, "-o", exe], check=True)
        lines = ["d %x" % c for c in range(256)]
        inputs = {}
        for fmt in FORMATS:
            for e in tables[fmt]["encode"]:
                inputs[e["bits"]] = True
        bits_list = sorted(inputs)
        lines += ["e %s" % b[2:] for b in bits_list]
        res = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        rows = res.stdout.split("\n")
    for code in range(256):
        a, b = rows[code].split()
        for fmt, h in (("e4m3", a), ("e5m2", b)):
            got = half_bits_to_float(int(h, 16))
            want = tables[fmt]["decode"][code]
            if want == "nan":
                assert math.isnan(got), (fmt, code, got)
            else:
                assert got == decode_as_float(want), (fmt, code, got, want)
    nv = {}
    for i, bits in enumerate(bits_list):
        a, b = rows[256 + i].split()
        nv[bits] = {"e4m3": int(a, 16), "e5m2": int(b, 16)}
    n = 0
    for fmt in FORMATS:
        for e in tables[fmt]["encode"]:
            assert nv[e["bits"]][fmt] == e["code"], (fmt, e, nv[e["bits"]][fmt])
            n += 1
    print("NVIDIA cuda_fp8.h host conversion: all 512 decodings and %d encodings agree" % n)


def check_torch(tables):
    try:
        import torch
    except ImportError:
        print("torch: not installed, skipped")
        return
    dts = {"e4m3": getattr(torch, "float8_e4m3fn", None), "e5m2": getattr(torch, "float8_e5m2", None)}
    if None in dts.values():
        print("torch %s: has no float8 dtypes, skipped" % torch.__version__)
        return
    for fmt, dt in dts.items():
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float().tolist()
        for c, got in enumerate(codes):
            want = tables[fmt]["decode"][c]
            assert (math.isnan(got) if want == "nan" else got == decode_as_float(want)), (fmt, c, got, want)
        vmax = float(tables[fmt]["max"])
        for e in tables[fmt]["encode"]:
            x = bits_f32(int(e["bits"], 16))
            if math.isnan(x) or abs(x) > vmax:
                continue  # torch does not saturate
            got = torch.tensor([x], dtype=torch.float32).to(dt).view(torch.uint8).item()
            assert got == e["code"], (fmt, e, got)
    print("torch %s: float8 decoding and in-range encodings agree" % torch.__version__)


def to_json(tables):
    """One decode table per line, one encode case per line (diffable, still plain JSON)."""
    parts = []
    for fmt in sorted(tables):
        t = tables[fmt]
        cases = ",\n".join(json.dumps(e, sort_keys=True) for e in t["encode"])
        parts.append('"%s": {\n"max": %s,\n"decode": %s,\n"encode": [\n%s\n]}' %
                     (fmt, json.dumps(t["max"]), json.dumps(t["decode"]), cases))
    text = "{\n" + ",\n".join(parts) + "\n}\n"
    assert json.loads(text) == tables
    return text


def main():
    tables = build()
    check_numpy_e5m2(tables)
    check_nvidia(tables)
    check_torch(tables)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "test", "data", "fp8_tables.json")
    with open(path, "w") as f:
        f.write(to_json(tables))
    print("wrote %s (%d + %d encode cases)" % (path, len(tables["e4m3"]["encode"]), len(tables["e5m2"]["encode"])))


if __name__ == "__main__":
    sys.exit(main())
