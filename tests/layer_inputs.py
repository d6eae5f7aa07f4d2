#!/usr/bin/env python3
"""--scope layer --inputs: the layer's hidden states [B, S, hidden] read from files Python writes
(float32 HDF5 with h5py, BF16 HDF5, a float16 .npy directory, a BF16 safetensors file), with
per-sequence RoPE positions, through a small Qwen3-shaped checkpoint (layer_weights.py's).

- The four files hold the same values (normals in steps of 1/64, exact in every dtype): every case's layer output,
  backward and logprob digests are the same from each, and one over TP 1/2 x CP 1/2 x layouts.
- The reference layer output equals NumPy's FP64 layer (q/k/v_proj, q/k_norm, RoPE at the file's
  positions, causal GQA attention, o_proj) within the bound of its BF16 roundings (below); the
  same oracle at the token index (the positions ignored) is outside it (the control).
- --dump-inputs under the layer writes /inputs/hidden, and --inputs on that dump gives the
  generated run's bits; one value changed gives other bits (the control).
- cpdrift-inspect reads the layer's dump: its recomputed figures are the report's.
- Wrong files are refused: status 2, one line naming the file, nothing written.

usage: layer_inputs.py --cpdrift BIN --inspect INSPECT_BIN --mpirun MPIRUN --np N
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from layer_weights import CONFIG, write_checkpoints
from model_fixtures import finish, job_parser, launch, refusal_failure

try:
    import h5py
except ImportError as e:  # CI and the README install python3-h5py: missing is a failure
    print(f"FAIL: {e} (apt-get install -y python3-h5py)")
    sys.exit(1)

B, S, LAYER = 2, 64, 1
HIDDEN, HQ, HKV, D = CONFIG["hidden_size"], 4, 2, 64


def hidden_and_positions():
    rng = np.random.default_rng(11)
    # Standard normals as multiples of 1/64 within ±4: exact in float16, bfloat16 and float32.
    x = (np.clip(np.round(rng.standard_normal((B, S, HIDDEN)) * 64), -255, 255) / 64).astype(np.float32)
    # Per sequence: an offset and a stride, so that neither the token index nor another
    # sequence's positions can pass for them.
    positions = np.stack([np.arange(S) + 1000, 3 * np.arange(S) + 7]).astype(np.int64)
    return x, positions


def bf16_bits(x):
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # exact: the values have 8 bits


def write_files(tmp, x, positions):
    files = {"hdf5": os.path.join(tmp, "h.h5"), "hdf5 bf16": os.path.join(tmp, "h_bf16.h5"),
             "npy": os.path.join(tmp, "h_npy"), "safetensors": os.path.join(tmp, "h.safetensors")}
    with h5py.File(files["hdf5"], "w") as f:
        f["inputs/hidden"] = x
        f["inputs/positions"] = positions
    with h5py.File(files["hdf5 bf16"], "w") as f:
        f["hidden"] = bf16_bits(x)
        f["hidden"].attrs["dtype"] = "bfloat16"
        f["positions"] = positions
    os.mkdir(files["npy"])  # no inputs.json: the layer has no rope_applied to say
    np.save(os.path.join(files["npy"], "hidden.npy"), x.astype(np.float16))
    np.save(os.path.join(files["npy"], "positions.npy"), positions.astype(np.int32))
    h = bf16_bits(x).astype("<u2").tobytes()
    p = positions.astype("<i8").tobytes()
    header = json.dumps({"hidden": {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [0, len(h)]},
                         "positions": {"dtype": "I64", "shape": list(positions.shape),
                                       "data_offsets": [len(h), len(h) + len(p)]}}).encode()
    with open(files["safetensors"], "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + h + p)
    return files


def load_weights(path):
    """Layer LAYER of the single-file checkpoint as float64 (its BF16 values, exactly)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name.startswith(f"model.layers.{LAYER}.self_attn."):
            a, b = t["data_offsets"]
            bits = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            out[name.split(".")[-2]] = bits.view(np.float32).astype(np.float64).reshape(t["shape"])
    return out


