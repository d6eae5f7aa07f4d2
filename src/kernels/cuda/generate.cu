// Input generation on the device, with the shared arithmetic of numerics/ (philox.h, rope.h):
// the same bits as the CPU.
#include "core/model.h"
#include "cpdrift/bf16.h"
#include "cpdrift/input_shape.h"
#include "cpdrift/philox.h"
#include "cpdrift/rope.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"

namespace cpd::cuda {
namespace {

// One thread per (b, h, row, i < dim/2): the pair (i, i + dim/2) of one row, generated at its
// global coordinates, shaped by the input distribution, biased where the model has a qkv bias,
// rotated when the tensor takes RoPE, rounded when BF16 is asked for.
__global__ void generate_kernel(GenerateParams p) {
  const long long half = p.dim / 2;
  const long long id = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(p.batch) * p.head_count * p.rows * half;
  if (id >= total) return;
  const long long i = id % half;
  const long long row = id / half % p.rows;
  const long long hl = id / (half * p.rows) % p.head_count;
  const long long b = id / (half * p.rows * p.head_count);
  const long long pos = p.row_positions[row];
  const unsigned long long first = static_cast<unsigned long long>(
      ((input_sequence(static_cast<TensorId>(p.tensor), b, pos, p.prompt_len) * p.num_heads +
        p.head_begin + hl) *
           p.seq_len +
       pos) *
      p.dim);
  const TensorId tensor = static_cast<TensorId>(p.tensor);
  float x1 = normal_at(p.seed, tensor, first + i);
  float x2 = normal_at(p.seed, tensor, first + i + half);
  if (tensor == TensorId::q || tensor == TensorId::k) {
    const long long h = p.head_begin + hl;
    const long long kv_head = tensor == TensorId::q ? h / p.group_size : h;
    x1 = shape_input(p.distribution, tensor, kv_head, pos, static_cast<int>(i), p.dim, x1);
    x2 = shape_input(p.distribution, tensor, kv_head, pos, static_cast<int>(i + half), p.dim, x2);
  }
  if (p.qkv_bias) {
    const unsigned long long bias_row = static_cast<unsigned long long>(p.head_begin + hl) * p.dim;
    x1 = add_bias(x1, normal_at(p.seed, bias_of(tensor), bias_row + i));
    x2 = add_bias(x2, normal_at(p.seed, bias_of(tensor), bias_row + i + half));
  }
  if (p.rotate) {
    float c, s;
    rope_cos_sin(pos, p.inv_freq[i], c, s);
    rope_rotate_pair(x1, x2, c, s);
  }
  if (p.bf16) {
    x1 = round_bf16(x1);
    x2 = round_bf16(x2);
  }
  float* out = p.out + ((b * p.head_count + hl) * p.rows + row) * p.dim;
  out[i] = x1;
  out[i + half] = x2;
}

}  // namespace

GenerateParams generate_params(const Problem& problem, TensorId tensor, int batch, Range heads,
                               const long long* positions, long long rows, bool bf16,
                               const float* inv_freq, float* out) {
  GenerateParams g{};
  g.seed = problem.seed;
  g.tensor = static_cast<unsigned>(tensor);
  g.num_heads = heads_of(problem.dims, tensor);
  g.seq_len = problem.seq_len;
  g.prompt_len = shared_prompt_len(problem);
  g.dim = problem.dims.head_dim;
  g.batch = batch;
  g.head_begin = heads.begin;
  g.head_count = heads.size();
  g.row_positions = positions;
  g.rows = rows;
  g.rotate = problem.rope && (tensor == TensorId::q || tensor == TensorId::k);
  g.qkv_bias = problem.dims.qkv_bias && tensor != TensorId::d_out;
  g.bf16 = bf16;
  g.distribution = problem.distribution;
  g.group_size = problem.dims.group_size();
  g.inv_freq = inv_freq;
  g.out = out;
  return g;
}

void generate(const GenerateParams& p, cudaStream_t stream) {
  const long long total = static_cast<long long>(p.batch) * p.head_count * p.rows * (p.dim / 2);
  if (total == 0) return;
  constexpr int kBlock = 256;
  generate_kernel<<<grid_blocks((total + kBlock - 1) / kBlock), kBlock, 0, stream>>>(p);
  CPD_CUDA_CHECK_LAUNCH();
}

}  // namespace cpd::cuda
