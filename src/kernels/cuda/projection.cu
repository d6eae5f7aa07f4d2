// The dlogp leg's per-head logit projection on the device, with the shared arithmetic of
// cpdrift/logprob_math.h: the same bits as the CPU.
#include "cpdrift/logprob_math.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"

namespace cpd::cuda {
namespace {

constexpr int kProjectThreads = 256;

// One block per (job, token row); thread t takes vocabulary entries t, t + 256, …, each one
// sequential dot_seq.
__global__ void project_kernel(const DeviceProjectionJob* jobs, const Task* tasks, int dim,
                               int vocab) {
  const Task task = tasks[blockIdx.x];
  const DeviceProjectionJob& job = jobs[task.job];
  const long long row = task.item;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    job.z[row * vocab + v] = dot_seq(job.hidden + row * dim, job.w + v * job.ldw, dim);
  }
}

}  // namespace

void project(const DeviceProjectionJob* jobs, const Task* tasks, long long ntasks, int dim,
             int vocab, cudaStream_t stream) {
  if (ntasks == 0) return;
  project_kernel<<<grid_blocks(ntasks), kProjectThreads, 0, stream>>>(jobs, tasks, dim, vocab);
  CPD_CUDA_CHECK_LAUNCH();
}

}  // namespace cpd::cuda
