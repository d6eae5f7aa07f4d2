// The bf16_kernel path on the GPU: a FlashAttention-2 style forward on the tensor cores
// (mma.sync m16n8k16, BF16 in, FP32 accumulate), one 64-row query tile per CUDA block, key
// tiles of 64 from the KV block's start, online softmax, P rounded to BF16 for P·V, FP32
// (out, lse) per KV block of the global grid.
//
// Row- and block-independent, so topology invariance holds on the GPU too: every element of a
// row depends only on that row, the block and the inputs (the tensor core's accumulation order
// for an element is fixed; the row statistics are reduced in a fixed order within the quad of
// threads that holds the row), key tiles start at the block's start, and a key tile in which a
// row sees no key leaves that row's state untouched whether or not the tile runs for other rows.
#include <cstdint>

#include "cpdrift/attention_math.h"
#include "cpdrift/bf16.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"

namespace cpd::cuda {
namespace {

constexpr int kD = 128;            // head dim
constexpr int kRows = kFlashRows;  // query rows per block: 4 warps × 16
constexpr int kKeys = 64;          // keys per tile
constexpr int kKStride = kD + 8;   // padded shared row (bf16), no bank conflicts on B loads
constexpr int kVtStride = kKeys + 8;

__device__ __forceinline__ void mma_bf16(float c[4], const std::uint32_t a[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  return static_cast<std::uint32_t>(bf16_bits_rn(lo)) |
         (static_cast<std::uint32_t>(bf16_bits_rn(hi)) << 16);
}

__device__ __forceinline__ std::uint32_t load_pair(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// Row max / sum over the four threads (lane % 4) that hold a row, in a fixed order.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = x + __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Q of this thread's rows row0 and row1 as A fragments: 8 k-steps of 16 columns.
__device__ __forceinline__ void load_q(const FlashJob& job, long long row0, long long row1,
                                       bool has0, bool has1, int t4, std::uint32_t (&qa)[8][4]) {
  for (int ks = 0; ks < 8; ++ks) {
    const int c = ks * 16 + t4 * 2;
    qa[ks][0] = has0 ? load_pair(job.q + row0 * kD + c) : 0u;
    qa[ks][1] = has1 ? load_pair(job.q + row1 * kD + c) : 0u;
    qa[ks][2] = has0 ? load_pair(job.q + row0 * kD + c + 8) : 0u;
    qa[ks][3] = has1 ? load_pair(job.q + row1 * kD + c + 8) : 0u;
  }
}

// The K tile of keys kt … (row-major) and the V tile (transposed) into shared memory, by the
// whole block; keys past the block are 0.
__device__ __forceinline__ void load_kv_tile(const FlashJob& job, long long kt, std::uint16_t* sk,
                                             std::uint16_t* svt) {
  for (int x = threadIdx.x; x < kKeys * (kD / 8); x += blockDim.x) {
    const int n = x / (kD / 8), c = (x % (kD / 8)) * 8;
    const long long key = kt + n;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
    if (key < job.key_end) {
      kv = *reinterpret_cast<const uint4*>(job.k + (key - job.key_begin) * kD + c);
      vv = *reinterpret_cast<const uint4*>(job.v + (key - job.key_begin) * kD + c);
    }
    *reinterpret_cast<uint4*>(sk + n * kKStride + c) = kv;
    const std::uint16_t* ve = reinterpret_cast<const std::uint16_t*>(&vv);
    for (int e = 0; e < 8; ++e) svt[(c + e) * kVtStride + n] = ve[e];
  }
}

// S = Q Kᵀ for this warp's 16 rows × 64 keys.
__device__ __forceinline__ void tile_scores(const std::uint32_t (&qa)[8][4],
                                            const std::uint16_t* sk, int g, int t4,
                                            float (&s)[8][4]) {
  for (int nt = 0; nt < 8; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const std::uint16_t* kr = sk + (nt * 8 + g) * kKStride + t4 * 2;
    for (int ks = 0; ks < 8; ++ks)
      mma_bf16(s[nt], qa[ks], load_pair(kr + ks * 16), load_pair(kr + ks * 16 + 8));
  }
}

// The block's state of this thread's rows: out = O / l, lse = m + log l; a row that saw no
// key: (0, -inf).
__device__ __forceinline__ void write_state(const FlashJob& job, long long row0, long long row1,
                                            int t4, const float (&o)[16][4], const float (&m)[2],
                                            const float (&l)[2]) {
  for (int r = 0; r < 2; ++r) {
    const long long row = r == 0 ? row0 : row1;
    if (row >= job.rows) continue;
    const bool any = l[r] > 0.0f;
    float* out = job.out + row * kD;
    for (int dt = 0; dt < 16; ++dt) {
      const int c = dt * 8 + t4 * 2;
      out[c] = any ? o[dt][2 * r] / l[r] : 0.0f;
      out[c + 1] = any ? o[dt][2 * r + 1] / l[r] : 0.0f;
    }
    if (t4 == 0) job.lse[row] = any ? m[r] + log_f32(l[r]) : neg_inf_f32();
  }
}

__global__ void __launch_bounds__(128)
    flash_kernel(const FlashJob* jobs, const Task* tiles, float scale) {
  __shared__ __align__(16) std::uint16_t sk[kKeys * kKStride];
  __shared__ __align__(16) std::uint16_t svt[kD * kVtStride];
  const Task task = tiles[blockIdx.x];
  const FlashJob& job = jobs[task.job];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const long long tile_row = static_cast<long long>(task.item) * kRows;
  const long long row0 = tile_row + warp * 16 + g,
                  row1 = row0 + 8;  // the two rows this thread holds
  const long long pos0 = job.first_pos + row0, pos1 = job.first_pos + row1;
  const bool has0 = row0 < job.rows, has1 = row1 < job.rows;

  std::uint32_t qa[8][4];
  load_q(job, row0, row1, has0, has1, t4, qa);

  float o[16][4];
  for (auto& x : o) x[0] = x[1] = x[2] = x[3] = 0.0f;
  float m[2] = {neg_inf_f32(), neg_inf_f32()}, l[2] = {0.0f, 0.0f};

  const long long last_pos = job.first_pos + min(tile_row + kRows, job.rows) - 1;
  const long long key_stop = min(job.key_end, last_pos + 1);  // causal: later keys see no row here
  for (long long kt = job.key_begin; kt < key_stop; kt += kKeys) {
    load_kv_tile(job, kt, sk, svt);
    __syncthreads();

    float s[8][4];
    tile_scores(qa, sk, g, t4, s);
    // Scale, causal mask by global position, the block's end; this tile's row max.
    float tmax[2] = {neg_inf_f32(), neg_inf_f32()};
    for (int nt = 0; nt < 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const long long key = kt + nt * 8 + t4 * 2 + (e & 1);
        const long long pos = e < 2 ? pos0 : pos1;
        const bool visible = key < job.key_end && key <= pos;
        s[nt][e] = visible ? s[nt][e] * scale : neg_inf_f32();
        tmax[e / 2] = fmaxf(tmax[e / 2], s[nt][e]);
      }
    }
    float factor[2], mnew[2];
    bool sees[2];
    for (int r = 0; r < 2; ++r) {
      tmax[r] = quad_max(tmax[r]);
      sees[r] = tmax[r] != neg_inf_f32();  // the row sees a key of this tile
      mnew[r] = fmaxf(m[r], tmax[r]);
      factor[r] = m[r] == neg_inf_f32() ? 0.0f : exp_f32(m[r] - mnew[r]);
    }
    // P = exp(S - m), its row sums (FP32), and P as BF16 A fragments for P·V.
    float psum[2] = {0.0f, 0.0f};
    std::uint32_t pa[4][4];
    for (int nt = 0; nt < 8; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        s[nt][e] = sees[r] ? exp_f32(s[nt][e] - mnew[r]) : 0.0f;
        psum[r] = psum[r] + s[nt][e];
      }
    }
    for (int ks = 0; ks < 4; ++ks) {
      pa[ks][0] = pack(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    float pv[16][4];
    for (int dt = 0; dt < 16; ++dt) {
      pv[dt][0] = pv[dt][1] = pv[dt][2] = pv[dt][3] = 0.0f;
      const std::uint16_t* vr = svt + (dt * 8 + g) * kVtStride + t4 * 2;
      for (int ks = 0; ks < 4; ++ks)
        mma_bf16(pv[dt], pa[ks], load_pair(vr + ks * 16), load_pair(vr + ks * 16 + 8));
    }
    // Every lane of the quad takes part in the shuffles, whether or not its rows see the tile.
    const float row_sum[2] = {quad_sum(psum[0]), quad_sum(psum[1])};
    for (int r = 0; r < 2; ++r) {
      if (!sees[r]) continue;  // untouched, as if the tile had not run
      l[r] = l[r] * factor[r] + row_sum[r];
      m[r] = mnew[r];
      for (int dt = 0; dt < 16; ++dt) {
        o[dt][2 * r] = o[dt][2 * r] * factor[r] + pv[dt][2 * r];
        o[dt][2 * r + 1] = o[dt][2 * r + 1] * factor[r] + pv[dt][2 * r + 1];
      }
    }
    __syncthreads();
  }

  write_state(job, row0, row1, t4, o, m, l);
}

}  // namespace

void flash_bf16(const FlashJob* jobs, const Task* tiles, long long ntiles, float scale,
                cudaStream_t stream) {
  if (ntiles == 0) return;
  flash_kernel<<<grid_blocks(ntiles), 128, 0, stream>>>(jobs, tiles, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

}  // namespace cpd::cuda
