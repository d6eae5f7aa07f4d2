#include "engine/memory_plan.h"

#include <algorithm>

#include "kernels/cpu/attention.h"

namespace cpd {

std::uint64_t PhaseMemory::bytes() const {
  std::uint64_t n = 0;
  for (const MemoryTerm& t : terms) n += t.bytes;
  return n;
}

const PhaseMemory& ProcessMemory::peak() const {
  return *std::max_element(
      phases.begin(), phases.end(),
      [](const PhaseMemory& a, const PhaseMemory& b) { return a.bytes() < b.bytes(); });
}

void ProcessMemos::touch(TensorId tensor, int batch, const Range& heads) {
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h)
      planes.insert({static_cast<int>(tensor), b, h});
  }
}

CaseMemory::CaseMemory(const CaseGrid& grid, int threads, bool last_case,
                       std::vector<ProcessMemos>& memos)
    : grid_(grid),
      threads_(threads),
      last_case_(last_case),
      memos_(memos),
      hosted_(memos.size()),
      references_(memos.size(), 0),
      kept_(memos.size(), 0),
      out_(memos.size()) {
  for (const LogicalRank& r : grid.ranks)
    hosted_[static_cast<std::size_t>(process_of(r.id, static_cast<int>(memos.size())))].push_back(
        &r);
}

void CaseMemory::add_phase(std::size_t proc, std::string name,
                           const std::vector<MemoryTerm>& terms) {
  const ProcessMemos& m = memos_[proc];
  const Problem& p = grid_.problem;
  const int dim = p.dims.head_dim;
  std::uint64_t lm_head = 0;
  for (const auto& [vocab, head] : m.lm_head) lm_head += tensor_bytes(1, 1, vocab, dim);
  for (const auto& [begin, end] : m.layer_lm_head)
    lm_head += tensor_bytes(1, 1, end - begin, p.dims.hidden_size);
  // The layer's weights (LayerWeights): each q, k, v head's rows whose inputs a rank generated,
  // [D][hidden], and o_proj's columns of each head group used, [hidden][G].
  std::uint64_t weights = 0;
  if (p.layer) {
    std::set<std::pair<int, std::int64_t>> heads;
    for (const auto& [tensor, batch, head] : m.planes) {
      if (tensor != static_cast<int>(TensorId::d_out)) heads.insert({tensor, head});
    }
    const int hidden = p.dims.hidden_size, group = p.dims.group_size();
    const auto groups = [](const std::set<std::int64_t>& s) {
      return static_cast<std::int64_t>(s.size());
    };
    weights = tensor_bytes(1, 1, static_cast<std::int64_t>(heads.size()) * dim, hidden) +
              tensor_bytes(1, 1, groups(m.o_proj_groups) * group * dim, hidden) +
              tensor_bytes(1, 1, groups(m.o_proj_transposed) * group * dim, hidden) +
              tensor_bytes(1, 1, groups(m.qkv_transposed) * (group + 2) * dim, hidden);
  }
  std::vector<MemoryTerm> all{
      {"input memo", m.planes.size() * tensor_bytes(1, 1, p.seq_len, dim)},
      {"CP=1 memos", m.cp1_memo + m.cp1_backward_memo},
      {"lm_head columns", lm_head},
      {"layer weights", weights},
      // Per kernel thread: the forward's scores [keys][64] (four lane tiles); the backward's dk,
      // dv [keys][D] (thread-local, so the longest key range any kernel has seen).
      {"kernel scratch", tensor_bytes(threads_, 1, 1,
                                      static_cast<std::int64_t>(m.forward_keys * kAttendRows +
                                                                m.scratch_keys * 2 * dim))}};
  all.insert(all.end(), terms.begin(), terms.end());
  all.push_back({"process baseline", kProcessBaselineBytes});
  out_[proc].phases.push_back(PhaseMemory{std::move(name), std::move(all)});
}

RunMemoryPlan::RunMemoryPlan(const Problem&, int processes, int threads)
    : threads_(std::max(1, threads)), memos_(static_cast<std::size_t>(std::max(1, processes))) {}

std::vector<ProcessMemory> RunMemoryPlan::add_case(const CaseSchedule& schedule, bool last_case) {
  CaseMemory memory(schedule.grid, threads_, last_case, memos_);
  for (const Phase& phase : schedule.phases) {
    if (phase.memory) phase.memory(memory);
  }
  return memory.take();
}

std::uint64_t process_memory_floor(const RunRequest& request, const RunPlan& plan, int processes) {
  const Problem& p = request.problem;
  std::uint64_t floor = 0;
  for (const CaseSpec& spec : plan.cases) {
    if (spec.num_logical_ranks() < processes) continue;
    floor = std::max(
        floor, tensor_bytes(p.batch, p.dims.num_q_heads / spec.tp, p.seq_len, p.dims.head_dim));
  }
  return floor == 0 ? 0 : floor + kProcessBaselineBytes;
}

std::vector<std::uint64_t> plan_run_peaks(const RunRequest& request, const RunPlan& plan,
                                          int processes, int threads, bool gpu) {
  const Problem& p = request.problem;
  RunMemoryPlan memory(p, processes, threads);
  std::vector<std::uint64_t> peaks(static_cast<std::size_t>(std::max(1, processes)), 0);
  const ScheduleOptions options = schedule_options(request, gpu);
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    const CaseSchedule schedule =
        schedule_case(CaseGrid(p, plan.cases[i], request.round_rows), options);
    const std::vector<ProcessMemory> m =
        memory.add_case(schedule, i + 1 == plan.cases.size() && plan.paged.empty());
    for (std::size_t proc = 0; proc < m.size(); ++proc)
      peaks[proc] = std::max(peaks[proc], m[proc].peak().bytes());
  }
  return peaks;
}

}  // namespace cpd
