// `cpdrift bench --device cuda`: device-resident inputs, CUDA-event timing of the FP32 canonical
// kernel, the tensor-core bf16 kernel and the cuBLAS unfused path on the causal CP=1 problem, and
// of the layer's q_proj (canonical FP32 and cuBLAS BF16).
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "cpdrift/bf16.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_buffer.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/unfused.cuh"
#include "kernels/layer_weights.h"
#include "kernels/projection_gemm.h"

namespace cpd {
namespace {

using cuda::Task;

__global__ void to_bf16_kernel(const float* in, std::uint16_t* out, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bf16_bits_rn(in[i]);
}

// Owners of the handles the bench creates, released on every exit path.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CPD_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() { CPD_CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }
};
struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() { CPD_CUBLAS_CHECK(cublasCreate(&h)); }
  ~Cublas() { cublasDestroy(h); }
};

// Median of `repeats` runs of `work`, in seconds, by CUDA events.
template <class Work>
double time_median(int repeats, cudaStream_t stream, Work&& work) {
  Event start_event, stop_event;
  cudaEvent_t start = start_event.e, stop = stop_event.e;
  work();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    CPD_CUDA_CHECK(cudaEventRecord(start, stream));
    work();
    CPD_CUDA_CHECK(cudaEventRecord(stop, stream));
    CPD_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CPD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

DeviceBuffer<float> generate(const Problem& p, TensorId t, int heads,
                             const DeviceBuffer<long long>& positions,
                             const DeviceBuffer<float>& inv, cudaStream_t stream) {
  DeviceBuffer<float> out(static_cast<std::size_t>(p.batch) * heads * p.seq_len * p.dims.head_dim);
  cuda::generate(cuda::generate_params(p, t, p.batch, Range{0, heads}, positions.data(), p.seq_len,
                                       false, inv.data(), out.data()),
                 stream);
  return out;
}

DeviceBuffer<std::uint16_t> bf16_copy(const DeviceBuffer<float>& in, cudaStream_t stream) {
  DeviceBuffer<std::uint16_t> out(in.size());
  const long long n = static_cast<long long>(in.size());
  to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(in.data(), out.data(),
                                                                             n);
  CPD_CUDA_CHECK_LAUNCH();
  return out;
}

// Element offsets of one (batch, query head) in the [B][H][S][D] buffers: its q/out rows, its
// GQA group's k/v rows, and its lse row.
struct HeadOffsets {
  long long q, kv, lse;
};

template <class Visit>
void for_each_head(const Problem& p, Visit&& visit) {
  const long long s = p.seq_len, d = p.dims.head_dim;
  const int hq = p.dims.num_q_heads, hkv = p.dims.num_kv_heads, group = p.dims.group_size();
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < hq; ++h) {
      const long long row = static_cast<long long>(b) * hq + h;
      visit(
          HeadOffsets{row * s * d, (static_cast<long long>(b) * hkv + h / group) * s * d, row * s});
    }
  }
}

// The FP32 canonical kernel: one fold job (one block [0, S)) per (batch, head).
double time_fp32(const Problem& p, int repeats, cudaStream_t stream, const DeviceBuffer<float>& q,
                 const DeviceBuffer<float>& k, const DeviceBuffer<float>& v,
                 DeviceBuffer<float>& out, DeviceBuffer<float>& lse) {
  const long long s = p.seq_len;
  const std::vector<long long> block{0, s};
  const auto dev_block = DeviceBuffer<long long>::from(block);
  std::vector<cuda::DeviceFoldJob> jobs;
  std::vector<Task> tasks;
  for_each_head(p, [&](const HeadOffsets& o) {
    jobs.push_back(cuda::DeviceFoldJob{q.data() + o.q, 0, s, k.data() + o.kv, v.data() + o.kv, 0,
                                       dev_block.data(), 1, out.data() + o.q, lse.data() + o.lse});
    for (long long r = 0; r < s; ++r)
      tasks.push_back(Task{static_cast<int>(jobs.size() - 1), static_cast<int>(r)});
  });
  const auto dev_jobs = DeviceBuffer<cuda::DeviceFoldJob>::from(jobs);
  const auto dev_tasks = DeviceBuffer<Task>::from(tasks);
  return time_median(repeats, stream, [&] {
    cuda::forward_fold(dev_jobs.data(), dev_tasks.data(), static_cast<long long>(tasks.size()),
                       p.dims.head_dim, p.dims.softmax_scale(), stream);
  });
}

