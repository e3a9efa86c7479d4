#pragma once
// NumPy .npy files (format versions 1.0-3.0), for DeePMD-kit data
// (issue 18). Reference: numpy/lib/format.py ("A Simple File Format for
// NumPy Arrays", NEP 1).

#include <ATen/ATen.h>

#include <string>

namespace crucible {

/// Reads a C-order, little-endian .npy array of float32, float64, int32 or
/// int64 ('<f4' '<f8' '<i4' '<i8'). Returns a CPU tensor of that dtype and
/// shape. @throws DataError naming the file: not an .npy file, an unknown
/// version, a big-endian or other dtype, Fortran order, a malformed header,
/// or a data size that does not match the shape (truncated file).
at::Tensor read_npy(const std::string& path);

/// Writes `array` (float32, float64, int32 or int64; any shape; made
/// contiguous) as a version 1.0 .npy file, little-endian, via a temporary
/// file and a rename. @throws DataError if the file cannot be written or the
/// dtype is not one of those.
void write_npy(const std::string& path, const at::Tensor& array);

}  // namespace crucible
