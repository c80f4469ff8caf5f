#!/usr/bin/env python3
"""Cross-tool check of `fp4moe quantize` (CTest, label cpu).

1. Writes a BF16/F16/F32 safetensors file with Python's `safetensors` package. NumPy has no
   bfloat16, so the BF16 tensors are built as raw uint16 bits and handed to safetensors'
   low-level `serialize_file` with dtype "bfloat16" (no torch needed).
2. Runs `fp4moe quantize IN OUT`.
3. Reads OUT back with Python's safetensors (`safe_open` for names and metadata, `deserialize`
   for the raw bytes of every tensor).
4. Compares every byte with an independent NumPy implementation of NVIDIA ModelOpt's NVFP4
   weight recipe (NVFP4QTensor), written here from its definition:
     weight_scale_2 = amax / (6 * 448)                        fp32; gate/up: the larger amax
     block_scale    = block_amax / (6 * weight_scale_2)        fp32; exactly 0 -> 1.0; -> E4M3 (RNE)
     scaled         = x / (float(e4m3 scale) * weight_scale_2)  fp32 true division
     code           = (scaled < 0) << 3 | e2m1 index of |scaled| (bounds 0.25 .. 5, ties to even)
     packing        = element 2j in the low nibble of byte j
Usage: test_cross_tool.py PATH_TO_FP4MOE
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors import safe_open

F32 = np.float32


def bf16_bits(x):
    """float32 array -> bfloat16 bits (uint16), round to nearest even."""
    u = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(F32)


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (safetensors dtype name, numpy array holding the raw elements)."""
    keep = []
    spec_type = getattr(safetensors, "TensorSpec", None)
    specs = {}
    for name, (dtype, arr) in tensors.items():
        arr = np.ascontiguousarray(arr)
        keep.append(arr)
        if spec_type is not None:  # safetensors >= 0.7
            specs[name] = spec_type(dtype=dtype, shape=list(arr.shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
        else:
            specs[name] = {"dtype": dtype, "shape": list(arr.shape), "data": arr.tobytes()}
    safetensors.serialize_file(specs, path, metadata=metadata)


# ---- the ModelOpt NVFP4 recipe, independently -------------------------------------------------

def e4m3_table():
    vals = []
    for c in range(0x7F):  # positive finite codes; 0x7F is NaN
        e, m = c >> 3, c & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


E4M3 = e4m3_table()
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float64)


def to_e4m3(v):
    """Non-negative float32 values -> E4M3 codes, nearest, ties to the even code, saturating."""
    v = v.astype(np.float64)
    hi = np.clip(np.searchsorted(E4M3, v, side="left"), 1, len(E4M3) - 1)
    lo = hi - 1
    d_lo, d_hi = v - E4M3[lo], E4M3[hi] - v
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(v >= E4M3[-1], len(E4M3) - 1, code)
    return code.astype(np.uint8)


def cast_e2m1(scaled):
    a = np.abs(scaled).astype(np.float64)
    ordinal = np.searchsorted(E2M1_BOUNDS, a, side="left")  # bounds strictly below a
    ties_up = np.isin(a, E2M1_BOUNDS[[1, 3, 5]])  # 0.75, 1.75, 3.5 round up to the even code
    return ((scaled < 0).astype(np.uint8) << 3) | (ordinal + ties_up).astype(np.uint8)


def modelopt_nvfp4(x, amax):
    """x: float32 [N, K]; amax: the (possibly shared) fp32 amax. -> packed, scale codes, ws2."""
    ws2 = F32(amax) / F32(6.0 * 448.0)
    n, k = x.shape
    blocks = x.reshape(n, k // 16, 16)
    block_amax = np.abs(blocks).max(axis=-1).astype(F32)
    scale = block_amax / (F32(6.0) * ws2)
    scale = np.where(scale == 0, F32(1.0), scale).astype(F32)
    codes = to_e4m3(scale)
    denom = (E4M3[codes].astype(F32) * ws2).astype(F32)
    scaled = (blocks / denom[..., None]).astype(F32)
    q = cast_e2m1(scaled).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed.tobytes(), codes.tobytes(), struct.pack("<f", ws2)


# ---- the test ---------------------------------------------------------------------------------

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at byte {i}: fp4moe 0x{x:02x}, reference 0x{y:02x}"
    return f"lengths differ: fp4moe {len(a)}, reference {len(b)}"


def main():
    fp4moe = sys.argv[1]
    rng = np.random.default_rng(1234)
    p = "model.layers.0.mlp.experts.0."
    f32_values = {}
    tensors = {}

    def add_bf16(name, values):
        bits = bf16_bits(values)
        tensors[name] = ("bfloat16", bits)
        f32_values[name] = bf16_to_f32(bits)

    add_bf16(p + "gate_proj.weight", rng.standard_normal((64, 128)) * 0.02)
    add_bf16(p + "up_proj.weight", rng.standard_normal((64, 128)) * 0.05)  # the larger amax: shared scale
    down = rng.standard_normal((128, 64)) * 0.03
    down[5, 16:32] = 0.0  # an all-zero block: its scale becomes 1.0
    down[7, 0:16] = -1e-4  # small negatives that round to zero: ModelOpt keeps their sign (-0)
    down[7, 3] = 0.05
    add_bf16(p + "down_proj.weight", down)
    # Exact E2M1 ties and saturation: amax 2688 gives weight_scale_2 = 1 and block scale 448.
    ties = np.array([112, 336, 560, 784, 1120, 1568, 2240, 2688, -112, -336, -560, -784, -1120, -1568, -2240, -50],
                    dtype=F32)
    add_bf16("model.layers.0.self_attn.o_proj.weight", np.tile(ties, (4, 2)))
    f32 = (rng.standard_normal((32, 64)) * 0.1).astype(F32)
    tensors["model.layers.0.self_attn.q_proj.weight"] = ("float32", f32)
    f32_values["model.layers.0.self_attn.q_proj.weight"] = f32
    f16 = (rng.standard_normal((16, 32)) * 0.1).astype(np.float16)
    tensors["model.layers.0.self_attn.k_proj.weight"] = ("float16", f16)
    f32_values["model.layers.0.self_attn.k_proj.weight"] = f16.astype(F32)
    copied = {
        "model.layers.0.mlp.gate.weight": ("bfloat16", bf16_bits(rng.standard_normal((4, 128)))),  # router
        "lm_head.weight": ("bfloat16", bf16_bits(rng.standard_normal((16, 128)))),
        "model.norm.weight": ("bfloat16", bf16_bits(np.ones(128))),  # 1-D
        "model.layers.0.odd.weight": ("bfloat16", bf16_bits(rng.standard_normal((8, 24)))),  # K % 16 != 0
        "model.layers.0.ids": ("int64", np.arange(6, dtype=np.int64)),
    }
    tensors.update(copied)

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.safetensors")
        dst = os.path.join(tmp, "out.safetensors")
        write_safetensors(src, tensors, {"format": "pt", "origin": "python safetensors"})
        run = subprocess.run([fp4moe, "quantize", src, dst], capture_output=True, text=True)
        print(run.stdout + run.stderr)
        if run.returncode != 0:
            sys.exit(f"FAIL: fp4moe quantize exited with {run.returncode}")

        with open(dst, "rb") as f:
            raw = f.read()
        header_len = struct.unpack("<Q", raw[:8])[0]
        failures = []
        if header_len % 8 != 0:
            failures.append(f"header length {header_len} is not a multiple of 8")
        got = {name: info for name, info in safetensors.deserialize(raw)}
        with safe_open(dst, framework="numpy") as f:
            names = set(f.keys())
            metadata = f.metadata()
            ws2 = f.get_tensor(p + "gate_proj.weight_scale_2")  # F32, through the numpy reader
        if names != set(got):
            failures.append("safe_open and deserialize disagree on the names")
        if metadata.get("origin") != "python safetensors":
            failures.append(f"metadata not kept: {metadata}")
        if ws2.shape != () or ws2.dtype != np.float32:
            failures.append(f"weight_scale_2 read as {ws2.dtype} {ws2.shape}, expected float32 []")

        quantized = [n for n in f32_values]
        expected_names = set(copied)
        for n in quantized:
            expected_names |= {n, n + "_scale", n + "_scale_2"}
        if names != expected_names:
            failures.append(f"names: missing {sorted(expected_names - names)}, unexpected {sorted(names - expected_names)}")

        checked = 0
        for name in quantized:
            x = f32_values[name]
            amax = np.abs(x).max()
            if name.endswith(("gate_proj.weight", "up_proj.weight")):
                amax = max(np.abs(f32_values[p + "gate_proj.weight"]).max(), np.abs(f32_values[p + "up_proj.weight"]).max())
            packed, scales, scale2 = modelopt_nvfp4(x, amax)
            n, k = x.shape
            for suffix, dtype, shape, ref in (("", "U8", [n, k // 2], packed), ("_scale", "F8_E4M3", [n, k // 16], scales),
                                              ("_scale_2", "F32", [], scale2)):
                info = got.get(name + suffix)
                if info is None:
                    continue
                if info["dtype"] != dtype or list(info["shape"]) != shape:
                    failures.append(f"{name}{suffix}: {info['dtype']} {info['shape']}, expected {dtype} {shape}")
                elif bytes(info["data"]) != ref:
                    failures.append(f"{name}{suffix}: {first_difference(bytes(info['data']), ref)}")
                else:
                    checked += 1
        for name, (dtype, arr) in copied.items():
            info = got.get(name)
            if info is not None and bytes(info["data"]) != arr.tobytes():
                failures.append(f"{name}: copied tensor changed")
            elif info is not None:
                checked += 1
        print(f"cross-tool: {checked} tensors identical to the NumPy ModelOpt recipe or copied unchanged")
        for msg in failures:
            print("FAIL:", msg)
        if failures:
            sys.exit(1)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
