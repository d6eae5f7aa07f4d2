// One prefill/chunked case end to end: its schedule's phases (case_schedule.h) run in order --
// the CP=1 reference, the arithmetic paths through the CP protocol with the topology
// counterpart and the merge checks, the dlogp and backward legs -- and the record of what ran,
// handed to a CaseSink with everything it compares and publishes.
#pragma once

#include "engine/case_schedule.h"
#include "engine/case_sink.h"
#include "engine/manifest.h"
#include "engine/run_context.h"

namespace cpd {

/// The final write of an attention output: `out` rounded once to BF16 when `bf16` (lse stays
/// FP32, as flash kernels keep it); a copy otherwise. The elements are spread over `pool`.
AttnShard final_write(const AttnShard& merged, bool bf16, ThreadPool& pool);
/// A tensor rounded once to BF16 (kept in FP32 storage): the final write of a BF16 kernel.
Shard bf16_written(const Shard& s, ThreadPool& pool);
/// The same, on `s` itself.
void write_bf16_in_place(Shard& s, ThreadPool& pool);

/// Runs `spec` and hands what it computed to `sink.prefill_case`. Collective over the
/// transport's processes.
void run_case(const RunContext& ctx, const CaseSpec& spec, CaseSink& sink);

/// What the run's context asks of each case (alike on every process).
ScheduleOptions schedule_options(const RunContext& ctx);

/// Runs `schedule`'s phases in order, each reported to ctx.progress as it ends, and hands the
/// case's record to `sink.prefill_case`. `requested` is what the report says was asked for; the
/// schedule's grid may differ from it in the split only (std::invalid_argument otherwise), and
/// does only where a test shows that the record reads what ran.
void run_schedule(const RunContext& ctx, const CaseSpec& requested, const CaseSchedule& schedule,
                  CaseSink& sink);

/// BF16 RoPE output vs FP32 for the whole Q and K tensors, handed to `sink.rope`. Collective.
void run_rope_check(const RunContext& ctx, CaseSink& sink);

}  // namespace cpd
