// `crucible convert IN OUT` (issue 18): between the data formats.

#include "crucible/cli/commands.h"
#include "crucible/run/training_setup.h"
#include "crucible/common/error.h"
#include "crucible/data/formats.h"
#include "crucible/data/label_audit.h"

#include <fmt/format.h>

#include <filesystem>

namespace crucible {

void run_convert(const ConvertRequest& request, std::ostream& out) {
  for (const auto& o : request.overrides) {
    if (o.rfind("data.", 0) != 0) {
      throw ConfigError("convert accepts only data.* overrides (keys and units), got '" + o + "'");
    }
  }
  Config config = default_config();
  apply_overrides(config, request.overrides);
  std::error_code ec;
  if (std::filesystem::exists(request.output, ec) && std::filesystem::equivalent(request.input, request.output, ec)) {
    throw DataError(request.output + ": is the input itself; convert writes a new file, choose another output name");
  }
  const std::string from = request.from == "auto" ? detect_format(request.input) : request.from;
  const std::vector<Structure> frames = read_structures(request.input, from, extxyz_options(config.data));
  if (frames.empty()) throw DataError(request.input + ": holds no structure to convert");
  LabelAudit audit;  // issue 47: a label under a key not named is refused, not left behind
  audit.add(request.input, frames, extxyz_options(config.data));
  audit.throw_if_any();
  write_structures(request.output, request.to, frames, request.overwrite);
  out << fmt::format("converted {} structures ({}): {} ({}) -> {}\n", frames.size(), label_counts_text(frames),
                     request.input, from, request.output);
}

}  // namespace crucible
