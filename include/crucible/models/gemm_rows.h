#pragma once
// Row buckets for bfloat16 matrix products on the CPU (issue 19, deliverable 3).
//
// LibTorch's CPU bf16 GEMM (oneDNN through ideep, LibTorch 1.13) builds a
// kernel for every new matrix shape. Measured on AMD EPYC Zen 5 (avx512_bf16),
// one thread, [M,64]×[64,64] with M drawn from 5000-5800: 270 µs the first
// time an M is seen against 122 µs once built (float32: 495 µs either way).
// A training batch changes the edge count every step, so without buckets
// every edge-sized product pays the build. Padding the rows to a bucket
// (`gemm_row_bucket`) leaves a few shapes per run.

#include <ATen/ATen.h>

#include <cstdint>

namespace crucible {

/// The row count a bf16 CPU product of `rows` rows is padded to: the
/// smallest multiple of 2^max(0, ⌊log₂ rows⌋ − 4) that is ≥ rows, so at most
/// 1/16 (6.25%) extra rows and 16 sizes per doubling. rows ≤ 16 is returned
/// as is. @throws c10::Error if rows < 0.
int64_t gemm_row_bucket(int64_t rows);

/// True if a product of `x` with `weight` runs in bfloat16 on the CPU on this
/// thread: x is on the CPU and either CPU autocast is on with bfloat16, or x
/// or weight is bfloat16 (the bf16-true modes). Never throws.
bool cpu_bf16_gemm(const at::Tensor& x, const at::Tensor& weight);

/// y = x Wᵀ + b (torch::nn::Linear's formula): x [M, in], weight [out, in],
/// bias [out] or undefined → y [M, out], differentiable to any order.
/// Where `cpu_bf16_gemm(x, weight)`, x is cast to bfloat16 and padded with
/// zero rows to gemm_row_bucket(M), and y is the first M rows of the padded
/// product (the same values; the padded rows get zero gradient). Elsewhere
/// (float32/float64, CUDA) it is at::linear. x of another rank goes to
/// at::linear unchanged. @throws c10::Error on mismatched shapes.
at::Tensor linear_bucketed_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// y = x w: x [M, ..., in] (rank ≥ 2), w [in, out] → y [M, ..., out], as
/// at::matmul, differentiable to any order. Where `cpu_bf16_gemm(x, w)`, x
/// is cast to bfloat16 and its dim 0 padded with zero rows to
/// gemm_row_bucket(M), and y is the first M rows. Elsewhere at::matmul.
/// @throws c10::Error on mismatched shapes.
at::Tensor matmul_bucketed_rows(const at::Tensor& x, const at::Tensor& w);

}  // namespace crucible
