// The CUDA backend: the engine's jobs, moved to the device, run by the kernels of this folder,
// and moved back. The FP32 paths give the CPU backend's bits (the layer's projections too); the
// bf16_kernel path is the tensor-core kernel; cublas_unfused is cuBLAS with the softmax in its
// own kernel.

#include <algorithm>
#include <array>
#include <string>

#include "core/errors.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/staging.cuh"
#include "kernels/cuda/unfused.cuh"

namespace cpd {

namespace {

using cuda::Task;

class CudaBackend final : public AttentionBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    CPD_CUDA_CHECK(cudaSetDevice(device));
    CPD_CUDA_CHECK(cudaStreamCreate(&stream_));
    CPD_CUBLAS_CHECK(cublasCreate(&cublas_));
    CPD_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // Deterministic cuBLAS, run to run on one GPU architecture (cuBLAS's reproducibility
    // rule): no atomics, CUBLAS_GEMM_DEFAULT for fixed shapes, one handle on one stream with
    // the handle's default workspace. Not pinned across architectures or cuBLAS versions.
    CPD_CUBLAS_CHECK(cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  ~CudaBackend() override {
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  std::string device() const override { return "cuda:" + std::to_string(device_); }

  Shard generate_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                       InputPrecision precision) override {
    if (problem.layer) {
      // The layer's q, k, v and dO: its projections on the device (project_heads, every output
      // one fma chain: the CPU's bits), the rows' bias, norm, RoPE and rounding on the host.
      ThreadPool pool(1);
      return layer_shard(problem, tensor, shape, precision, pool,
                         [this](std::span<const ProjectionJob> jobs, int dim, int outputs) {
                           project_heads(jobs, dim, outputs);
                         });
    }
    if (problem.inputs && tensor != TensorId::d_out) {
      // Read from the file on the host (--inputs): the CPU's reader and rounding, the same bits.
      ThreadPool pool(1);
      return cpd::generate_shard(problem, tensor, shape, precision, pool);
    }
    const ModelDims& dims = problem.dims;
    if (shape.width != dims.head_dim || dims.rotary_dim != dims.head_dim) {
      throw std::invalid_argument(
          "cuda generate_shard: width and rotary dim must equal the head dim");
    }
    std::vector<long long> positions;
    for (const Range& t : shape.tokens) {
      for (std::int64_t p = t.begin; p < t.end; ++p) positions.push_back(p);
    }
    Shard shard(shape);
    if (shard.data.empty()) return shard;
    const DeviceBuffer<long long> pos = DeviceBuffer<long long>::from(positions);
    const DeviceBuffer<float> inv = DeviceBuffer<float>::from(rope_inv_freq(dims));
    DeviceBuffer<float> out(shard.data.size());
    cuda::generate(cuda::generate_params(problem, tensor, shape.batch, shape.heads, pos.data(),
                                         static_cast<long long>(positions.size()),
                                         precision == InputPrecision::bf16, inv.data(), out.data()),
                   stream_);
    sync();
    out.download(shard.data.data(), shard.data.size());
    return shard;
  }

  void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale,
                      ProbRounding rounding) override {
    if (jobs.empty()) return;
    if (rounding == ProbRounding::bf16) return run_flash(jobs, dim, scale);
    cuda::InputPack<float> in;
    cuda::OutputPack out;
    struct Offsets {
      std::size_t q, k, v, out, lse;
    };
    std::vector<Offsets> at;
    for (const BlockJob& j : jobs) {
      const std::size_t keys = static_cast<std::size_t>(j.keys.size()) * dim,
                        rows = static_cast<std::size_t>(j.rows);
      at.push_back(Offsets{in.add(j.q, rows * dim), in.add(j.k, keys), in.add(j.v, keys),
                           out.add(j.out, rows * dim), out.add(j.lse, rows)});
    }
    in.upload();
    out.allocate();
    std::vector<cuda::RowsJob> dev;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const BlockJob& j = jobs[i];
      dev.push_back(cuda::RowsJob{in.at(at[i].q), j.first_pos, j.rows, in.at(at[i].k),
                                  in.at(at[i].v), j.keys.begin, j.keys.end, out.at(at[i].out),
                                  out.at(at[i].lse)});
    }
    launch_rows(jobs, dev, out, [&](auto* dev_jobs, auto* tasks, long long ntasks) {
      cuda::forward_rows(dev_jobs, tasks, ntasks, dim, scale, stream_);
    });
  }

