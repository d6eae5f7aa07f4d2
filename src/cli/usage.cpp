// `cpdrift --help`.
#include "cli/options.h"

namespace cpd {

namespace {

// The text, as the user reads it (docs/cli.md is checked against it option by option).
constexpr const char* kUsage =
    R"(usage: cpdrift [run] [options]        measure CP attention drift (a model's attention)
       cpdrift bench [options]        kernel throughput: CPU FP32 and BF16-emulated, or with
                                      --device cuda the GPU paths vs PyTorch SDPA
       cpdrift accept --mode manifest|run --output DIR/acceptance.json
                                      the fail-closed acceptance matrix (design section 7)
       cpdrift plan [run options] [plan options]
                                      what that run would cost, per case and rank, without
                                      running it: FLOPs, bytes, peak memory per process,
                                      time, the quickest protocol
       cpdrift compare TRAIN ROLLOUT [options]
                                      two engines' per-token logprobs (JSON Lines, HDF5 or a
                                      directory of .npy columns) aligned by (sequence,
                                      position): |dlogp|, importance ratio, KL; an invalid
                                      comparison is status 2, never a figure

Launch one process per GPU (or any number on the CPU): mpirun -np N cpdrift ...

Problem
  --model NAME                 qwen3-8b (default: Hq=32 Hkv=8 D=128, RoPE theta=1e6),
                               qwen3-4b, qwen3-14b, qwen3-32b, qwen3-30b-a3b, llama-3.1-8b,
                               qwen2.5-7b (docs/models.md)
  --model-config FILE          a model's own Hugging Face config.json (llama, qwen2, qwen3,
                               qwen3_moe) instead of --model
  --batch N                    sequences, 1 to 4096 (default 1; accept: 2)
  --seq-len N                  tokens per sequence, 1 to 2^30 (default 16; bench: 4096, or
                               4096 and 16384 on CUDA); the run refuses what its memory cannot
                               hold
  --seed N                     input seed (default 2355)
  --dtype bf16|fp32            candidate dtype (default bf16)
  --no-rope                    attention only, no RoPE on q/k
  --input-distribution gaussian|sink|outlier_channels|mix
                               how q and k look (default gaussian): sink = every sequence's
                               first key takes most of the attention, outlier_channels = 4
                               key channels per KV head 8x larger, mix = both
                               (docs/input-distributions.md)
  --inputs PATH                run and plan: q, k, v from a model (HDF5, safetensors, or a
                               directory of .npy files; docs/inputs.md) instead of generated;
                               with --scope layer, the hidden states [B, S, hidden]; B and S
                               are the file's; each process reads only its rows
Cases (every combination runs, in this order)
  --tp-world-sizes LIST        tensor-parallel sizes, dividing the model's query and KV heads
                               (qwen3-8b: 32 and 8; default 1,2)
  --cp-world-sizes LIST        context-parallel sizes, 1 to 256 (default 1,2)
  --kv-chunk-sizes LIST        split-KV sizes in tokens, each shorter than the sequence;
                               none/full/no_split = disabled (default none,4)
  --cp-layouts LIST            contiguous,zigzag (default contiguous)
  --protocols LIST             ag_rs,ring_kv,allgather_kv (default ag_rs); all give the same bits
  --smoke                      seq-len 4 and chunks none,1 unless given explicitly
  --modes LIST                 prefill,chunked_prefill (the CP cases above, split none / sized)
                               and the rollout side's paged_prefill,decode (default
                               prefill,chunked_prefill)
Paged cases (--modes paged_prefill,decode; sequence b holds S - b*(S/4B) - b tokens, the
first pages a prompt shared by all, q-len query tokens at each end)
  --rollout-tp-sizes LIST      the rollout engine's tensor-parallel sizes, dividing the query
                               and KV heads (default 1): heads split by TP rank, bits unchanged
  --page-size N                KV cache page size in tokens (default 16)
  --split-kv-policies LIST     disabled,fixed,auto (default disabled,fixed); auto is a
                               diagnostic and never passes an invariance check
  --fixed-split-size N         the fixed policy's split in tokens, a multiple of the page
                               size (default 4 pages)
  --q-len N                    query tokens per sequence (default min(16, room / 2))
