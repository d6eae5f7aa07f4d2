#!/usr/bin/env python3
"""The TP-reduction lanes of the layer (numerics.md §12) through the whole run, on a small
Qwen3-shaped checkpoint NumPy writes (8 query heads, 4 KV heads: TP up to 4).

- The canonical layer output has one digest over TP 1/2/4 x CP 1/2 x layouts (one block grid).
- At TP = 1 every lane's bits are the canonical output's (no bit differs); at TP = 2 Megatron's
  two lanes have one digest over CP and layouts (one addition, commutative); at TP = 4 their bits
  vary with CP and the layout (which ring chunk a token falls in) where the canonical output's
  do not, and differ from the canonical output's.
- dX's lanes (Megatron's column-parallel backward, --include-backward): the same at TP = 1, 2
  and 4 against the canonical dX written in BF16.
- The weight gradients' reduce-scatter over DP x CP (FP32 and BF16): the canonical bits at
  CP = 1, other bits at CP = 2, the FP32 one drifting far less than the BF16 one.
- Each lane equals NumPy's FP64 o_proj of the dumped attention output within the bound of its
  roundings (below); the oracle with every head read against the next head's o_proj columns is
  outside it (the control).
- The rollout's lanes per paged case: its canonical output at TP = 1, other bits at TP 2 and 4.
- --no-reduction-lanes: the same canonical bits (every digest of the report), no lane anywhere;
  refused without --scope layer (status 2, one line, nothing written).
- Trainer vs rollout: each trainer lane against each rollout lane, never "aligned"; at TP = 1 on
  both sides their figures are the canonical pair's; with the same TP = 2 on both sides and
  aligned KV blocks, bitwise (the same partials, one addition); at TP = 4 vLLM's tree and
  Megatron's ring differ.

usage: tp_lanes.py --cpdrift BIN --mpirun MPIRUN --np N
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from layer_weights import write_safetensors
from model_fixtures import finish, job_parser, launch, refusal_failure

try:
    import h5py
except ImportError as e:  # CI and the README install python3-h5py: missing is a failure
    print(f"FAIL: {e} (apt-get install -y python3-h5py)")
    sys.exit(1)

HIDDEN, HQ, HKV, D, S, B = 128, 8, 4, 64, 64, 2
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
          "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": D,
          "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "vocab_size": 512}
U = 2.0 ** -8  # BF16's unit roundoff


def write_checkpoint(tmp):
    """Layer 0's attention weights (BF16 in the file) and the config; o_proj as float64."""
    rng = np.random.default_rng(11)
    p = "model.layers.0.self_attn."
    tensors = {p + "q_proj.weight": rng.standard_normal((HQ * D, HIDDEN)) / 12,
               p + "k_proj.weight": rng.standard_normal((HKV * D, HIDDEN)) / 12,
               p + "v_proj.weight": rng.standard_normal((HKV * D, HIDDEN)) / 12,
               p + "o_proj.weight": rng.standard_normal((HIDDEN, HQ * D)) / 16,
               p + "q_norm.weight": 1 + rng.standard_normal(D) / 8,
               p + "k_norm.weight": 1 + rng.standard_normal(D) / 8}
    path, config = os.path.join(tmp, "model.safetensors"), os.path.join(tmp, "config.json")
    write_safetensors(path, tensors)
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    # The file's BF16 values (write_safetensors truncates the float32 bits).
    o = np.asarray(tensors[p + "o_proj.weight"], dtype=np.float32).view(np.uint32)
    return path, config, ((o >> 16) << 16).view(np.float32).astype(np.float64)


