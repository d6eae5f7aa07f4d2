#!/usr/bin/env python3
"""--weights PATH --layer N through the whole run: a small Qwen3-shaped model's checkpoint,
written here in Hugging Face's layout (a sharded index and one file), read by every process.

The layer's output must have one digest over TP 1/2 x CP 1/2 x both layouts on 2 and 4
processes, the same from the sharded and the single-file checkpoint; layer 0 and the synthetic
weights give other bits (the controls: the weights read are the ones used). The report names
the checkpoint and layer. A bad checkpoint or flag is refused in one line, exit 2, nothing
written.

Usage: layer_weights.py --cpdrift BIN --mpirun MPIRUN
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from model_fixtures import finish, refusal_failure

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
          "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "vocab_size": 1024}


def bf16_bytes(x):
    """float32 values as BF16 bytes (truncated: the values are whatever the file holds)."""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def write_safetensors(path, tensors):
    header, data = {}, b""
    for name, x in tensors.items():
        raw = bf16_bytes(x)
        header[name] = {"dtype": "BF16", "shape": list(x.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def layer(rng, n):
    h, q, kv, d = 256, 4 * 64, 2 * 64, 64
    p = f"model.layers.{n}.self_attn."
    return {p + "q_proj.weight": rng.standard_normal((q, h)) / 16,
            p + "k_proj.weight": rng.standard_normal((kv, h)) / 16,
            p + "v_proj.weight": rng.standard_normal((kv, h)) / 16,
            p + "o_proj.weight": rng.standard_normal((h, q)) / 16,
            p + "q_norm.weight": 1 + rng.standard_normal(d) / 8,
            p + "k_norm.weight": 1 + rng.standard_normal(d) / 8}


def write_checkpoints(work):
    rng = np.random.default_rng(7)
    layers = {n: layer(rng, n) for n in (0, 1)}
    sharded = os.path.join(work, "sharded")
    os.makedirs(sharded)
    weight_map = {}
    for n, tensors in layers.items():
        shard = f"model-0000{n + 1}-of-00002.safetensors"
        write_safetensors(os.path.join(sharded, shard), tensors)
        weight_map.update({name: shard for name in tensors})
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    single = os.path.join(work, "model.safetensors")
    write_safetensors(single, {**layers[0], **layers[1]})
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    return sharded, single, config


def run(args, np_, flags, out):
    return subprocess.run([args.mpirun, "-np", str(np_), "--oversubscribe", args.cpdrift,
                           "--scope", "layer", "--seq-len", "64", "--modes", "chunked_prefill",
                           "--kv-chunk-sizes", "4", *flags, "--output", out, "--quiet"],
                          capture_output=True, text=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpdrift", required=True)
    parser.add_argument("--mpirun", required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as work:
        sharded, single, config = write_checkpoints(work)
        out = os.path.join(work, "r.json")
        grid = ["--model-config", config, "--tp-world-sizes", "1,2", "--cp-world-sizes", "1,2",
                "--cp-layouts", "contiguous,zigzag"]

        def digests(np_, extra):
            if os.path.exists(out):
                os.remove(out)
            r = run(args, np_, grid + extra, out)
            if r.returncode != 0:
                failures.append(f"{extra} np={np_}: exit {r.returncode}: {r.stderr[-1500:]}")
                return set(), None
            with open(out) as f:
                report = json.load(f)
            cases = report["cases"]
            return {c["layer"]["out"]["digest"] for c in cases}, cases[0]["layer"]["weights"]

        read = set()
        for np_ in (2, 4):
            for path in (sharded, single):
                d, weights = digests(np_, ["--weights", path, "--layer", "1"])
                print(f"np={np_} {os.path.basename(path)} layer 1: {sorted(d)} ({weights})")
                read |= d
                if weights != f"{path}, layer 1":
                    failures.append(f"the report says weights {weights!r}")
        if len(read) != 1:
            failures.append(f"layer 1 gives {len(read)} digests, not one")
        other, _ = digests(2, ["--weights", sharded, "--layer", "0"])
        synthetic, weights = digests(2, [])
        print(f"controls: layer 0 {sorted(other)}, synthetic {sorted(synthetic)} ({weights})")
        if other & read or synthetic & read or weights != "synthetic":
            failures.append("layer 0 or the synthetic weights give layer 1's bits")

        refused = [
            (["--model-config", config, "--weights", sharded, "--layer", "7"],
             "no layer 7 (it has layers 0 to 1)"),
            (["--weights", sharded, "--layer", "1"],
             "q_proj.weight: shape [256, 256], qwen3-8b needs [4096, 4096]"),
            (["--model-config", config, "--weights", sharded],
             "--weights PATH needs --layer N"),
            (["--model-config", config, "--weights", os.path.join(work, "none"), "--layer", "1"],
             "cannot read"),
        ]
        for flags, expect in refused:
            if os.path.exists(out):
                os.remove(out)
            r = run(args, 2, flags, out)
            if (why := refusal_failure(r, flags[-3:], expect, out)) is not None:
                failures.append(why)
    return finish(failures, "--weights")


if __name__ == "__main__":
    sys.exit(main())