// The tensor-core kernel: one job per (batch, head), 64-row tiles.
double time_flash(const Problem& p, int repeats, cudaStream_t stream,
                  const DeviceBuffer<std::uint16_t>& q16, const DeviceBuffer<std::uint16_t>& k16,
                  const DeviceBuffer<std::uint16_t>& v16, DeviceBuffer<float>& out,
                  DeviceBuffer<float>& lse) {
  const long long s = p.seq_len;
  std::vector<cuda::FlashJob> jobs;
  std::vector<Task> tiles;
  for_each_head(p, [&](const HeadOffsets& o) {
    jobs.push_back(cuda::FlashJob{q16.data() + o.q, 0, s, k16.data() + o.kv, v16.data() + o.kv, 0,
                                  s, out.data() + o.q, lse.data() + o.lse});
    for (long long t = 0; t * cuda::kFlashRows < s; ++t)
      tiles.push_back(Task{static_cast<int>(jobs.size() - 1), static_cast<int>(t)});
  });
  // Heaviest tiles (the last rows see the most keys) first.
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Task& a, const Task& b) { return a.item > b.item; });
  const auto dev_jobs = DeviceBuffer<cuda::FlashJob>::from(jobs);
  const auto dev_tiles = DeviceBuffer<Task>::from(tiles);
  return time_median(repeats, stream, [&] {
    cuda::flash_bf16(dev_jobs.data(), dev_tiles.data(), static_cast<long long>(tiles.size()),
                     p.dims.softmax_scale(), stream);
  });
}

// cuBLAS unfused, one GQA group (4 query heads) at a time: S = Q Kᵀ, softmax, O = P V (the
// path's final O / l pass, one read and write of O, is left out of the timing).
double time_cublas(const Problem& p, int repeats, cudaStream_t stream,
                   const DeviceBuffer<std::uint16_t>& q16, const DeviceBuffer<std::uint16_t>& k16,
                   const DeviceBuffer<std::uint16_t>& v16) {
  const int d = p.dims.head_dim, hq = p.dims.num_q_heads, hkv = p.dims.num_kv_heads,
            group = p.dims.group_size();
  const long long s = p.seq_len;
  const float scale = p.dims.softmax_scale();
  const Cublas owned_handle;
  const cublasHandle_t handle = owned_handle.h;
  CPD_CUBLAS_CHECK(cublasSetStream(handle, stream));
  CPD_CUBLAS_CHECK(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
  DeviceBuffer<float> scores(static_cast<std::size_t>(group) * s * s);
  DeviceBuffer<std::uint16_t> probs(scores.size());
  DeviceBuffer<float> o(static_cast<std::size_t>(group) * s * d),
      l(static_cast<std::size_t>(group) * s), row_lse(l.size());
  const auto first =
      DeviceBuffer<long long>::from(std::vector<long long>(static_cast<std::size_t>(group), 0));
  const auto key_end =
      DeviceBuffer<long long>::from(std::vector<long long>(static_cast<std::size_t>(group), s));
  const float one = 1.0f, zero = 0.0f;
  const auto work = [&] {
    for (int b = 0; b < p.batch; ++b) {
      for (int g = 0; g < hkv; ++g) {
        const long long qo = (static_cast<long long>(b) * hq + g * group) * s * d,
                        ko = (static_cast<long long>(b) * hkv + g) * s * d;
        CPD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s), static_cast<int>(s), d, &one,
            k16.data() + ko, CUDA_R_16BF, d, 0, q16.data() + qo, CUDA_R_16BF, d, s * d, &zero,
            scores.data(), CUDA_R_32F, static_cast<int>(s), s * s, group, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
        cuda::softmax_rows(scores.data(), probs.data(), l.data(), row_lse.data(), first.data(),
                           first.data(), key_end.data(), group, s, s, scale, stream);
        CPD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, d, static_cast<int>(s), static_cast<int>(s), &one,
            v16.data() + ko, CUDA_R_16BF, d, 0, probs.data(), CUDA_R_16BF, static_cast<int>(s),
            s * s, &zero, o.data(), CUDA_R_32F, d, s * d, group, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      }
    }
  };
  return time_median(repeats, stream, work);
}

