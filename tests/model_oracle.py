#!/usr/bin/env python3
"""The shape-dependent pieces of a model against a plain FP64 oracle, end to end.

For each model (a table entry, or an unlisted config.json written here): pre-RoPE q, k, v of the
model's shape and positions far into the context are written as an `.npy` input directory;
`cpdrift --model … --inputs DIR --dump D.h5` runs on the processes given; the FP32 CP=1
reference output and LSE it dumps are checked against NumPy FP64 attention: the model's RoPE
(inverse frequencies from the published formula, transformers' `_compute_llama3_parameters`
for Llama 3; the angle one FP32 product of the FP32 position and frequency, as the numerics
contract states, its cos and sin in FP64), query head h reading KV head h // (Hq / Hkv).

Tolerance 2e-5 on out and LSE: the FP32 path's rounding over S = 64 keys of unit-scale inputs
(dot products of 128 terms, an FP32 exponential and sum) stays near 1e-6. Negative controls, each
of which must be off by more than 50× that: the GQA mapping h % Hkv instead of h // group, and
for Llama the RoPE without its scaling. The report must name the model and its source, and
Qwen2.5-7B's files given to --model qwen3-8b must be refused (status 2, one line).

Usage: model_oracle.py --cpdrift BIN --mpirun MPIRUN --np N
"""
import json
import os
import subprocess
import sys
import tempfile

from model_fixtures import QWEN25_3B, job_parser, launch, slug

import h5py
import numpy as np

TOL = 2e-5
CONTROL = 50 * TOL
S = 64


# (flags, Hq, Hkv, D, theta, llama3 scaling or None)
MODELS = {
    "qwen2.5-7b": (["--model", "qwen2.5-7b"], 28, 4, 128, 1e6, None),
    "qwen3-30b-a3b": (["--model", "qwen3-30b-a3b"], 32, 4, 128, 1e6, None),
    "llama-3.1-8b": (["--model", "llama-3.1-8b"], 32, 8, 128, 5e5, (8.0, 1.0, 4.0, 8192)),
    "qwen2-16q2kv": (None, 16, 2, 128, 1e6, None),  # QWEN25_3B via --model-config
}


