// The CUDA backend's kernels and their launchers. Jobs are plain structs of device pointers,
// built by cuda_backend.cu from the engine's host jobs; every FP32 kernel follows the canonical
// operation order of docs/numerics.md, so its bits equal the CPU backend's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/model.h"
#include "core/range.h"
#include "cpdrift/philox.h"

namespace cpd::cuda {

/// One (row range × KV block) partial-state job, or one block of a fold job (FP32 inputs).
struct RowsJob {
  const float* q;  // [rows][dim]
  long long first_pos, rows;
  const float* k;  // [key_end - key_begin][dim]
  const float* v;
  long long key_begin, key_end;
  float* out;  // [rows][dim]
  float* lse;  // [rows]
};

/// A CP=1 fold: rows against `nblocks` ascending blocks; k, v hold positions from kv_begin.
struct DeviceFoldJob {
  const float* q;
  long long first_pos, rows;
  const float* k;
  const float* v;
  long long kv_begin;
  const long long* blocks;  // nblocks × (begin, end)
  int nblocks;
  float* out;
  float* lse;
};

/// States of one (batch, head, query range) sorted by block index, merged into out/lse.
struct DeviceMergeJob {
  const float* const* outs;  // nstates × [rows][dim]
  const float* const* lses;  // nstates × [rows]
  int nstates;
  long long rows;
  float* out;
  float* lse;
};

/// One query block's rows for the backward (FP32).
struct DeviceBackwardBlock {
  long long begin, end;  // positions
  const float* q;
  const float* d_out;
  const float* lse;
  const float* delta;
  float* dq_partial;  // [rows][dim]
};

/// One head × one KV block of the backward: `blocks` ascending.
struct DeviceBackwardUnit {
  const DeviceBackwardBlock* blocks;
  int nblocks;
  const float* k;
  const float* v;
  long long key_begin, key_end;
  float* dk_total;  // [keys][dim]
  float* dv_total;
  int accumulate;  // 1: the totals hold the fold of earlier query blocks; continue it
};

/// Per-head partial logits of `rows` tokens.
struct DeviceProjectionJob {
  const float* hidden;  // [rows][dim]
  long long rows;
  const float* w;  // vocab rows, stride ldw
  long long ldw;
  float* z;  // [rows][vocab]
};

/// A tensor-core job: BF16 inputs (bits), FP32 partial state out.
struct FlashJob {
  const std::uint16_t* q;  // [rows][128]
  long long first_pos, rows;
  const std::uint16_t* k;  // [key_end - key_begin][128]
  const std::uint16_t* v;
  long long key_begin, key_end;
  float* out;
  float* lse;
};

/// Input generation of one shard: elements at their global coordinates (inputs.h).
struct GenerateParams {
  unsigned long long seed;
  unsigned tensor;
  long long num_heads;  // the tensor's global head count
  long long seq_len;
  long long prompt_len;  // shared_prompt_len: rows before it are sequence 0's (q, k, v)
  int dim;
  int batch;
  long long head_begin, head_count;
  const long long* row_positions;  // global position of each local row
  long long rows;
  bool rotate, bf16;
  bool qkv_bias;                   // add the model's qkv bias (input_shape.h's bias_of)
  InputDistribution distribution;  // cpdrift/input_shape.h
  int group_size;                  // query heads per KV head
  const float* inv_freq;           // dim / 2 entries (rotary dim = head dim)
  float* out;                      // [batch][head_count][rows][dim]
};

// The (job, row) or (job, tile) pairs a launch covers, one CUDA block each.
struct Task {
  int job;
  int item;
};

void generate(const GenerateParams& p, cudaStream_t stream);

/// The generation of heads `heads` of tensor `tensor` ([batch][heads][rows][head_dim], row i
/// at global position positions[i]; device pointers) into `out`, as the CPU generates it.
GenerateParams generate_params(const Problem& problem, TensorId tensor, int batch, Range heads,
                               const long long* positions, long long rows, bool bf16,
                               const float* inv_freq, float* out);
void forward_rows(const RowsJob* jobs, const Task* tasks, long long ntasks, int dim, float scale,
                  cudaStream_t stream);
void forward_fold(const DeviceFoldJob* jobs, const Task* tasks, long long ntasks, int dim,
                  float scale, cudaStream_t stream);
void merge(const DeviceMergeJob* jobs, const Task* tasks, long long ntasks, int dim,
           cudaStream_t stream);
void backward_dq(const DeviceBackwardUnit* units, const Task* tasks, long long ntasks, int dim,
                 float scale, cudaStream_t stream);
void backward_dkdv(const DeviceBackwardUnit* units, const Task* tasks, long long ntasks, int dim,
                   float scale, cudaStream_t stream);
void project(const DeviceProjectionJob* jobs, const Task* tasks, long long ntasks, int dim,
             int vocab, cudaStream_t stream);
/// Tensor-core FlashAttention forward (head dim 128): one CUDA block per (job, 64-row tile).
void flash_bf16(const FlashJob* jobs, const Task* tiles, long long ntiles, float scale,
                cudaStream_t stream);

/// Rows per tile of flash_bf16.
inline constexpr int kFlashRows = 64;

}  // namespace cpd::cuda
