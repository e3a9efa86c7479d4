#pragma once
// One-line text of a std::filesystem error (issue 47): the path and the
// cause, without the library's "filesystem error:" prefix and brackets.

#include <filesystem>
#include <string>

namespace crucible {

/// "PATH: cannot create directories: Operation not permitted" for `e`
/// (PATH1 -> PATH2 when there are two; "(empty path)" when there is none).
/// Never throws beyond std::bad_alloc.
std::string filesystem_error_text(const std::filesystem::filesystem_error& e);

}  // namespace crucible
