// require_data_only_archive (issue 8): archives Crucible writes (plain
// tensors) pass; an archive carrying TorchScript methods (written by
// PyTorch's torch.jit.save, an independent writer) is refused before
// LibTorch would compile it; non-archives are DataErrors.

#include <gtest/gtest.h>

#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/python_oracle.h"
#include "crucible/checkpoint/tensor_archive.h"
#include "crucible/common/error.h"

namespace {

namespace fs = std::filesystem;
using crucible::DataError;
using crucible::checkpoint::require_data_only_archive;
using crucible::checkpoint::require_data_only_archive_file;

TEST(TensorArchive, TensorsWrittenByOutputArchivePass) {
  torch::serialize::OutputArchive archive;
  archive.write("w", at::arange(6, at::kDouble));
  std::ostringstream os;
  archive.save_to(os);
  EXPECT_NO_THROW(require_data_only_archive(os.str(), "weights.pt"));
}

TEST(TensorArchive, ArchiveWithTorchScriptMethodsIsRefused) {
  if (!crucible::testing::python_has("torch")) GTEST_SKIP() << "python3-torch unavailable";
  const fs::path path = fs::temp_directory_path() / ("crucible_scripted_" + std::to_string(::getpid()) + ".pt");
  // torch.jit.script needs the source in a file.
  const fs::path py = path.string() + ".py";
  {
    std::ofstream out(py);
    out << "import torch\n"
           "class M(torch.nn.Module):\n"
           "    def __init__(self):\n"
           "        super().__init__()\n"
           "        self.w = torch.nn.Parameter(torch.zeros(2))\n"
           "    def forward(self, x):\n"
           "        return x + self.w\n"
           "torch.jit.save(torch.jit.script(M()), '" << path.string() << "')\n"
           "print('ok')\n";
  }
  ASSERT_EQ(crucible::testing::run_python(py.string()), "ok\n");
  fs::remove(py);
  try {
    require_data_only_archive_file(path.string());
    FAIL() << "a scripted module must be refused";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path.string() + ": must be a tensor archive without TorchScript code, got a method in ", 0), 0u)
        << msg;
    EXPECT_NE(msg.find("(not loaded)"), std::string::npos) << msg;
  }
  fs::remove(path);
}

TEST(TensorArchive, NotAnArchiveIsADataError) {
  try {
    require_data_only_archive("definitely not a zip file", "optimizer.0.pt");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("optimizer.0.pt: must be a LibTorch zip archive, got unreadable data", 0), 0u)
        << e.what();
  }
}

}  // namespace
