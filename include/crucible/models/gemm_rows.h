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

/// Rows per chunk of a row-chunked product of in_features → out_features
/// with elements of `element_size` bytes: 4 MiB of x and y rows together
/// (8192 rows for 64 → 64 float32), at least 256. @throws c10::Error if an
/// argument is not positive.
int64_t gemm_chunk_rows(int64_t in_features, int64_t out_features, int64_t element_size);

/// y = x w + bias: x [M,K], w [K,N], bias [N] or undefined → y [M,N] in x's
/// dtype, computed `chunk_rows` rows of x at a time into one y (BLAS calls
/// on row slices, no copies), and so are the row-sized products of every
/// derivative (∂/∂x = g wᵀ; ∂/∂w = xᵀ g is one product, a sum over rows,
/// whose own derivatives are again row-chunked). Differentiable to any
/// order; equal to at::addmm up to rounding. Why (issue 19, deliverable 2):
/// OpenBLAS multiplies a tall [M,64]×[64,64] float32 at ~87 ns per row while
/// its operands fit the L2 cache and at 110-137 ns per row for M = 150 000
/// (Zen 5, 1 thread); 8192-row chunks of the same product run at ~95.
/// @throws c10::Error on mismatched shapes or chunk_rows < 1.
at::Tensor mm_row_chunks(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t chunk_rows);

/// True if x w (x [..., K] of rank ≥ 2, w [K,N]) goes through
/// mm_row_chunks in linear_bucketed_rows / matmul_bucketed_rows: both on the
/// CPU, float32 or float64 with one dtype, not a bf16 product
/// (cpu_bf16_gemm), and more than two chunks of rows. Never throws.
bool row_chunked_gemm(const at::Tensor& x, const at::Tensor& w);

/// y = x Wᵀ + b (torch::nn::Linear's formula): x [M, in], weight [out, in],
/// bias [out] or undefined → y [M, out], differentiable to any order.
/// Where `cpu_bf16_gemm(x, weight)`, x is cast to bfloat16 and padded with
/// zero rows to gemm_row_bucket(M), and y is the first M rows of the padded
/// product (the same values; the padded rows get zero gradient). Elsewhere
/// it is mm_row_chunks where row_chunked_gemm(x, Wᵀ) (tall float32/float64
/// on the CPU), else at::linear (CUDA, few rows). x of another rank goes to
/// at::linear unchanged. @throws c10::Error on mismatched shapes.
at::Tensor linear_bucketed_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// y = x w: x [M, ..., in] (rank ≥ 2), w [in, out] → y [M, ..., out], as
/// at::matmul, differentiable to any order. Where `cpu_bf16_gemm(x, w)`, x
/// is cast to bfloat16 and its dim 0 padded with zero rows to
/// gemm_row_bucket(M), and y is the first M rows. Elsewhere mm_row_chunks
/// over x's rows where row_chunked_gemm(x, w) and x is contiguous, else
/// at::matmul.
/// @throws c10::Error on mismatched shapes.
at::Tensor matmul_bucketed_rows(const at::Tensor& x, const at::Tensor& w);

}  // namespace crucible
