#pragma once
// Reading the tensors of a file written by Python's torch.save (the zip
// format of PyTorch >= 1.6) with LibTorch alone and without running any
// Python object: a small pickle reader that knows only what a state_dict
// holds (dicts, OrderedDicts, tuples, strings, numbers, tensors). Issue 46:
// LibTorch's own torch::pickle_load turns every collections.OrderedDict
// (what state_dict() returns) into None.

#include <ATen/ATen.h>

#include <map>
#include <string>

namespace crucible {

/// The state_dict of a torch.save file: the root dict itself when its values
/// are tensors, else its "model" entry (MACE's checkpoints:
/// {"model": state_dict, "optimizer": ..., ...}; other entries are skipped
/// unread where they are not needed). Tensors on CPU, the file's dtypes,
/// shapes and strides (as contiguous copies).
/// @throws DataError "<path>: ..." for a file that is not a torch.save zip, a
///         pickle opcode or Python global outside that set (naming it), or a
///         root without tensors.
std::map<std::string, at::Tensor> read_torch_save_state_dict(const std::string& path);

}  // namespace crucible
