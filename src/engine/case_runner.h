// One prefill/chunked case end to end: the arithmetic paths through the CP protocol, the CP=1
// reference and topology counterpart, the merge checks, the backward and dlogp legs, and the
// record of what ran, handed to a CaseSink with everything it compares and publishes.
#pragma once

#include "engine/case_sink.h"
#include "engine/manifest.h"
#include "engine/run_context.h"

namespace cpd {

/// The final write of an attention output: `out` rounded once to BF16 when `bf16` (lse stays
/// FP32, as flash kernels keep it); a copy otherwise. The elements are spread over `pool`.
AttnShard final_write(const AttnShard& merged, bool bf16, ThreadPool& pool);
/// A tensor rounded once to BF16 (kept in FP32 storage): the final write of a BF16 kernel.
Shard bf16_written(const Shard& s, ThreadPool& pool);

/// Runs `spec` and hands what it computed to `sink.prefill_case`. Collective over the
/// transport's processes.
void run_case(const RunContext& ctx, const CaseSpec& spec, CaseSink& sink);

/// The same on an explicit grid: `requested` is what the report says was asked for, `executed`
/// the grid that runs. They may differ in the split only (std::invalid_argument otherwise), and
/// do only where a test shows that the record reads what ran.
void run_case(const RunContext& ctx, const CaseSpec& requested, const CaseGrid& executed,
              CaseSink& sink);

/// BF16 RoPE output vs FP32 for the whole Q and K tensors, handed to `sink.rope`. Collective.
void run_rope_check(const RunContext& ctx, CaseSink& sink);

}  // namespace cpd
