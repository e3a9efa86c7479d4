// The KIM model's settings.json (issue 19): the evaluation dtype of an
// exported KIM model, written by `crucible export kim --dtype`, read by the
// driver; bad files fail naming the file and what was expected.

#include "crucible/deploy/kim_settings.h"

#include "crucible/common/error.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace crucible {
namespace {

namespace fs = std::filesystem;

std::string write(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / "crucible_kim_settings_test";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

std::string kim_error_of(const std::string& path) {
  try {
    read_kim_settings(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(KimSettings, DtypeNamesMapToScalarTypesAndOthersAreRefused) {
  EXPECT_EQ(kim_dtype("float64", "--dtype"), at::kDouble);
  EXPECT_EQ(kim_dtype("float32", "--dtype"), at::kFloat);
  try {
    kim_dtype("bfloat16", "--dtype");
    FAIL() << "bfloat16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--dtype: expected float32 or float64, got 'bfloat16'");
  }
}

TEST(KimSettings, WrittenSettingsReadBack) {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    KimSettings s;
    s.dtype = dtype;
    const std::string text = kim_settings_json(s);
    EXPECT_NE(text.find(dtype == at::kFloat ? "\"float32\"" : "\"float64\""), std::string::npos) << text;
    EXPECT_EQ(read_kim_settings(write("ok.json", text)).dtype, dtype);
  }
  // No keys: the defaults (float64, as exports before settings.json).
  EXPECT_EQ(read_kim_settings(write("empty.json", "{}")).dtype, at::kDouble);
}

TEST(KimSettings, BadFilesNameTheFileAndWhatWasExpected) {
  const std::string unknown = write("unknown.json", R"({"dtype": "float32", "precision": "high"})");
  EXPECT_EQ(kim_error_of(unknown), unknown + ": unknown key 'precision' (known: dtype)");
  const std::string bad = write("bad.json", R"({"dtype": "float16"})");
  EXPECT_EQ(kim_error_of(bad), bad + ": dtype: expected float32 or float64, got 'float16'");
  const std::string number = write("number.json", R"({"dtype": 32})");
  EXPECT_EQ(kim_error_of(number), number + ": dtype must be \"float64\" or \"float32\"");
  const std::string list = write("list.json", R"(["float32"])");
  EXPECT_NE(kim_error_of(list).find(list + ": expected a JSON object"), std::string::npos);
  const std::string broken = write("broken.json", R"({"dtype": )");
  EXPECT_NE(kim_error_of(broken).find(broken + ": not valid JSON"), std::string::npos);
  const std::string missing = (fs::temp_directory_path() / "crucible_kim_settings_test" / "absent.json").string();
  fs::remove(missing);
  EXPECT_EQ(kim_error_of(missing), missing + ": cannot read the KIM model's settings");
}

}  // namespace
}  // namespace crucible
