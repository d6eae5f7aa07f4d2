#include "cli/bench_baselines.h"

#include <dlfcn.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
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

// Prints "version V", then "backend NAME SECONDS" per backend that runs, or "error WHY".
constexpr const char* kProbe = R"PY(
import sys
try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
except Exception as e:
    print("error torch not importable:", type(e).__name__); sys.exit(0)
if not torch.cuda.is_available():
    print("error torch sees no CUDA device"); sys.exit(0)
b, hq, hkv, s, d, repeats, dev = (int(x) for x in sys.argv[1:8])
torch.cuda.set_device(dev)
print("version", torch.__version__)
q = torch.randn(b, hq, s, d, dtype=torch.bfloat16, device="cuda")
k = torch.randn(b, hkv, s, d, dtype=torch.bfloat16, device="cuda").repeat_interleave(hq // hkv, dim=1)
v = torch.randn(b, hkv, s, d, dtype=torch.bfloat16, device="cuda").repeat_interleave(hq // hkv, dim=1)
names = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
for name in names:
    backend = getattr(SDPBackend, name, None)
    if backend is None:
        continue
    try:
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True); stop = torch.cuda.Event(enable_timing=True)
                start.record(); F.scaled_dot_product_attention(q, k, v, is_causal=True); stop.record()
                stop.synchronize(); times.append(start.elapsed_time(stop) * 1e-3)
        times.sort()
        print("backend", name, times[len(times) // 2])
    except Exception as e:
        print("skip", name, type(e).__name__)
)PY";

}  // namespace

EagerAttention::EagerAttention(int threads) : library_(nullptr, ::dlclose) {
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads: choose before opening it.
  const std::string isa = cpu_simd_isa();
  const char* core = isa == "avx512" ? "SkylakeX" : isa == "avx2" ? "Haswell" : nullptr;
  const char* given = std::getenv("OPENBLAS_CORETYPE");
  if (core == nullptr) {
    core_choice = given != nullptr ? std::string("OPENBLAS_CORETYPE=") + given + " (as given)"
                                   : std::string("OpenBLAS's own detection");
  } else {
    core_choice = std::string("OPENBLAS_CORETYPE=") + core + ", this CPU's " + isa;
    if (given != nullptr && std::string(given) != core)
      core_choice += std::string(" (the environment's ") + given + " overridden)";
    ::setenv("OPENBLAS_CORETYPE", core, 1);
  }
  library_.reset(::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL));
  if (library_ == nullptr) {
    throw std::runtime_error(std::string("cannot open libopenblas.so.0 (Debian: apt-get install "
                                         "libopenblas0-pthread): ") +
                             ::dlerror());
  }
  const auto symbol = [&](const char* name) {
    void* s = ::dlsym(library_.get(), name);
    if (s == nullptr) throw std::runtime_error(std::string("libopenblas.so.0 lacks ") + name);
    return s;
  };
  sgemm_ = symbol("cblas_sgemm");
  reinterpret_cast<SetThreads>(symbol("openblas_set_num_threads"))(threads);
  corename = reinterpret_cast<GetText>(symbol("openblas_get_corename"))();
  config = reinterpret_cast<GetText>(symbol("openblas_get_config"))();
}

AttnShard EagerAttention::forward(const Shard& q, const Shard& k, const Shard& v, float scale,
                                  ThreadPool& pool) const {
  const auto sgemm = reinterpret_cast<Sgemm>(sgemm_);
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
      sgemm(kRowMajor, kNoTrans, kTrans, n, n, d, scale, q.at(b, h, 0), d, kh, d, 0.0f,
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
      sgemm(kRowMajor, kNoTrans, kNoTrans, n, d, n, 1.0f, scores.data(), n, vh, d, 0.0f,
            out.out.at(b, h, 0), d);
    }
  }
  return out;
}

std::optional<TorchSdpaFigure> time_torch_sdpa(const Problem& p, int repeats, int device,
                                               std::string& why) {
  // The probe goes to python3's stdin as a here-document, its arguments after `-`.
  std::ostringstream cmd;
  cmd << "timeout 300 python3 - " << p.batch << ' ' << p.dims.num_q_heads << ' '
      << p.dims.num_kv_heads << ' ' << p.seq_len << ' ' << p.dims.head_dim << ' ' << repeats << ' '
      << device << " 2>&1 <<'CPDRIFT_PROBE'" << kProbe << "CPDRIFT_PROBE\n";
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    why = "cannot start python3";
    return std::nullopt;
  }
  TorchSdpaFigure best;
  std::array<char, 512> line{};
  std::string last;
  while (std::fgets(line.data(), line.size(), pipe) != nullptr) {
    std::istringstream in(line.data());
    std::string tag;
    in >> tag;
    last = line.data();
    if (tag == "version") {
      in >> best.torch_version;
    } else if (tag == "backend") {
      std::string name;
      double seconds = 0;
      if (in >> name >> seconds && (best.backend.empty() || seconds < best.seconds)) {
        best.backend = name;
        best.seconds = seconds;
      }
    } else if (tag == "error") {
      why = line.data() + 6;
    }
  }
  const int status = pclose(pipe);
  if (!best.backend.empty()) return best;
  if (why.empty()) why = status != 0 ? "python3 probe failed: " + last : "no SDPA backend ran";
  while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
  return std::nullopt;
}

}  // namespace cpd
