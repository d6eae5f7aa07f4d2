#include "cli/eager_baseline.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/simd_info.h"

namespace cpd {
namespace {

// CBLAS's enumerations (cblas.h), for the one call used.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
using GetText = char* (*)();
using SetThreads = void (*)(int);

}  // namespace

struct EagerAttention::Library {
  void* handle = nullptr;
  Sgemm sgemm = nullptr;
};

EagerAttention::EagerAttention(int threads) : lib_(std::make_unique<Library>()) {
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads: choose before opening it.
  const std::string isa = cpu_simd_isa();
  const char* core = isa == "avx512" ? "SkylakeX" : isa == "avx2" ? "Haswell" : nullptr;
  const char* given = std::getenv("OPENBLAS_CORETYPE");
  if (core == nullptr) {
    core_choice_ = given != nullptr ? std::string("OPENBLAS_CORETYPE=") + given + " (as given)"
                                    : std::string("OpenBLAS's own detection");
  } else {
    core_choice_ = std::string("OPENBLAS_CORETYPE=") + core + ", this CPU's " + isa;
    if (given != nullptr && std::string(given) != core)
      core_choice_ += std::string(" (the environment's ") + given + " overridden)";
    ::setenv("OPENBLAS_CORETYPE", core, 1);
  }
  lib_->handle = ::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib_->handle == nullptr) {
    throw std::runtime_error(std::string("cannot open libopenblas.so.0 (Debian: apt-get install "
                                         "libopenblas0-pthread): ") +
                             ::dlerror());
  }
  const auto symbol = [&](const char* name) {
    void* s = ::dlsym(lib_->handle, name);
    if (s == nullptr) throw std::runtime_error(std::string("libopenblas.so.0 lacks ") + name);
    return s;
  };
  lib_->sgemm = reinterpret_cast<Sgemm>(symbol("cblas_sgemm"));
  reinterpret_cast<SetThreads>(symbol("openblas_set_num_threads"))(threads);
  corename_ = reinterpret_cast<GetText>(symbol("openblas_get_corename"))();
  config_ = reinterpret_cast<GetText>(symbol("openblas_get_config"))();
}

EagerAttention::~EagerAttention() {
  if (lib_->handle != nullptr) ::dlclose(lib_->handle);
}

AttnShard EagerAttention::forward(const Shard& q, const Shard& k, const Shard& v, float scale,
                                  ThreadPool& pool) const {
  const ShardShape& qs = q.shape;
  const std::int64_t seq = qs.rows(), dim = qs.width;
  const std::int64_t group = qs.heads.size() / k.shape.heads.size();
  AttnShard out{Shard(qs), Shard(ShardShape{qs.batch, qs.heads, qs.tokens, 1})};
  std::vector<float> scores(static_cast<std::size_t>(seq * seq));
  const int n = static_cast<int>(seq), d = static_cast<int>(dim);
  for (int b = 0; b < qs.batch; ++b) {
    for (std::int64_t h = qs.heads.begin; h < qs.heads.end; ++h) {
      const float* kh = k.at(b, h / group, 0);
      const float* vh = v.at(b, h / group, 0);
      // scores = scale · Q Kᵀ, every (row, key) pair, the masked ones too, as eager does.
      lib_->sgemm(kRowMajor, kNoTrans, kTrans, n, n, d, scale, q.at(b, h, 0), d, kh, d, 0.0f,
                  scores.data(), n);
      float* lse = out.lse.at(b, h, 0);
      pool.parallel_for(seq, [&](std::int64_t i) {
        float* row = scores.data() + i * seq;
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
        float l = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - m);
          l += row[j];
        }
        for (std::int64_t j = 0; j <= i; ++j) row[j] /= l;
        for (std::int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
        lse[i] = m + std::log(l);
      });
      lib_->sgemm(kRowMajor, kNoTrans, kNoTrans, n, d, n, 1.0f, scores.data(), n, vh, d, 0.0f,
                  out.out.at(b, h, 0), d);
    }
  }
  return out;
}

}  // namespace cpd
