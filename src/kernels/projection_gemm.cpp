#include "kernels/projection_gemm.h"

#include <stdexcept>

#include "cpdrift/bf16.h"

namespace cpd {

ColumnMajorGemm projection_gemm(std::int64_t rows, int dim, int outputs) {
  if (rows < 1 || rows > (std::int64_t{1} << 30) || dim < 1 || outputs < 1)
    throw std::invalid_argument("projection_gemm: a GEMM of no or too many rows");
  // Row-major z [rows][outputs] is column-major zᵀ = w · xᵀ: w's rows are A's columns.
  return ColumnMajorGemm{true, outputs, static_cast<int>(rows), dim, dim, dim, outputs};
}

void pack_projection_bf16(const ProjectionJob& job, int dim, int outputs,
                          std::vector<std::uint16_t>& x, std::vector<std::uint16_t>& w) {
  const auto bits = [](float v) { return bf16_bits_rn(v); };
  x.resize(static_cast<std::size_t>(job.rows * dim));
  w.resize(static_cast<std::size_t>(outputs) * dim);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bits(job.hidden[i]);
  for (int o = 0; o < outputs; ++o) {
    for (int i = 0; i < dim; ++i)
      w[static_cast<std::size_t>(o) * dim + i] = bits(job.w[o * job.ldw + i]);
  }
}

}  // namespace cpd
