// The dtype names users write (crucible/common/dtype_names.h): one table
// for configs, model.json, the KIM settings and the Python module.

#include "crucible/common/dtype_names.h"

#include <gtest/gtest.h>

namespace crucible {
namespace {

TEST(DtypeNames, NamesRoundTripAndUnknownNamesAreRefused) {
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const auto back = dtype_from_name(dtype_name(t), {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf});
    ASSERT_TRUE(back.has_value()) << dtype_name(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(dtype_name(at::kFloat), "float32");
  EXPECT_EQ(dtype_name(at::kDouble), "float64");
  EXPECT_EQ(dtype_name(at::kLong), "Long");
  // Models run in float32 or float64 only, and names are case-sensitive.
  EXPECT_EQ(dtype_from_name("float64"), at::kDouble);
  EXPECT_FALSE(dtype_from_name("bfloat16").has_value());
  EXPECT_FALSE(dtype_from_name("Float32").has_value());
  EXPECT_FALSE(dtype_from_name("double").has_value());
  EXPECT_EQ(dtype_choices(), "float32 or float64");
  EXPECT_EQ(dtype_choices({at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}),
            "float32, float64, bfloat16 or float16");
  EXPECT_EQ(dtype_choices({at::kDouble}), "float64");
}

}  // namespace
}  // namespace crucible
