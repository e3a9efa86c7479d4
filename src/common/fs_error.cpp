// See include/crucible/common/fs_error.h.

#include "crucible/common/fs_error.h"

namespace crucible {

std::string filesystem_error_text(const std::filesystem::filesystem_error& e) {
  // what() is "filesystem error: <operation>: <cause> [<path1>] [<path2>]" (libstdc++).
  std::string what = e.what();
  const std::string prefix = "filesystem error: ";
  if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
  const size_t bracket = what.find(" [");
  if (bracket != std::string::npos) what = what.substr(0, bracket);
  std::string paths;
  if (!e.path1().empty()) paths = e.path1().string();
  if (!e.path2().empty()) paths += " -> " + e.path2().string();
  return (paths.empty() ? std::string("(empty path)") : paths) + ": " + what;
}

}  // namespace crucible
