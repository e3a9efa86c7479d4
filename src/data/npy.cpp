// .npy reader and writer. See include/crucible/data/npy.h.

#include "crucible/data/npy.h"

#include "crucible/common/error.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

namespace crucible {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw DataError(path + ": " + what); }

bool little_endian_host() {
  const uint16_t one = 1;
  uint8_t b = 0;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

}  // namespace

at::Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ".npy file must be readable, got a read error");
  const auto file_size = static_cast<uint64_t>(std::filesystem::file_size(path));
  char magic[8] = {};
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "must be a NumPy .npy file (magic \\x93NUMPY), got other bytes");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3) fail(path, ".npy format version must be 1, 2 or 3, got " + std::to_string(major));
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2] = {};
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4] = {};
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  const uint64_t offset = (major == 1 ? 10u : 12u) + static_cast<uint64_t>(header_len);
  if (!f || header_len > 65536 || offset > file_size) fail(path, ".npy header must fit in the file, got a truncated header");
  std::string header(header_len, '\0');
  f.read(header.data(), header_len);
  std::smatch m;
  static const std::regex descr_re(R"('descr'\s*:\s*'([^']*)')");
  static const std::regex order_re(R"('fortran_order'\s*:\s*(True|False))");
  static const std::regex shape_re(R"('shape'\s*:\s*\(([^)]*)\))");
  if (!std::regex_search(header, m, descr_re)) fail(path, ".npy header must have 'descr', got " + header.substr(0, 80));
  const std::string descr = m[1];
  if (!std::regex_search(header, m, order_re)) fail(path, ".npy header must have 'fortran_order'");
  if (m[1] == "True") fail(path, ".npy array must be in C order, got fortran_order True");
  if (!std::regex_search(header, m, shape_re)) fail(path, ".npy header must have 'shape'");
  std::vector<int64_t> shape;
  {
    std::stringstream ss(m[1]);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item.find_first_not_of(" ") == std::string::npos) continue;
      try {
        // Digits only: stoll would read "1e1" as 1 and "2.5" as 2 (issue 47).
        const size_t first = item.find_first_not_of(" "), last = item.find_last_not_of(" ");
        const std::string digits = item.substr(first, last - first + 1);
        if (digits.find_first_not_of("0123456789") != std::string::npos) throw std::invalid_argument(digits);
        const long long v = std::stoll(digits);
        if (v < 0 || v > (int64_t{1} << 40)) throw std::out_of_range("");
        shape.push_back(v);
      } catch (const std::exception&) {
        fail(path, ".npy shape entries must be non-negative integers, got '" + item + "'");
      }
    }
  }
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '>')) {
    fail(path, ".npy dtype must be float32, float64, int32 or int64 ('<f4', '<f8', '<i4', '<i8'), got '" + descr + "'");
  }
  if (descr[0] == '>') fail(path, ".npy array must be little-endian, got big-endian '" + descr + "'");
  at::ScalarType type;
  const std::string t = descr.substr(1);
  if (t == "f8") {
    type = at::kDouble;
  } else if (t == "f4") {
    type = at::kFloat;
  } else if (t == "i8") {
    type = at::kLong;
  } else if (t == "i4") {
    type = at::kInt;
  } else {
    fail(path, ".npy dtype must be float32, float64, int32 or int64 ('<f4', '<f8', '<i4', '<i8'), got '" + descr + "'");
  }
  uint64_t count = 1;
  for (int64_t s : shape) {
    count *= static_cast<uint64_t>(s);
    if (count > (uint64_t{1} << 40)) fail(path, ".npy array is too large");
  }
  const uint64_t bytes = count * static_cast<uint64_t>(c10::elementSize(type));
  if (file_size - offset != bytes) {
    fail(path, ".npy data must be " + std::to_string(bytes) + " bytes for shape and dtype '" + descr + "', got " +
                   std::to_string(file_size - offset) + " (truncated or corrupt file)");
  }
  if (!little_endian_host()) fail(path, "reading .npy needs a little-endian machine");
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(type));
  f.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(bytes));
  if (!f) fail(path, ".npy data must be readable, got a read error");
  return out;
}

void write_npy(const std::string& path, const at::Tensor& array) {
  const at::Tensor a = array.to(at::kCPU).contiguous();
  std::string descr;
  switch (a.scalar_type()) {
    case at::kDouble: descr = "<f8"; break;
    case at::kFloat: descr = "<f4"; break;
    case at::kLong: descr = "<i8"; break;
    case at::kInt: descr = "<i4"; break;
    default: throw DataError(path + ": write_npy takes float32, float64, int32 or int64 arrays");
  }
  std::string shape;
  for (int64_t s : a.sizes()) shape += std::to_string(s) + ", ";
  if (a.dim() > 1) shape.erase(shape.size() - 2);  // (3, 4) ; a 1-d shape keeps its comma: (3,)
  else if (a.dim() == 1) shape.erase(shape.size() - 1);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  const size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const auto len = static_cast<uint16_t>(header.size());
    const char prefix[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(prefix, 8);
    const char l[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    f.write(l, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(static_cast<const char*>(a.data_ptr()), static_cast<std::streamsize>(a.numel() * a.element_size()));
    if (!f.flush()) throw DataError(tmp + ": cannot write the file");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw DataError(path + ": cannot write the file (" + ec.message() + ")");
}

}  // namespace crucible
