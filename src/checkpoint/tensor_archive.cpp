// See include/crucible/checkpoint/tensor_archive.h.

#include "crucible/checkpoint/tensor_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>

#include <fstream>
#include <sstream>
#include <string_view>

#include "crucible/common/error.h"

namespace crucible::checkpoint {

void require_data_only_archive(const std::string& bytes, const std::string& name) {
  std::istringstream in(bytes);
  try {
    caffe2::serialize::PyTorchStreamReader reader(&in);
    for (const std::string& record : reader.getAllRecords()) {
      // "code/__torch__.py" (and its .debug_pkl, not code) hold TorchScript.
      const bool code = record.rfind("code/", 0) == 0 && record.size() > 3 &&
                        record.compare(record.size() - 3, 3, ".py") == 0;
      if (!code) continue;
      auto [data, size] = reader.getRecord(record);
      const std::string_view text(static_cast<const char*>(data.get()), size);
      for (size_t at = text.find("def "); at != std::string_view::npos; at = text.find("def ", at + 4)) {
        const bool word_start = at == 0 || text[at - 1] == ' ' || text[at - 1] == '\n' || text[at - 1] == '\t';
        if (word_start) {
          throw DataError(name + ": must be a tensor archive without TorchScript code, got a method in " +
                          record + " (not loaded)");
        }
      }
    }
  } catch (const c10::Error& e) {
    throw DataError(name + ": must be a LibTorch zip archive, got unreadable data (" +
                    e.what_without_backtrace() + ")");
  }
}

void require_data_only_archive_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": file must be readable, got an error opening it");
  std::stringstream ss;
  ss << in.rdbuf();
  require_data_only_archive(ss.str(), path);
}

}  // namespace crucible::checkpoint
