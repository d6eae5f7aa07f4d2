// The bench's eager baseline (OpenBLAS SGEMM, masked softmax, SGEMM) is a baseline only if it
// computes causal attention: its out and lse against the FP64 oracle, and its core type. And
// the SDPA probe reaches python3 with its problem, whose answer is read back.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "cli/bench_baselines.h"
#include "fp64_attention.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/simd_info.h"
#include "temp_dir.h"

using namespace cpd;

TEST_CASE("eager baseline: causal attention within FP32 rounding of the FP64 oracle") {
  Problem p;
  p.seq_len = 96;
  p.batch = 2;
  ThreadPool pool(2);
  const Range all{0, p.seq_len};
  const Shard q = generate_shard(p, TensorId::q, {p.batch, {0, p.dims.num_q_heads}, {all}, 128},
                                 InputPrecision::fp32, pool);
  const Shard k = generate_shard(p, TensorId::k, {p.batch, {0, p.dims.num_kv_heads}, {all}, 128},
                                 InputPrecision::fp32, pool);
  const Shard v = generate_shard(p, TensorId::v, {p.batch, {0, p.dims.num_kv_heads}, {all}, 128},
                                 InputPrecision::fp32, pool);
  const EagerAttention eager(2);
  if (cpu_simd_isa() == std::string("avx512")) CHECK(eager.corename == "SkylakeX");
  const AttnShard got = eager.forward(q, k, v, p.dims.softmax_scale(), pool);
  // FP32 products over D = 128 and sums over ≤ 96 keys, each rounding ≤ 2^-24 relative, on
  // values of magnitude ≲ 4: well inside 1e-5; a wrong mask or scale is off by ≳ 1e-2.
  double worst_out = 0, worst_lse = 0;
  std::vector<double> out;
  const int group = p.dims.group_size();
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.dims.num_q_heads; ++h) {
      for (std::int64_t i = 0; i < p.seq_len; ++i) {
        double lse = 0;
        testing::attention_fp64(q.at(b, h, i), k.at(b, h / group, 0), v.at(b, h / group, 0), i + 1,
                                128, p.dims.softmax_scale(), out, lse);
        for (int d = 0; d < 128; ++d)
          worst_out = std::max(worst_out, std::abs(got.out.at(b, h, i)[d] - out[d]));
        worst_lse = std::max(worst_lse, std::abs(*got.lse.at(b, h, i) - lse));
      }
    }
  }
  CHECK(worst_out < 1e-5);
  CHECK(worst_lse < 1e-5);
  CHECK(worst_out > 0);  // it is an independent computation, not a copy of the oracle's bits
}

TEST_CASE("eager baseline: a non-causal run is caught (negative control)") {
  Problem p;
  p.seq_len = 32;
  ThreadPool pool(1);
  const Range all{0, p.seq_len};
  const Shard q =
      generate_shard(p, TensorId::q, {1, {0, 1}, {all}, 128}, InputPrecision::fp32, pool);
  const Shard k =
      generate_shard(p, TensorId::k, {1, {0, 1}, {all}, 128}, InputPrecision::fp32, pool);
  const Shard v =
      generate_shard(p, TensorId::v, {1, {0, 1}, {all}, 128}, InputPrecision::fp32, pool);
  const AttnShard got = EagerAttention(1).forward(q, k, v, p.dims.softmax_scale(), pool);
  std::vector<double> out;
  double lse = 0;
  // Row 0 against every key (no mask) differs from the causal row 0 (its own key only).
  testing::attention_fp64(q.at(0, 0, 0), k.at(0, 0, 0), v.at(0, 0, 0), p.seq_len, 128,
                          p.dims.softmax_scale(), out, lse);
  CHECK(std::abs(*got.lse.at(0, 0, 0) - lse) > 1e-2);
}

// A stand-in torch whose CUDA events say S milliseconds (S from the probe's arguments): the
// probe, sent to python3 as a here-document, runs with the problem's shape, and the fastest
// backend comes back with its median.
constexpr const char* kFakeTorch = R"PY(
import contextlib, sys, types
__version__ = "fake"
bfloat16 = None
class _Tensor:
    def repeat_interleave(self, *args, **kwargs): return self
def randn(*args, **kwargs): return _Tensor()
class _Event:
    def __init__(self, enable_timing=False): pass
    def record(self): pass
    def synchronize(self): pass
    def elapsed_time(self, end): return float(sys.argv[4])
cuda = types.SimpleNamespace(is_available=lambda: True, set_device=lambda d: None,
                             synchronize=lambda: None, Event=_Event)
nn = types.ModuleType("torch.nn")
nn.functional = types.ModuleType("torch.nn.functional")
nn.functional.scaled_dot_product_attention = lambda q, k, v, is_causal: None
nn.attention = types.ModuleType("torch.nn.attention")
nn.attention.SDPBackend = types.SimpleNamespace(FLASH_ATTENTION=1, EFFICIENT_ATTENTION=2)
nn.attention.sdpa_kernel = contextlib.nullcontext
sys.modules.update({"torch.nn": nn, "torch.nn.functional": nn.functional,
                    "torch.nn.attention": nn.attention})
)PY";

TEST_CASE("torch SDPA probe: the script and the problem reach python3, the answer comes back") {
  const testing::TempDir dir("cpdrift_fake_torch");
  std::filesystem::create_directory(dir.path / "torch");
  dir.write("torch/__init__.py", kFakeTorch);
  const char* before = std::getenv("PYTHONPATH");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("PYTHONPATH", dir.path.c_str(), 1);
  Problem p;
  p.seq_len = 96;
  std::string why;
  const std::optional<TorchSdpaFigure> f = time_torch_sdpa(p, 3, 0, why);
  if (before != nullptr) {
    ::setenv("PYTHONPATH", saved.c_str(), 1);
  } else {
    ::unsetenv("PYTHONPATH");
  }
  REQUIRE_MESSAGE(f.has_value(), why);
  CHECK(f->backend == "FLASH_ATTENTION");  // the first of two equally fast
  CHECK(f->seconds == doctest::Approx(0.096));
  CHECK(f->torch_version == "fake");
}