def main():
    args = job_parser().parse_args()
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="cpdrift_tp_lanes_") as tmp:
        weights, config, w_o = write_checkpoint(tmp)
        out, dump = os.path.join(tmp, "r.json"), os.path.join(tmp, "d.h5")
        # Split 16 on both sides (a page): every CP size shares the trainer's block grid, and the
        # rollout's fixed split lands on the same block starts.
        flags = ["--scope", "layer", "--model-config", config, "--weights", weights, "--layer", "0",
                 "--seq-len", str(S), "--batch", str(B), "--modes", "chunked_prefill,decode",
                 "--kv-chunk-sizes", "16", "--tp-world-sizes", "1,2,4", "--cp-world-sizes", "1,2",
                 "--cp-layouts", "contiguous,zigzag", "--rollout-tp-sizes", "1,2,4",
                 "--split-kv-policies", "fixed", "--fixed-split-size", "16", "--include-dlogp",
                 "--include-backward",
                 "--dump", dump, "--output", out, "--quiet"]
        r = subprocess.run(launch(args) + flags, capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not os.path.exists(out):
            check(False, f"the run: exit {r.returncode}: {r.stderr[-2000:]}")
            return finish(failures, "TP-reduction lanes")
        with open(out) as f:
            report = json.load(f)

        cases = {c["case_name"]: c for c in report["cases"]}
        tp_of = {n: int(n.split("_tp")[1].split("_")[0]) for n in cases}
        canonical = {c["layer"]["out"]["digest"] for c in cases.values()}
        check(len(cases) >= 10 and len(canonical) == 1,
              f"{len(cases)} cases: one canonical layer output over TP 1/2/4 x CP 1/2 x layouts")
        every = [(n, l) for n, c in cases.items() for l in c["layer"]["tp_lanes"]]
        weights = ("q_proj", "k_proj", "v_proj", "o_proj")
        check({(l["lane"], l["tensor"]) for _, l in every} ==
              {(k, t) for k in ("megatron_ar", "megatron_sp") for t in ("out", "dx")} |
              {(k, t) for k in ("megatron_grad_fp32", "megatron_grad_bf16") for t in weights},
              "every prefill case reports Megatron's TP lanes for the output and dX, and its "
              "gradient reduce-scatter lanes for every weight")
        check(all(l["upstream"] and l["collective"] for _, l in every),
              "each lane names its upstream and collective")
        for tensor in ("out", "dx"):
            lanes = {(n, l["lane"]): l for n, l in every if l["tensor"] == tensor}
            ones = [l for (n, _), l in lanes.items() if tp_of[n] == 1]
            check(len(ones) >= 4 and len({l["vs_reference"]["digest"] for l in ones}) == 1
                  and all(l["bits_differing_from_canonical"] == 0 for l in ones)
                  and (tensor == "dx" or ones[0]["vs_reference"]["digest"] in canonical),
                  f"{tensor}, TP = 1: every lane's bits are the canonical ones (written in BF16)")
            twos = {l["vs_reference"]["digest"] for (n, _), l in lanes.items() if tp_of[n] == 2}
            check(len(twos) == 1 and not twos & canonical,
                  f"{tensor}, TP = 2: one digest for both Megatron lanes over CP and layouts, "
                  "not the canonical one")
            for lane in ("megatron_ar", "megatron_sp"):
                fours = {l["vs_reference"]["digest"] for (n, k), l in lanes.items()
                         if tp_of[n] == 4 and k == lane}
                share = min(l["bits_differing_from_canonical"] for (n, k), l in lanes.items()
                            if tp_of[n] == 4 and k == lane)
                check(len(fours) > 1 and share > 0.1,
                      f"{tensor}, TP = 4, {lane}: {len(fours)} digests over CP and layouts where "
                      f"the canonical one has one; at least {share:.0%} of its bits differ")

        # The weight gradients' reduce-scatter over CP: at CP = 1 the canonical gradient (the FP32
        # lane's bits; the BF16 lane's, its BF16 write); at CP = 2 other bits.
        grads = [(n, l) for n, l in every if l["tensor"] in weights]
        cp_of = {n: int(n.split("_cp")[1].split("_")[0]) for n in cases}
        check(all((l["bits_differing_from_canonical"] == 0) == (cp_of[n] == 1) for n, l in grads),
              "weight gradients: the reduce-scatter lanes' bits are the canonical ones at CP = 1 "
              "only")
        fp32 = [l for n, l in grads if l["lane"] == "megatron_grad_fp32" and cp_of[n] == 2]
        bf16 = [l for n, l in grads if l["lane"] == "megatron_grad_bf16" and cp_of[n] == 2]
        check(max(l["vs_reference"]["max_abs"] for l in fp32) * 100 <
              max(l["vs_reference"]["max_abs"] for l in bf16),
              "CP = 2: the FP32 reduce-scatter drifts far less than the BF16 one (its FP32 sums "
              "against BF16 writes and hops)")

        # The FP64 oracle: o_proj of the attention output the layer read (the BF16-written CP
        # output), each TP rank's heads apart. Each partial P_r is an FP32 fold of K = Hq·D/n
        # products (|error| ≤ K·2^-24·|W|·|a|, ×1.01), written in BF16 (u·|P_r|), then summed with
        # at most n − 1 BF16 roundings (u·(n − 1)·1.1·Σ|P_r|): the bound below.
        with h5py.File(dump) as f:
            worst, control = {}, np.inf
            for name in cases:
                n = tp_of[name]
                a = f[f"cases/{name}/candidate_bf16/out"][:].astype(np.float64)  # [B, H, S, D]
                a = a.transpose(0, 2, 1, 3).reshape(B, S, HQ * D)
                cols = HQ * D // n
                parts = [a[..., r * cols:(r + 1) * cols] @ w_o[:, r * cols:(r + 1) * cols].T
                         for r in range(n)]
                exact = sum(parts)
                magnitude = sum(np.abs(p) for p in parts)
                bound = (U * magnitude * (1 + 1.1 * (n - 1) * (1 + U))
                         + cols * 2.0 ** -24 * 1.01 * (np.abs(a) @ np.abs(w_o).T))
                shifted = a.reshape(B, S, HQ, D)[:, :, np.r_[1:HQ, 0], :].reshape(B, S, HQ * D)
                for lane in ("megatron_ar", "megatron_sp"):
                    got = f[f"cases/{name}/layer/tp_lanes/{lane}"][:].reshape(B, S, HIDDEN)
                    ratio = np.max(np.abs(got - exact) / bound)
                    worst[lane] = max(worst.get(lane, 0.0), ratio)
                    control = min(control, np.max(np.abs(got - shifted @ w_o.T) / bound))
        for lane, ratio in worst.items():
            check(0 < ratio <= 1, f"{lane} vs NumPy's FP64 o_proj over every case: within the bound "
                                  f"({ratio:.3f} of it)")
        check(control > 1, f"the oracle with each head against the next head's columns: outside "
                           f"it ({control:.0f}x, the control)")

        # The rollout's lanes, per paged case (its decoded tokens).
        paged = {c["case_name"]: c for c in report["paged_cases"]}
        rtp = {n: int(n.split("_tp")[1].split("_")[0]) for n in paged}
        for name, c in paged.items():
            got = {l["lane"]: l for l in c["paged"]["drift"]["layer_tp_lanes"]}
            same = all(l["bits_differing_from_canonical"] == 0 for l in got.values())
            check(set(got) == {"vllm_ar", "vllm_bi"} and same == (rtp[name] == 1),
                  f"{name}: vLLM's lanes, {'the canonical bits' if rtp[name] == 1 else 'other bits'}")

        # The pairs through the lanes.
        pairs = report["trainer_vs_rollout"]["pairs"]
        base = {(p["trainer"], p["rollout"]): p for p in pairs
                if p["trainer_merge"] == "canonical" and p["trainer_tp_reduction"] == "canonical"}
        lane_pairs = [p for p in pairs if p["trainer_tp_reduction"] != "canonical"]
        check(len(lane_pairs) == 4 * len(base) and not any(p["aligned"] for p in lane_pairs),
              f"{len(lane_pairs)} lane pairs: 2 trainer x 2 rollout lanes for each of the "
              f"{len(base)} case pairs, none claimed aligned")
        rl_keys = {"abs_delta", "importance_ratio", "kl_rollout_train", "first_divergent_token"}
        check(all(rl_keys <= set(p["rl_metrics"]) and p["rl_metrics"]["tokens"] > 0
                  for p in lane_pairs),
              "every lane pair carries the RL figures (|Δlogp|, importance ratio, KL, first "
              "divergent token)")

        def figures(p):
            return json.dumps([p["layer_out"], p["logprob"], p["rl_metrics"]], sort_keys=True)

        ones = [p for p in lane_pairs if tp_of[p["trainer"]] == 1 and rtp[p["rollout"]] == 1]
        check(ones and all(figures(p) == figures(base[(p["trainer"], p["rollout"])]) for p in ones),
              "TP = 1 on both sides: every lane pair's figures are the canonical pair's")
        aligned_twos = [p for p in lane_pairs if tp_of[p["trainer"]] == 2 and rtp[p["rollout"]] == 2
                        and base[(p["trainer"], p["rollout"])]["aligned"]]
        check(aligned_twos and all(p["layer_out"]["bitwise_equal"] and p["logprob"]["bitwise_equal"]
                                   for p in aligned_twos),
              f"TP = 2 on both sides, aligned blocks: {len(aligned_twos)} lane pairs bitwise")
        fours = [p for p in lane_pairs if tp_of[p["trainer"]] == 4 and rtp[p["rollout"]] == 4
                 and p["rollout_tp_reduction"] == "vllm_bi"
                 and base[(p["trainer"], p["rollout"])]["aligned"]]
        check(fours and all(not p["layer_out"]["bitwise_equal"] for p in fours),
              "TP = 4 on both sides, aligned blocks: vLLM's tree against Megatron's ring drifts")

        # --no-reduction-lanes: the canonical bits alone.
        off = os.path.join(tmp, "off.json")
        flags_off = [f for f in flags if f not in ("--dump", dump)] + ["--no-reduction-lanes"]
        flags_off[flags_off.index("--output") + 1] = off
        r = subprocess.run(launch(args) + flags_off, capture_output=True, text=True, timeout=600)
        if r.returncode == 0 and os.path.exists(off):
            with open(off) as f:
                quiet = json.load(f)

            def digests(x, path=""):
                """Every `digest` in x, by its path."""
                if isinstance(x, list):
                    x = dict(enumerate(x))
                if not isinstance(x, dict):
                    return {}
                found = {path: x["digest"]} if "digest" in x else {}
                for key, val in x.items():
                    found.update(digests(val, f"{path}/{key}"))
                return found
            lanes_off, lanes_on = digests(quiet["cases"]), digests(report["cases"])
            check(lanes_off and all(lanes_on.get(k) == v for k, v in lanes_off.items()),
                  f"--no-reduction-lanes: the same {len(lanes_off)} canonical digests")
            check(all(not c["layer"]["tp_lanes"] and c["layer"]["reduction_lanes"] is False
                      for c in quiet["cases"])
                  and all(p["trainer_tp_reduction"] == "canonical"
                          for p in quiet["trainer_vs_rollout"]["pairs"])
                  and all(not c["paged"]["drift"]["layer_tp_lanes"] for c in quiet["paged_cases"]),
                  "--no-reduction-lanes: no lane in the cases, the paged cases or the pairs")
        else:
            check(False, f"--no-reduction-lanes: exit {r.returncode}: {r.stderr[-1500:]}")
        bad = os.path.join(tmp, "bad.json")
        flags_bad = ["--seq-len", "64", "--no-reduction-lanes", "--output", bad]
        failure = refusal_failure(subprocess.run(launch(args) + flags_bad, capture_output=True,
                                                 text=True, timeout=120),
                                  flags_bad, "--no-reduction-lanes applies to the layer", bad)
        check(failure is None, "--no-reduction-lanes without --scope layer: refused")
    return finish(failures, "TP-reduction lanes")


if __name__ == "__main__":
    sys.exit(main())
