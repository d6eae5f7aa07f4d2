"""What the model tests share: an unlisted model of a listed family, as its own config.json
gives it (Qwen2.5-3B: 16/2 heads, hidden 2048, qkv bias by its model_type, no head_dim field),
and the case-name slug of a model's name."""

QWEN25_3B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 2048,
    "num_attention_heads": 16, "num_key_value_heads": 2, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "vocab_size": 151936, "max_position_embeddings": 32768,
    "use_sliding_window": False, "tie_word_embeddings": True,
}
# The name cpdrift gives it: model_type-<Hq>q<Hkv>kv.
QWEN25_3B_NAME = "qwen2-16q2kv"


def slug(name):
    """A model's name as case names spell it (model_slug): qwen2.5-7b -> qwen2_5_7b."""
    return name.replace("-", "_").replace(".", "_")


def job_parser():
    """The arguments every model test takes: the binary, mpirun and the process count."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpdrift", required=True)
    parser.add_argument("--mpirun", required=True)
    parser.add_argument("--np", type=int, required=True)
    return parser


def launch(args):
    """The command prefix that starts cpdrift on the job's processes."""
    return [args.mpirun, "-np", str(args.np), "--oversubscribe", args.cpdrift]


def refusal_failure(result, flags, expect, out):
    """A run that must be refused: exit 2, one `cpdrift` line holding `expect`, nothing at
    `out`. Prints what happened; returns the failure's text, or None."""
    import os
    lines = [l for l in result.stderr.splitlines() if l.startswith("cpdrift")]
    print(f"refused {' '.join(flags)}: exit {result.returncode}, {lines}")
    if result.returncode == 2 and len(lines) == 1 and expect in lines[0] and not os.path.exists(out):
        return None
    return f"{flags}: expected exit 2 and one line with {expect!r}, nothing written"


def finish(failures, what):
    """Prints the failures and the verdict line; the exit status."""
    for f in failures:
        print("FAIL:", f)
    print(f"{'FAILED' if failures else 'OK'}: {what} ({len(failures)} failures)")
    return 1 if failures else 0
