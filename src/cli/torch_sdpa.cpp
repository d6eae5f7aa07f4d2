#include "cli/torch_sdpa.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <sstream>

namespace cpd {
namespace {

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

std::optional<TorchSdpaFigure> time_torch_sdpa(const Problem& p, int repeats, int device,
                                               std::string& why) {
  const std::string path = "/tmp/cpdrift_sdpa_probe_" + std::to_string(::getpid()) + ".py";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(kProbe, f);
    std::fclose(f);
  } else {
    why = "cannot write " + path;
    return std::nullopt;
  }
  std::ostringstream cmd;
  cmd << "timeout 300 python3 " << path << ' ' << p.batch << ' ' << p.dims.num_q_heads << ' '
      << p.dims.num_kv_heads << ' ' << p.seq_len << ' ' << p.dims.head_dim << ' ' << repeats << ' '
      << device << " 2>&1";
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    std::remove(path.c_str());
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
  std::remove(path.c_str());
  if (!best.backend.empty()) return best;
  if (why.empty()) why = status != 0 ? "python3 probe failed: " + last : "no SDPA backend ran";
  while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
  return std::nullopt;
}

}  // namespace cpd
