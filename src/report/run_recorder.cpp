#include "report/run_recorder.h"

#include "core/util/process_memory.h"
#include "core/util/work_timers.h"
#include "engine/merge_checks.h"
#include "kernels/cpu/simd_info.h"
#include "metrics/digest.h"
#include "report/provenance.h"

namespace cpd {

RunRecorder::RunRecorder(RunReport& report, RunSession& session, const CommContext& comm,
                         const Thresholds& thresholds, const std::string& command_line,
                         bool dumping, TensorDump* dump)
    : RunRecorder(report, comm.collectives(), session.pool(), dumping, dump) {
  comm_ = &comm;
  report.problem = session.context().problem;
  report.thresholds = thresholds;
  report.provenance = gather_provenance(comm, command_line);
  report.provenance.threads = session.threads();
  report.provenance.simd = cpu_simd_isa();
  report.provenance.transport = session.transport().name();
  report.provenance.device = session.backend().device();
  report.provenance.cuda_available = cuda_device_count() > 0;
  report.vocab_size = session.context().vocab_size;
  report.merge_oracle_self_test = merge_oracle_self_test();
}

RunRecorder::RunRecorder(RunReport& report, const Collectives& collectives, ThreadPool& pool,
                         bool dumping, TensorDump* dump)
    : report_(report), collectives_(collectives), pool_(pool), dumping_(dumping), dump_(dump) {}

void RunRecorder::finish(std::chrono::steady_clock::time_point started) {
  std::string verdict;
  for (const std::string& f : evaluate_checks(report_)) verdict += f + '\n';
  verdict = comm_->broadcast(verdict, 0);
  for (std::size_t at = 0, nl; (nl = verdict.find('\n', at)) != std::string::npos; at = nl + 1)
    report_.failed_checks.push_back(verdict.substr(at, nl - at));
  std::vector<std::uint64_t>& rss = report_.peak_rss_bytes;
  rss.assign(static_cast<std::size_t>(comm_->size()), 0);
  rss[static_cast<std::size_t>(comm_->rank())] = peak_rss_bytes();
  comm_->allreduce_sum(rss);
  report_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void RunRecorder::annotate(const std::string& group, const DumpAttributes& attributes) {
  if (dump_ != nullptr) dump_->annotate(group, attributes);
}

std::vector<std::string> RunRecorder::publish(const std::vector<CaseTensor>& tensors) {
  const WorkTimer timer(WorkKind::digests);
  std::vector<std::string> digests(tensors.size());
  const auto dumped = [&](const CaseTensor& t) { return dumping_ && !t.path.empty(); };
  const auto format = [](const CaseTensor& t) {
    return t.bf16 ? DigestFormat::bf16 : DigestFormat::fp32;
  };
  // A tensor that rank 0 holds whole (every tensor in one process) and that is not dumped is
  // not streamed: such tensors hash at once on the pool, one a task (SHA-256 is sequential
  // within a tensor). Every process sees the same owners, so they all agree on which tensors
  // are left to stream below.
  const auto hashed_locally = [&](const CaseTensor& t) {
    return t.digest && !dumped(t) && held_by_root(t.layout);
  };
  std::vector<std::size_t> local;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (hashed_locally(tensors[i])) local.push_back(i);
  }
  if (collectives_.root()) {
    pool_.parallel_for(static_cast<std::int64_t>(local.size()), [&](std::int64_t k) {
      const std::size_t i = local[static_cast<std::size_t>(k)];
      digests[i] = local_digest(tensors[i].layout, format(tensors[i]));
    });
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const CaseTensor& t = tensors[i];
    if (hashed_locally(t) || (!t.digest && !dumped(t))) continue;
    PieceSink write;
    if (dumped(t) && dump_ != nullptr) {
      const GlobalTensor& g = t.layout;
      std::vector<std::int64_t> dims{g.batch, g.heads, g.seq_len};
      if (g.width > 1) dims.push_back(g.width);
      DumpAttributes attributes(t.attributes.begin(), t.attributes.end());
      attributes.emplace_back("original_dtype", std::string(t.bf16 ? "bfloat16" : "float32"));
      attributes.emplace_back("stored_dtype", std::string("float32"));
      dump_->begin(t.path, dims, attributes);
      write = [this](const GlobalPiece& piece, const float* rows) { dump_->write(piece, rows); };
    }
    if (t.digest) {
      digests[i] = stream_digest(collectives_, t.layout, format(t), write);
    } else {
      collectives_.stream_to_root(t.layout.segments, [&](std::size_t j, const float* rows) {
        if (write) write(t.layout.pieces[j], rows);
      });
    }
    if (dumped(t) && dump_ != nullptr) dump_->end();
  }
  return digests;
}

void RunRecorder::rope(const RopeOutputs& o) {
  const std::vector<std::string> digests = publish(o.tensors);
  const WorkTimer timer(WorkKind::statistics);
  report_.rope = measure_rope(o, digests, collectives_, pool_);
}

void RunRecorder::prefill_part(const CasePart& part) {
  const std::vector<std::string> digests = publish(part.tensors);
  const WorkTimer timer(WorkKind::statistics);
  measure_case_part(part, digests, collectives_, pool_, pending_);
}

void RunRecorder::prefill_case(const CaseRecord& record) {
  const CaseSpec& spec = record.spec;
  annotate(case_group(record.name),
           {{"tp_world_size", std::int64_t{spec.tp}},
            {"cp_world_size", std::int64_t{spec.cp}},
            {"split", spec.split ? DumpValue(*spec.split) : DumpValue(std::string("none"))},
            {"layout", std::string(to_string(spec.layout))},
            {"protocol", std::string(to_string(spec.protocol))}});
  finish_case(record, pending_);
  report_.cases.push_back(std::move(pending_));
  pending_ = CaseResult{};
  if (on_case) on_case(report_.cases.back());
}

void RunRecorder::paged_case(const PagedCaseOutputs& o) {
  const PagedWorkload& w = o.workload;
  std::string lens;
  for (const std::int64_t len : w.kv_lens) lens += (lens.empty() ? "" : ",") + std::to_string(len);
  annotate(paged_case_group(o.name), {{"kv_lens", lens},
                                      {"q_len", w.q_len},
                                      {"page_size", std::int64_t{w.page_size}},
                                      {"shared_prefix_tokens", w.prefix_len}});
  const std::vector<std::string> digests = publish(o.tensors);
  report_.paged_cases.push_back(measure_paged_case(o, digests, collectives_, pool_));
}

void RunRecorder::rollout_pairs(const DecodedCapture& capture) {
  if (collectives_.root()) report_.rollout_pairs = compare_rollout_pairs(capture);
}

}  // namespace cpd