def inv_freq(dim, theta, llama3):
    """The published formula in FP64, rounded once to FP32."""
    inv = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if llama3:
        factor, low, high, original = llama3
        wavelen = 2 * np.pi / inv
        smooth = (original / wavelen - low) / (high - low)
        scaled = np.where(wavelen > original / low, inv / factor, inv)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv = np.where(medium, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def rope(x, positions, freqs):
    """Rotate-half RoPE of [H, S, D] in FP64 at FP32 angles."""
    angle = (positions.astype(np.float32)[:, None] * freqs[None, :]).astype(np.float64)
    c, s = np.cos(angle), np.sin(angle)
    h = x.shape[-1] // 2
    x = x.astype(np.float64)
    return np.concatenate([x[..., :h] * c - x[..., h:] * s, x[..., h:] * c + x[..., :h] * s], -1)


def attention(q, k, v, kv_of):
    """FP64 causal attention; query head h reads KV head kv_of(h)."""
    hq, s, d = q.shape
    out, lse = np.zeros((hq, s, d)), np.zeros((hq, s))
    mask = np.tril(np.ones((s, s), dtype=bool))
    for h in range(hq):
        g = kv_of(h)
        scores = np.where(mask, (q[h] @ k[g].T) / np.sqrt(d), -np.inf)
        m = scores.max(axis=1, keepdims=True)
        p = np.exp(scores - m)
        out[h] = (p @ v[g]) / p.sum(axis=1, keepdims=True)
        lse[h] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    return out, lse


def worst(out, lse, ref_out, ref_lse):
    return max(np.abs(out - ref_out).max(), np.abs(lse - ref_lse).max())


def check_model(args, name, spec, work):
    flags, hq, hkv, d, theta, llama3 = spec
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, hq, S, d), dtype=np.float32)
    k = rng.standard_normal((1, hkv, S, d), dtype=np.float32)
    v = rng.standard_normal((1, hkv, S, d), dtype=np.float32)
    positions = (np.arange(S, dtype=np.int64) * 1999 + 5)[None, :]  # up to ~126K: every band
    inputs = os.path.join(work, name)
    os.makedirs(inputs)
    for t, a in (("q", q), ("k", k), ("v", v), ("positions", positions)):
        np.save(os.path.join(inputs, t + ".npy"), a)
    with open(os.path.join(inputs, "inputs.json"), "w") as f:
        json.dump({"rope_applied": False}, f)
    if flags is None:
        config = os.path.join(work, name + ".json")
        with open(config, "w") as f:
            json.dump(QWEN25_3B, f)
        flags = ["--model-config", config]
    dump, report = os.path.join(work, name + ".h5"), os.path.join(work, name + ".json.out")
    cmd = [*launch(args), *flags,
           "--inputs", inputs, "--tp-world-sizes", "1,2", "--cp-world-sizes", "1,2",
           "--kv-chunk-sizes", "none,16", "--dump", dump, "--output", report, "--quiet"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    errors = []
    if run.returncode != 0:
        return [f"{name}: cpdrift exited {run.returncode}: {run.stderr.strip()[-400:]}"]
    with open(report) as f:
        target = json.load(f)["target"]
    if target["model"] != name or not target["model_config"]["source"]:
        errors.append(f"{name}: the report names {target['model']!r}, source "
                      f"{target['model_config']['source']!r}")
    with h5py.File(dump, "r") as f:
        group = f[f"cases/{slug(name)}_tp1_cp1_prefill_bf16/reference_fp32"]
        out, lse = group["out"][0].astype(np.float64), group["lse"][0].astype(np.float64)
    pos = positions[0]
    freqs = inv_freq(d, theta, llama3)
    qr, kr = rope(q[0], pos, freqs), rope(k[0], pos, freqs)
    group_size = hq // hkv
    ref_out, ref_lse = attention(qr, kr, v[0].astype(np.float64), lambda h: h // group_size)
    err = worst(out, lse, ref_out, ref_lse)
    print(f"{name}: max |cpdrift FP32 - FP64 oracle| = {err:.3e} (tolerance {TOL:.0e})")
    if not err <= TOL:
        errors.append(f"{name}: off the FP64 oracle by {err:.3e}")
    wrong_gqa = attention(qr, kr, v[0].astype(np.float64), lambda h: h % hkv)
    control = worst(out, lse, *wrong_gqa)
    print(f"{name}: control, GQA mapping h % Hkv: {control:.3e}")
    if not control > CONTROL:
        errors.append(f"{name}: the wrong GQA mapping is not told apart ({control:.3e})")
    if name == "qwen2.5-7b":  # its files are not another model's inputs: refused, one line
        other = subprocess.run([*launch(args),
                                "--model", "qwen3-8b", "--inputs", inputs], capture_output=True,
                               text=True)
        lines = [l for l in other.stderr.splitlines() if l.startswith("cpdrift")]
        expect = "q has shape [1, 28, 64, 128]; qwen3-8b needs [B, 32, S, 128]"
        print(f"{name}: its inputs under --model qwen3-8b: exit {other.returncode}, {lines}")
        if other.returncode != 2 or len(lines) != 1 or expect not in lines[0]:
            errors.append(f"{name}: inputs of the wrong shape were not refused with {expect!r}")
    if llama3:
        plain = inv_freq(d, theta, None)
        unscaled = attention(rope(q[0], pos, plain), rope(k[0], pos, plain),
                             v[0].astype(np.float64), lambda h: h // group_size)
        control = worst(out, lse, *unscaled)
        print(f"{name}: control, RoPE without the llama3 scaling: {control:.3e}")
        if not control > CONTROL:
            errors.append(f"{name}: the unscaled RoPE is not told apart ({control:.3e})")
    return errors


def main():
    parser = job_parser()
    args = parser.parse_args()
    errors = []
    with tempfile.TemporaryDirectory() as work:
        for name, spec in MODELS.items():
            errors += check_model(args, name, spec, work)
    for e in errors:
        print("FAIL:", e)
    print("model_oracle:", "ok" if not errors else f"{len(errors)} failures")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
