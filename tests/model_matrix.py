#!/usr/bin/env python3
"""Every model of the table, and an unlisted config.json, through the whole run at S = 256.

Each model runs under `mpirun -np N` with every TP that divides its heads, CP 1/2/4, both CP
layouts, full and chunked prefill, the backward and dlogp legs, and the rollout side (paged
prefill and decode at every valid rollout TP, their trainer-vs-rollout pairs). Exit status 0
means every gate passed and every bitwise check held: topology invariance, the aligned
trainer-vs-rollout pairs, the paged invariances. The report must name the model.

--scope ci runs a representative part (TP 1,2; CP 1,2,4; both layouts) that fits CI's budget;
--scope long every valid TP up to 8.

Usage: model_matrix.py --cpdrift BIN --mpirun MPIRUN --np N [--scope ci|long] [--models a,b]
"""
import json
import os
import subprocess
import sys
import tempfile

from model_fixtures import QWEN25_3B, job_parser, launch, slug

# name: (Hq, Hkv); qwen2-16q2kv is the unlisted config of model_fixtures.py
MODELS = {
    "qwen3-8b": (32, 8), "qwen3-4b": (32, 8), "qwen3-14b": (40, 8), "qwen3-32b": (64, 8),
    "qwen3-30b-a3b": (32, 4), "llama-3.1-8b": (32, 8), "qwen2.5-7b": (28, 4),
    "qwen2-16q2kv": (16, 2),
}


# A bad model is refused on every process before anything runs: status 2, one line, nothing
# written. (config.json text, the line's expected ending)
BAD = [
    ({"model_type": "gpt2", "hidden_size": 768, "num_attention_heads": 12, "vocab_size": 10},
     "model_type 'gpt2' is not supported (llama, qwen2, qwen3, qwen3_moe)"),
    ({"model_type": "qwen2", "num_attention_heads": 16, "vocab_size": 10},
     "missing field 'hidden_size'"),
    ({"model_type": "qwen2", "hidden_size": 2048, "num_attention_heads": 16,
      "num_key_value_heads": 3, "vocab_size": 10},
     "3 KV heads do not divide the 16 query heads (GQA groups of equal size)"),
]


def check_refusals(args, work):
    failures = []
    out = os.path.join(work, "refused.json")
    cases = []
    for i, (config, expect) in enumerate(BAD):
        path = os.path.join(work, f"bad{i}.json")
        with open(path, "w") as f:
            json.dump(config, f)
        cases.append((["--model-config", path], path + ": " + expect))
    cases.append((["--model", "qwen3-9b"], "--model: unknown model 'qwen3-9b' (qwen3-8b, "))
    cases.append((["--model", "qwen3-4b", "--model-config", path],
                  "--model and --model-config both name the model; give one"))
    cases.append((["--model", "qwen2.5-7b", "--tp-world-sizes", "8"],
                  "TP=8 must divide both the 28 query heads and the 4 KV heads of qwen2.5-7b"))
    for flags, expect in cases:
        run = subprocess.run([*launch(args),
                              *flags, "--output", out], capture_output=True, text=True)
        # cpdrift's lines (mpirun adds its own banner on a non-zero exit)
        lines = [l for l in run.stderr.splitlines() if l.startswith("cpdrift")]
        ok = (run.returncode == 2 and len(lines) == 1 and expect in lines[0]
              and not os.path.exists(out))
        print(f"refused {' '.join(flags[:2])}: exit {run.returncode}, {lines}")
        if not ok:
            failures.append(f"{flags}: expected status 2 and one line with {expect!r}, got "
                            f"{run.returncode}, {lines}, output written: {os.path.exists(out)}")
    return failures


def main():
    parser = job_parser()
    parser.add_argument("--scope", choices=["ci", "long"], default="ci")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as work:
        failures += check_refusals(args, work)
        for name in args.models.split(","):
            hq, hkv = MODELS[name]
            if name == "qwen2-16q2kv":
                config = os.path.join(work, "config.json")
                with open(config, "w") as f:
                    json.dump(QWEN25_3B, f)
                flags = ["--model-config", config]
            else:
                flags = ["--model", name]
            top = 2 if args.scope == "ci" else 8
            tps = [t for t in (1, 2, 4, 8) if t <= top and hq % t == 0 and hkv % t == 0]
            tp_list = ",".join(map(str, tps))
            report = os.path.join(work, name + ".json")
            cmd = [*launch(args), *flags,
                   "--seq-len", "256", "--tp-world-sizes", tp_list, "--cp-world-sizes", "1,2,4",
                   "--cp-layouts", "contiguous,zigzag", "--kv-chunk-sizes", "none,64",
                   "--include-backward", "--include-dlogp", "--vocab-size", "512",
                   "--modes", "prefill,chunked_prefill,paged_prefill,decode",
                   "--rollout-tp-sizes", tp_list, "--fixed-split-size", "64",
                   "--output", report, "--quiet"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            verdict = run.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print(f"{name} np {args.np} TP {tp_list}: exit {run.returncode}, {verdict[0]}")
            if run.returncode != 0:
                failures.append(f"{name}: exit {run.returncode}: {run.stderr.strip()[-600:]}")
                continue
            with open(report) as f:
                doc = json.load(f)
            if doc["target"]["model"] != name:
                failures.append(f"{name}: the report names {doc['target']['model']!r}")
            names = [c["case_name"] for c in doc["cases"]]
            if not names or not all(n.startswith(slug(name) + "_tp") for n in names):
                failures.append(f"{name}: case names {names[:3]}… do not start {slug(name)}_tp")
    for f in failures:
        print("FAIL:", f)
    print("model_matrix:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