// The layer's q_proj over every token: X [B·S][hidden] against W [Hq·D][hidden], the layer's own
// hidden states and weights. The canonical FP32 projection (one sequential fma chain an output:
// the kernel the layer runs on the device) one job a head; the cuBLAS BF16 path as a production
// stack runs it, one GEMM for the whole projection (kernels/projection_gemm.h).
std::vector<DeviceBenchFigure> time_q_proj(const Problem& problem, int repeats,
                                           cudaStream_t stream) {
  Problem p = with_layer_weights([&] {
    Problem l = problem;
    l.layer = true;
    return l;
  }());
  const int hidden = p.dims.hidden_size, d = p.dims.head_dim, hq = p.dims.num_q_heads;
  const long long rows = static_cast<long long>(p.batch) * p.seq_len, width = hq * d;
  std::vector<float> x(static_cast<std::size_t>(rows) * hidden),
      w(static_cast<std::size_t>(width) * hidden);
  for (int b = 0; b < p.batch; ++b)
    layer_hidden_rows(p, b, Range{0, p.seq_len}, x.data() + b * p.seq_len * hidden);
  for (int h = 0; h < hq; ++h) {
    std::copy_n(p.weights->projection(TensorId::q, h), static_cast<std::size_t>(d) * hidden,
                w.data() + static_cast<std::size_t>(h) * d * hidden);
  }
  const auto dx = DeviceBuffer<float>::from(x), dw = DeviceBuffer<float>::from(w);
  DeviceBuffer<float> z(static_cast<std::size_t>(rows) * width);
  const double flops = 2.0 * static_cast<double>(rows) * hidden * static_cast<double>(width);
  std::vector<DeviceBenchFigure> figures;

  std::vector<cuda::DeviceProjectionJob> jobs;
  std::vector<Task> tasks;
  for (int h = 0; h < hq; ++h) {
    jobs.push_back(cuda::DeviceProjectionJob{
        dx.data(), rows, dw.data() + static_cast<std::size_t>(h) * d * hidden, hidden,
        z.data() + static_cast<std::size_t>(h) * rows * d});
    for (long long r = 0; r < rows; ++r) tasks.push_back(Task{h, static_cast<int>(r)});
  }
  const auto dev_jobs = DeviceBuffer<cuda::DeviceProjectionJob>::from(jobs);
  const auto dev_tasks = DeviceBuffer<Task>::from(tasks);
  figures.push_back({"q_proj fp32_canonical",
                     time_median(repeats, stream,
                                 [&] {
                                   cuda::project(dev_jobs.data(), dev_tasks.data(),
                                                 static_cast<long long>(tasks.size()), hidden, d,
                                                 stream);
                                 }),
                     flops});

  const DeviceBuffer<std::uint16_t> x16 = bf16_copy(dx, stream), w16 = bf16_copy(dw, stream);
  const Cublas owned_handle;
  CPD_CUBLAS_CHECK(cublasSetStream(owned_handle.h, stream));
  CPD_CUBLAS_CHECK(cublasSetAtomicsMode(owned_handle.h, CUBLAS_ATOMICS_NOT_ALLOWED));
  const ColumnMajorGemm g = projection_gemm(rows, hidden, static_cast<int>(width));
  const float one = 1.0f, zero = 0.0f;
  figures.push_back({"q_proj cublas_bf16",
                     time_median(repeats, stream,
                                 [&] {
                                   CPD_CUBLAS_CHECK(cublasGemmEx(
                                       owned_handle.h, CUBLAS_OP_T, CUBLAS_OP_N, g.m, g.n, g.k,
                                       &one, w16.data(), CUDA_R_16BF, g.lda, x16.data(),
                                       CUDA_R_16BF, g.ldb, &zero, z.data(), CUDA_R_32F, g.ldc,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                                 }),
                     flops});
  return figures;
}

}  // namespace

std::vector<DeviceBenchFigure> cuda_bench(const Problem& p, int repeats, int device) {
  CPD_CUDA_CHECK(cudaSetDevice(device));
  const Stream owned_stream;
  const cudaStream_t stream = owned_stream.s;
  const int hq = p.dims.num_q_heads, hkv = p.dims.num_kv_heads;
  const long long s = p.seq_len;
  std::vector<long long> pos(static_cast<std::size_t>(s));
  for (long long i = 0; i < s; ++i) pos[static_cast<std::size_t>(i)] = i;
  const auto positions = DeviceBuffer<long long>::from(pos);
  const auto inv = DeviceBuffer<float>::from(rope_inv_freq(p.dims));
  const DeviceBuffer<float> q = generate(p, TensorId::q, hq, positions, inv, stream);
  const DeviceBuffer<float> k = generate(p, TensorId::k, hkv, positions, inv, stream);
  const DeviceBuffer<float> v = generate(p, TensorId::v, hkv, positions, inv, stream);
  DeviceBuffer<float> out(q.size()), lse(static_cast<std::size_t>(p.batch) * hq * s);
  std::vector<DeviceBenchFigure> figures;
  figures.push_back({"fp32_reference", time_fp32(p, repeats, stream, q, k, v, out, lse)});
  const DeviceBuffer<std::uint16_t> q16 = bf16_copy(q, stream), k16 = bf16_copy(k, stream),
                                    v16 = bf16_copy(v, stream);
  figures.push_back({"bf16_kernel", time_flash(p, repeats, stream, q16, k16, v16, out, lse)});
  figures.push_back({"cublas_unfused", time_cublas(p, repeats, stream, q16, k16, v16)});
  for (DeviceBenchFigure& f : time_q_proj(p, repeats, stream)) figures.push_back(std::move(f));
  CPD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return figures;
}

}  // namespace cpd
