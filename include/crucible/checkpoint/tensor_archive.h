#pragma once
// Guard for LibTorch archives (torch::serialize::InputArchive, torch::load)
// read from checkpoints and model files that someone else may have written.

#include <string>

namespace crucible::checkpoint {

/// Refuses a LibTorch archive (the zip that torch::serialize::OutputArchive
/// and torch::save write) that carries TorchScript code, before
/// torch::serialize::InputArchive compiles and could run it: LibTorch's
/// loader compiles every `code/*.py` record and calls a `__setstate__` it
/// defines. Archives written by Crucible hold plain tensors, so their code
/// records only declare attribute lists (`class Module(Module):` with
/// `__parameters__` / `__buffers__`); any `def` (a method, hence code that
/// could run at load) is refused. `bytes` is the whole archive; `name`
/// starts the message.
/// @throws DataError "<name>: must be a tensor archive without TorchScript
///         code, got a method in <record>" or "...: must be a LibTorch zip
///         archive, got unreadable data (...)".
void require_data_only_archive(const std::string& bytes, const std::string& name);

/// As above for an archive file; reads it whole (the caller checks sizes).
/// @throws DataError as above, or "<path>: file must be readable, ..." .
void require_data_only_archive_file(const std::string& path);

}  // namespace crucible::checkpoint