Execution and output
  --device auto|cpu|cuda       compute backend (default auto: cuda when built and present)
  --transport auto|mpi|nccl|cuda_ipc
                               how partial states move between processes (default auto: mpi);
                               nccl and cuda_ipc stage through GPU memory (--device cuda)
  --comm-timeout S             a wait for another process longer than S seconds (1 to 604800)
                               ends the job (GPU transports: default 300; MPI: only when given)
  --staging-mib N              cuda_ipc: receive window per process, 1 to 65536 MiB (default 64)
  --threads N                  CPU threads per process, at most 4 per CPU of the machine
                               (default: cores / processes per node)
  --round-rows N               query rows per round of the state and partial-dq exchanges, at
                               most --seq-len (default: as many as keep a round's states of a
                               range within 32 MiB): memory against supersteps; the FP32 and
                               emulated-BF16 bits never change (cuBLAS's unfused path is fixed
                               per shape)
  --no-cpu-check               on the GPU, skip re-running the FP32 path on the CPU
                               (the cuda_vs_cpu_fp32 check)
  --inject-fault KIND@RANK[:WHEN]
                               test aid: process RANK breaks the first partial state it sends
                               in its WHEN-th exchange (default 1): drop-state, duplicate-state,
                               corrupt-lse, wrong-block-index, short-message, rank-exit,
                               slow-rank (needs --comm-timeout); the job must end with one
                               message and no report (docs/reliability.md)
  --output PATH                write the JSON report (atomically)
  --scope core|layer           core (default): q, k, v -> attention; layer: the whole attention
                               module, hidden -> q/k/v_proj -> norms -> RoPE -> attention ->
                               o_proj, from synthetic weights or --weights (CPU backend; the
                               forward, backward, dlogp and the rollout side)
  --weights PATH --layer N     the layer's weights: layer N of a Hugging Face checkpoint
                               (index.json + shards, or a .safetensors file), BF16
  --o-proj-order canonical|rank_sums
                               the layer's sums across ranks (o_proj and dX over head groups,
                               the weight gradients over token blocks): one fold through the
                               ranks (default), or each rank's sum apart then added (a control)
  --no-reduction-lanes         skip the layer's production reduction lanes (Megatron's and
                               vLLM's sums over TP, the gradients' over DP x CP; numerics.md
                               section 12) and their time and memory
  --include-backward           also the FP32 backward (dq, dk, dv; with --scope layer dX and
                               every weight's gradient too) vs the CP=1 reference
  --include-lane-backward      also the te_p2p lane's backward (Transformer Engine's ring: each
                               step's gradients written and summed in BF16); CPU backend, needs
                               --include-backward, holds up to CP x the dK/dV totals more
  --include-dlogp              also the selected-token logprob drift (synthetic lm_head)
  --vocab-size V|model         vocabulary of the synthetic lm_head, 2 to 2^20, or `model`: the
                               model's own (default 4096; the model's runs given the memory,
                               each TP rank holding its heads' columns; plan counts them)
  --json                       print the JSON report on stdout (the table goes to stderr)
  --dump PATH                  write the tensors (HDF5) from rank 0, one piece at a time
  --dump-inputs                also dump q, k, v (after RoPE; the layer: its hidden states)
                               into the --dump file
  --overwrite                  let --dump replace an existing file (refused otherwise)
  --quiet                      only the verdict line and errors
  --progress                   progress on stderr (each case's phases, the share of the run's
                               work done, the time left) also when stderr is not a terminal,
                               as in a batch job's log; on a terminal it is always on
  -h, --help                   this text

Bench (--seq-len, --batch, --threads, --device as above)
  --repeats N                  timed runs of each path, 1 to 100: the best and the median
                               (default 3)

Plan (the run options say what is planned; --json / --output write the plan as JSON; the
options of how a run executes -- --dump, --progress, --threads, --transport, --comm-timeout,
--staging-mib -- do not apply)
  --profile h200|cpu           the machine estimated (default h200); cpu measures this one's
                               kernels and memcpy first, shared by --processes N processes
                               (at most 4 per CPU; default: the largest case's ranks)
  --bf16-tflops X --fp32-tflops X --hbm-tbs X --nvlink-gbs X --network-gbs X
                               h200's figures (990, 67, 4.8, 450, 50), each 0.001 to 1e6
  --gpus-per-node N            ranks sharing NVLink, 1 to 1024 (default 8); one logical rank
                               per GPU

Compare (TRAIN and ROLLOUT: files of {sequence, position, token_id, logprob[, active]
[, vocab_logprobs][, top_logprobs]} records, docs/compare.md; --output, --json and --quiet
as above)
  --max-abs-delta X            exit 1 when the largest |logp_train - logp_rollout| exceeds X
  --ratio-band X               importance ratios outside [1 - X, 1 + X] are counted, X in
                               [0, 1) (0.2)
  --tis-clip X                 ratios above X are counted as truncated-IS clipped, X at least
                               1 (2)
  --worst N                    list the N tokens with the largest |delta|, 0 to 1000 (5)

Accept (writes DIR/acceptance.json and, in run mode, DIR/report.json)
  --out-threshold X --lse-threshold X --dlogp-threshold X --gradient-threshold X
  --paged-out-threshold X --paged-lse-threshold X --paged-dlogp-threshold X
                               override design section 7's thresholds (each more than 0)

Every number is refused outside its range (docs/cli.md, "Ranges") before anything runs.
Exit status: 0 checks passed, 1 a drift check failed, 2 bad input (nothing ran),
3 a failure while running.
)";

}  // namespace

std::string usage_text() { return kUsage; }

}  // namespace cpd