def oracle(x, positions, w):
    """The layer in FP64: out [B, S, hidden] and |W_o|·|a| (the bound's scale) per element."""
    eps, theta = CONFIG["rms_norm_eps"], CONFIG["rope_theta"]
    x = x.astype(np.float64)

    def heads(y, n):  # [B, S, n*D] -> [B, n, S, D]
        return y.reshape(B, S, n, D).transpose(0, 2, 1, 3)

    def norm(y, weight):
        return y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps) * weight

    inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    angle = positions[:, None, :, None].astype(np.float64) * inv_freq  # [B, 1, S, D/2]
    cos, sin = np.cos(angle), np.sin(angle)

    def rope(y):
        y1, y2 = y[..., : D // 2], y[..., D // 2:]
        return np.concatenate([y1 * cos - y2 * sin, y2 * cos + y1 * sin], axis=-1)

    q = rope(norm(heads(x @ w["q_proj"].T, HQ), w["q_norm"]))
    k = rope(norm(heads(x @ w["k_proj"].T, HKV), w["k_norm"]))
    v = heads(x @ w["v_proj"].T, HKV)
    k, v = np.repeat(k, HQ // HKV, axis=1), np.repeat(v, HQ // HKV, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    scores = np.where(np.tril(np.ones((S, S), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    a = (p / p.sum(axis=-1, keepdims=True)) @ v  # [B, H, S, D]
    a = a.transpose(0, 2, 1, 3).reshape(B, S, HQ * D)
    return a @ w["o_proj"].T, np.abs(a) @ np.abs(w["o_proj"]).T


def main():
    parser = job_parser()
    parser.add_argument("--inspect", required=True)
    args = parser.parse_args()
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="cpdrift_layer_inputs_") as tmp:
        _, single, config = write_checkpoints(tmp)
        x, positions = hidden_and_positions()
        files = write_files(tmp, x, positions)
        layer = ["--scope", "layer", "--model-config", config, "--weights", single,
                 "--layer", str(LAYER)]
        # Chunked prefill at a 4-token split: a KV block grid every CP size shares.
        grid = ["--modes", "chunked_prefill", "--kv-chunk-sizes", "4",
                "--tp-world-sizes", "1,2", "--cp-world-sizes", "1,2",
                "--cp-layouts", "contiguous,zigzag", "--include-backward", "--include-dlogp"]

        def run(flags, out):
            if os.path.exists(out):
                os.remove(out)
            return subprocess.run(launch(args) + flags + ["--output", out, "--quiet"],
                                  capture_output=True, text=True, timeout=600)

        def bits(flags, name):
            """Each case's (layer out, backward, dlogp) digests, and the report."""
            out = os.path.join(tmp, name + ".json")
            r = run(flags, out)
            if r.returncode != 0 or not os.path.exists(out):
                check(False, f"{name}: exit {r.returncode}: {r.stderr[-1500:]}")
                return {}, None
            with open(out) as f:
                report = json.load(f)
            d = {}
            for c in report["cases"]:
                grads = c["layer"]["backward"]["gradients"]
                d[c["case_name"]] = (c["layer"]["out"]["digest"],
                                     tuple(sorted((g, v["digest"]) for g, v in grads.items())),
                                     json.dumps(c.get("dlogp"), sort_keys=True))
            return d, report

        # The four formats: the same bits, and the report says what was read.
        digests, reports = {}, {}
        for fmt, path in files.items():
            flags = layer + grid + ["--inputs", path]
            if fmt == "hdf5":
                flags += ["--dump", os.path.join(tmp, "d.h5")]
            digests[fmt], report = bits(flags, fmt.replace(" ", "_"))
            reports[fmt] = report
            if report is not None:
                t = report["target"]
                check(t["batch"] == B and t["seq_len"] == S and t["inputs"]["tensors"] == "hidden"
                      and t["inputs"]["format"] == fmt.split()[0]
                      and t["inputs"]["positions"] == "from the file",
                      f"{fmt}: target.inputs says what was read ({t['inputs']})")
        d = digests["hdf5"]
        check(len(d) == 8, f"{len(d)} cases per run (8)")
        check(len({(o, g) for o, g, _ in d.values()}) == 1,
              "one layer output and backward over TP 1/2 x CP 1/2 x layouts on the file's "
              "hidden states")
        check(all(digests[f] == d for f in files),
              "float32 HDF5, BF16 HDF5, float16 .npy and BF16 safetensors: the same bits")

        # The FP64 oracle. The reference output is o_proj over the FP32 attention output rounded
        # to BF16, in FP32, rounded to BF16: |Δ| ≤ 2^-9 (|W_o|·|a| + |out|) from the two
        # roundings; 2^-8 leaves room for the FP32 arithmetic before them (≤ 1e-5 relative).
        w = load_weights(single)
        want, scale = oracle(x, positions, w)
        ignored, _ = oracle(x, np.tile(np.arange(S), (B, 1)), w)
        if os.path.exists(os.path.join(tmp, "d.h5")):
            with h5py.File(os.path.join(tmp, "d.h5")) as f:
                case = sorted(f["cases"].keys())[0]
                got = f[f"cases/{case}/layer/reference/out"][:].reshape(B, S, HIDDEN).astype(np.float64)
            bound = 2.0 ** -8 * (scale + np.abs(want))
            worst = np.max(np.abs(got - want) / bound)
            check(worst <= 1, f"{case}: reference out vs NumPy FP64: within the bound ({worst:.3f} of it)")
            control = np.max(np.abs(got - ignored) / bound)
            check(control > 1, f"the oracle at the token index instead: outside it ({control:.1f}x, the control)")
            # cpdrift-inspect reads the layer's tensors back: its figures recomputed from the dump
            # are the report's (the layer output's and every gradient's max |Δ| and digest).
            r = subprocess.run([args.inspect, "summary", "--json", os.path.join(tmp, "d.h5")],
                               capture_output=True, text=True)
            if r.returncode == 0 and reports["hdf5"] is not None:
                figures = {(c["case_name"], f["figure"]): f["stats"]
                           for c in json.loads(r.stdout)["cases"] for f in c["figures"]}
                want, got = {}, {}
                for c in reports["hdf5"]["cases"]:
                    named = {"layer.out": c["layer"]["out"]}
                    for g, v in c["layer"]["backward"]["gradients"].items():
                        named["layer.backward.gradients." + g] = v
                    for lane in c["layer"]["tp_lanes"]:  # the reduction lanes (numerics.md §12)
                        named[f"layer.tp_lanes.{lane['lane']}.{lane['tensor']}"] = lane["vs_reference"]
                    for name, v in named.items():
                        want[(c["case_name"], name)] = (v["max_abs"], v["digest"])
                        f = figures.get((c["case_name"], name), {})
                        got[(c["case_name"], name)] = (f.get("max_abs"), f.get("digest"))
                check(len(want) >= 8 * 8 and got == want,
                      f"cpdrift-inspect summary: the layer's {len(want)} figures are the report's")
            else:
                check(False, f"cpdrift-inspect summary: exit {r.returncode}: {r.stderr[-500:]}")
        else:
            check(False, "the hdf5 run wrote its dump")

        # The rollout on the file: trainer TP=2 x CP=2 zigzag vs paged decode at rollout TP 1 and
        # 2. Aligned KV blocks: the layer's output and the logprobs bitwise equal; the rollout
        # without a split drifts (the control).
        out = os.path.join(tmp, "pairs.json")
        r = run(layer + ["--inputs", files["hdf5"], "--tp-world-sizes", "2", "--cp-world-sizes", "2",
                         "--cp-layouts", "zigzag", "--kv-chunk-sizes", "16",
                         "--modes", "chunked_prefill,decode", "--rollout-tp-sizes", "1,2",
                         "--split-kv-policies", "fixed,disabled", "--fixed-split-size", "16",
                         "--include-dlogp"], out)
        if r.returncode == 0:
            with open(out) as f:
                pairs = [p for p in json.load(f)["trainer_vs_rollout"]["pairs"]
                         if p["trainer_merge"] == "canonical"
                         and p["trainer_tp_reduction"] == "canonical"]
            aligned = [p for p in pairs if p["aligned"]]
            check(len(aligned) == 2 and all(p["layer_out"]["bitwise_equal"] and
                                            p["logprob"]["bitwise_equal"] for p in aligned),
                  "the file's trainer vs rollout TP 1 and 2, aligned: bitwise layer out and logprobs")
            check(any(not p["aligned"] and not p["layer_out"]["bitwise_equal"] for p in pairs),
                  "the rollout without a split drifts (the control)")
        else:
            check(False, f"pairs on the file: exit {r.returncode}: {r.stderr[-1500:]}")

        # --dump-inputs under the layer, read back: the generated run's bits.
        dump = os.path.join(tmp, "gen.h5")
        flags = layer + ["--tp-world-sizes", "2", "--cp-world-sizes", "2", "--cp-layouts", "zigzag",
                         "--include-backward"]
        generated, _ = bits(flags + ["--seq-len", str(S), "--batch", str(B), "--dump", dump,
                                     "--dump-inputs"], "generated")
        read_back, _ = bits(flags + ["--inputs", dump], "read_back")
        check(generated != {} and read_back == generated,
              "--dump-inputs then --inputs on the dump: the generated run's bits")
        with h5py.File(dump, "a") as f:
            f["inputs/hidden"][1, 5, 17] += 1.0 / 64
        changed, _ = bits(flags + ["--inputs", dump], "changed")
        check(changed != {} and all(changed[c][0] != generated[c][0] for c in changed),
              "one hidden value changed: other bits (the control)")

        # Refusals: one line naming the file, status 2, nothing written.
        core = os.path.join(tmp, "core.h5")
        with h5py.File(core, "w") as f:
            for name, h in (("q", HQ), ("k", HKV), ("v", HKV)):
                f[name] = np.zeros((B, h, S, D), np.float32)
                f[name].attrs["rope_applied"] = 0
        def bad_h5(name, **tensors):
            path = os.path.join(tmp, name + ".h5")
            with h5py.File(path, "w") as f:
                for k, v in tensors.items():
                    f[k] = v
            return path
        narrow = bad_h5("narrow", hidden=x[:, :, :128])
        wide = bad_h5("f64", hidden=x.astype(np.float64))
        short = bad_h5("short", hidden=x, positions=positions[:, :S - 1])
        odd = bad_h5("odd", hidden=x[:, :24])
        refused = [
            (layer + ["--inputs", core], core + ": no hidden [B, S, hidden]: --scope layer reads "
             "the layer's hidden states (this file holds the core's q, k, v: drop --scope layer)"),
            (["--model-config", config, "--inputs", files["hdf5"]],
             "(this file holds the layer's hidden states: add --scope layer)"),
            (["--model-config", config, "--inputs", files["npy"]], "add --scope layer"),
            (layer + ["--inputs", narrow], "hidden has shape [2, 64, 128]; qwen3-4q2kv needs"),
            (layer + ["--inputs", wide], "float64"),
            (layer + ["--inputs", short], "positions has shape [2, 63]; needs [2, 64]"),
            (layer + ["--inputs", odd], "odd.h5: S = 24 is not a multiple of 16"),
        ]
        for flags, expect in refused:
            out = os.path.join(tmp, "refused.json")
            if (why := refusal_failure(run(flags, out), flags[-2:], expect, out)) is not None:
                failures.append(why)
    return finish(failures, f"--scope layer --inputs on {args.np} processes")


if __name__ == "__main__":
    sys.exit(main())
