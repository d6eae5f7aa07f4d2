// cpdrift's side of the installed-header test, built with the project: the same results as
// merge_consumer.cpp, the ordered merge done by the CPU backend (what a run uses).
#include <cstdio>

#include "core/util/thread_pool.h"
#include "kernels/attention_backend.h"
#include "results.h"

int main() {
  cpd::ThreadPool pool(1);
  const std::unique_ptr<cpd::AttentionBackend> backend = cpd::make_cpu_backend(pool);
  const auto merge = [&](const std::vector<cpd::BlockState>& s, std::int64_t rows, int dim,
                         float* out, float* lse) {
    const cpd::MergeJob job{s, rows, out, lse};
    backend->merge_states({&job, 1}, dim);
  };
  for (const std::uint32_t u : consumer::results(consumer::make_states(false), merge))
    std::printf("%08x\n", u);
  return 0;
}