  void run_fold_jobs(std::span<const FoldJob> paged_or_not, int dim, float scale,
                     ProbRounding rounding) override {
    if (paged_or_not.empty()) return;
    // No paged kernel on the device yet: paged jobs read their pages on the host first.
    std::deque<std::vector<float>> gathered;
    const std::vector<FoldJob> contiguous = contiguous_fold_jobs(paged_or_not, dim, gathered);
    const std::span<const FoldJob> jobs = contiguous;
    if (rounding == ProbRounding::bf16) return fold_via_blocks(jobs, dim, scale);
    cuda::InputPack<float> in;
    cuda::OutputPack out;
    std::vector<long long> blocks;
    struct Offsets {
      std::size_t q, k, v, out, lse, blocks;
      int nblocks;
    };
    std::vector<Offsets> at;
    // One upload per K/V array, as long as the longest reach of the jobs reading it (a GQA
    // group's heads and the steps of a decode share it).
    std::map<const float*, std::size_t> kv_floats;
    for (const FoldJob& j : jobs) {
      for (const float* p : {j.k.row(0, dim), j.v.row(0, dim)})
        kv_floats[p] = std::max(kv_floats[p], static_cast<std::size_t>(fold_reach(j)) * dim);
    }
    for (const FoldJob& j : jobs) {
      const std::size_t rows = static_cast<std::size_t>(j.rows);
      const float *k = j.k.row(0, dim), *v = j.v.row(0, dim);
      Offsets o{
          in.add(j.q, rows * dim),          in.add(k, kv_floats.at(k)), in.add(v, kv_floats.at(v)),
          out.add(j.out, rows * dim),       out.add(j.lse, rows),       blocks.size(),
          static_cast<int>(j.blocks.size())};
      for (const Range& b : j.blocks) {
        blocks.push_back(b.begin);
        blocks.push_back(b.end);
      }
      at.push_back(o);
    }
    in.upload();
    out.allocate();
    const auto dev_blocks = cuda::to_device(blocks);
    std::vector<cuda::DeviceFoldJob> dev;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const FoldJob& j = jobs[i];
      dev.push_back(cuda::DeviceFoldJob{
          in.at(at[i].q), j.first_pos, j.rows, in.at(at[i].k), in.at(at[i].v), j.kv_begin,
          dev_blocks.data() + at[i].blocks, at[i].nblocks, out.at(at[i].out), out.at(at[i].lse)});
    }
    launch_rows(jobs, dev, out, [&](auto* dev_jobs, auto* tasks, long long ntasks) {
      cuda::forward_fold(dev_jobs, tasks, ntasks, dim, scale, stream_);
    });
  }

  void merge_states(std::span<const MergeJob> jobs, int dim) override {
    if (jobs.empty()) return;
    cuda::InputPack<float> in;
    cuda::OutputPack out;
    // Per job, in global block order: its states' out offsets, then their lse offsets.
    std::vector<std::vector<std::size_t>> offsets;
    std::vector<std::size_t> out_at, lse_at;
    for (const MergeJob& j : jobs) {
      std::vector<StateRef> s = j.states;
      std::stable_sort(s.begin(), s.end(), [](const StateRef& a, const StateRef& b) {
        return a.block_index < b.block_index;
      });
      std::vector<std::size_t>& at = offsets.emplace_back();
      for (const StateRef& r : s)
        at.push_back(in.add(r.out, static_cast<std::size_t>(j.rows) * dim));
      for (const StateRef& r : s) at.push_back(in.add(r.lse, static_cast<std::size_t>(j.rows)));
      out_at.push_back(out.add(j.out, static_cast<std::size_t>(j.rows) * dim));
      lse_at.push_back(out.add(j.lse, static_cast<std::size_t>(j.rows)));
    }
    in.upload();
    out.allocate();
    std::vector<const float*> ptrs;
    std::vector<std::size_t> first;
    for (const std::vector<std::size_t>& at : offsets) {
      first.push_back(ptrs.size());
      for (const std::size_t o : at) ptrs.push_back(in.at(o));
    }
    const auto dev_ptrs = cuda::to_device(ptrs);
    std::vector<cuda::DeviceMergeJob> dev;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const int n = static_cast<int>(offsets[i].size() / 2);
      dev.push_back(cuda::DeviceMergeJob{dev_ptrs.data() + first[i], dev_ptrs.data() + first[i] + n,
                                         n, jobs[i].rows, out.at(out_at[i]), out.at(lse_at[i])});
    }
    launch_rows(jobs, dev, out, [&](auto* dev_jobs, auto* tasks, long long ntasks) {
      cuda::merge(dev_jobs, tasks, ntasks, dim, stream_);
    });
  }

  void run_backward_units(std::span<const BackwardUnit> units, int dim, float scale) override {
    if (units.empty()) return;
    cuda::InputPack<float> in;
    cuda::OutputPack out;
    struct BlockAt {
      std::size_t q, d_out, lse, delta, dq;
    };
    std::vector<std::vector<BlockAt>> block_at(units.size());
    std::vector<std::size_t> k_at, v_at, dk_at, dv_at;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const BackwardUnit& unit = units[u];
      const std::size_t keys = static_cast<std::size_t>(unit.keys.size()) * dim;
      k_at.push_back(in.add(unit.k, keys));
      v_at.push_back(in.add(unit.v, keys));
      dk_at.push_back(out.add(unit.dk_total, keys, unit.accumulate));
      dv_at.push_back(out.add(unit.dv_total, keys, unit.accumulate));
      for (const QueryBlockRows& b : unit.blocks) {
        const std::size_t rows = static_cast<std::size_t>(b.tokens.size());
        block_at[u].push_back(BlockAt{in.add(b.q, rows * dim), in.add(b.d_out, rows * dim),
                                      in.add(b.lse, rows), in.add(b.delta, rows),
                                      out.add(b.dq_partial, rows * dim)});
      }
    }
    in.upload();
    out.allocate();
    std::vector<cuda::DeviceBackwardBlock> blocks;
    std::vector<std::size_t> first_block;
    for (std::size_t u = 0; u < units.size(); ++u) {
      first_block.push_back(blocks.size());
      for (std::size_t b = 0; b < units[u].blocks.size(); ++b) {
        const QueryBlockRows& qb = units[u].blocks[b];
        const BlockAt& a = block_at[u][b];
        blocks.push_back(cuda::DeviceBackwardBlock{qb.tokens.begin, qb.tokens.end, in.at(a.q),
                                                   in.at(a.d_out), in.at(a.lse), in.at(a.delta),
                                                   out.at(a.dq)});
      }
    }
    const auto dev_blocks = cuda::to_device(blocks);
    std::vector<cuda::DeviceBackwardUnit> dev;
    std::vector<Task> dq_tasks, key_tasks;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const BackwardUnit& unit = units[u];
      dev.push_back(cuda::DeviceBackwardUnit{
          dev_blocks.data() + first_block[u], static_cast<int>(unit.blocks.size()), in.at(k_at[u]),
          in.at(v_at[u]), unit.keys.begin, unit.keys.end, out.at(dk_at[u]), out.at(dv_at[u]),
          unit.accumulate ? 1 : 0});
      long long rows = 0;
      for (const QueryBlockRows& b : unit.blocks) rows += b.tokens.size();
      for (long long r = 0; r < rows; ++r)
        dq_tasks.push_back(Task{static_cast<int>(u), static_cast<int>(r)});
      for (long long j = 0; j < unit.keys.size(); ++j)
        key_tasks.push_back(Task{static_cast<int>(u), static_cast<int>(j)});
    }
    const auto dev_units = cuda::to_device(dev);
    const auto dev_dq = cuda::to_device(dq_tasks);
    const auto dev_keys = cuda::to_device(key_tasks);
    cuda::backward_dq(dev_units.data(), dev_dq.data(), static_cast<long long>(dq_tasks.size()), dim,
                      scale, stream_);
    cuda::backward_dkdv(dev_units.data(), dev_keys.data(), static_cast<long long>(key_tasks.size()),
                        dim, scale, stream_);
    sync();
    out.download();
  }

  void project_heads(std::span<const ProjectionJob> jobs, int dim, int vocab) override {
    if (jobs.empty()) return;
    cuda::InputPack<float> in;
    cuda::OutputPack out;
    std::vector<std::array<std::size_t, 3>> at;
    for (const ProjectionJob& j : jobs) {
      const std::size_t rows = static_cast<std::size_t>(j.rows);
      at.push_back({in.add(j.hidden, rows * dim),
                    in.add(j.w, static_cast<std::size_t>((vocab - 1) * j.ldw + dim)),
                    out.add(j.z, rows * vocab)});
    }
    in.upload();
    out.allocate();
    std::vector<cuda::DeviceProjectionJob> dev;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      dev.push_back(cuda::DeviceProjectionJob{in.at(at[i][0]), jobs[i].rows, in.at(at[i][1]),
                                              jobs[i].ldw, out.at(at[i][2])});
    }
    launch_rows(jobs, dev, out, [&](auto* dev_jobs, auto* tasks, long long ntasks) {
      cuda::project(dev_jobs, tasks, ntasks, dim, vocab, stream_);
    });
  }

  bool has_bf16_gemm_projection() const override { return true; }
  void project_heads_bf16_gemm(std::span<const ProjectionJob> jobs, int dim, int outputs) override {
    cuda::project_bf16_gemm(cublas_, stream_, jobs, dim, outputs);
  }

  bool has_unfused_gemm() const override { return true; }
  void run_unfused_jobs(std::span<const BlockJob> jobs, int dim, float scale) override {
    cuda::run_unfused(cublas_, stream_, jobs, dim, scale);
  }

 private:
  void sync() { CPD_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // `launch` over one task per (job, row) for the device copy of `dev`, then the outputs back.
  template <class Job, class DevJob, class Launch>
  void launch_rows(std::span<const Job> jobs, const std::vector<DevJob>& dev, cuda::OutputPack& out,
                   const Launch& launch) {
    std::vector<Task> tasks;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      for (long long r = 0; r < jobs[j].rows; ++r)
        tasks.push_back(Task{static_cast<int>(j), static_cast<int>(r)});
    }
    const auto dev_jobs = cuda::to_device(dev);
    const auto dev_tasks = cuda::to_device(tasks);
    launch(dev_jobs.data(), dev_tasks.data(), static_cast<long long>(tasks.size()));
    sync();
    out.download();
  }

  void run_flash(std::span<const BlockJob> jobs, int dim, float scale) {
    if (dim != 128) throw std::invalid_argument("the tensor-core bf16 kernel needs head dim 128");
    cuda::InputPack<std::uint16_t> in;
    cuda::OutputPack out;
    std::vector<std::array<std::size_t, 5>> at;
    for (const BlockJob& j : jobs) {
      const std::size_t keys = static_cast<std::size_t>(j.keys.size()) * dim,
                        rows = static_cast<std::size_t>(j.rows);
      at.push_back({in.add(j.q, rows * dim), in.add(j.k, keys), in.add(j.v, keys),
                    out.add(j.out, rows * dim), out.add(j.lse, rows)});
    }
    in.upload();
    out.allocate();
    std::vector<cuda::FlashJob> dev;
    std::vector<Task> tiles;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const BlockJob& j = jobs[i];
      dev.push_back(cuda::FlashJob{in.at(at[i][0]), j.first_pos, j.rows, in.at(at[i][1]),
                                   in.at(at[i][2]), j.keys.begin, j.keys.end, out.at(at[i][3]),
                                   out.at(at[i][4])});
      for (long long t = 0; t * cuda::kFlashRows < j.rows; ++t)
        tiles.push_back(Task{static_cast<int>(i), static_cast<int>(t)});
    }
    const auto dev_jobs = cuda::to_device(dev);
    const auto dev_tiles = cuda::to_device(tiles);
    cuda::flash_bf16(dev_jobs.data(), dev_tiles.data(), static_cast<long long>(tiles.size()), scale,
                     stream_);
    sync();
    out.download();
  }

  // A bf16 fold: the tensor-core states of every block, then the ordered merge.
  void fold_via_blocks(std::span<const FoldJob> jobs, int dim, float scale) {
    std::vector<BlockJob> blocks;
    std::vector<std::vector<float>> states;  // per block job: out then lse
    std::vector<MergeJob> merges;
    for (const FoldJob& j : jobs) {
      MergeJob m;
      m.rows = j.rows;
      m.out = j.out;
      m.lse = j.lse;
      for (std::size_t b = 0; b < j.blocks.size(); ++b) {
        // Keys past the last row are masked for every row: the block stops there (the same
        // bits, and nothing read past what the job's K/V hold; see fold_reach).
        const Range r{j.blocks[b].begin, std::min(j.blocks[b].end, j.first_pos + j.rows)};
        if (r.empty()) break;
        states.emplace_back(static_cast<std::size_t>(j.rows) * (dim + 1));
        float* s = states.back().data();
        blocks.push_back(BlockJob{j.q, j.first_pos, j.rows, j.k.row(r.begin - j.kv_begin, dim),
                                  j.v.row(r.begin - j.kv_begin, dim), r, s, s + j.rows * dim});
        m.states.push_back(StateRef{static_cast<int>(b), s, s + j.rows * dim});
      }
      merges.push_back(std::move(m));
    }
    run_flash(blocks, dim, scale);
    merge_states(merges, dim);
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cuda_backend(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw UsageError("--device cuda: no CUDA device is visible to this process");
  }
  if (device < 0 || device >= count) {
    throw UsageError("--device cuda: device " + std::to_string(device) + " does not exist (" +
                     std::to_string(count) + " visible)");
  }
  return std::make_unique<CudaBackend>(device);
}

bool cuda_backend_built() { return true; }

std::string cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here
    return 0;
  }
  return count;
}

}  // namespace cpd
