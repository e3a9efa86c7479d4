// SHA-256 (OpenSSL EVP) against published vectors and Python's hashlib.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "common/python_oracle.h"
#include "crucible/checkpoint/sha256.h"

namespace fs = std::filesystem;
using crucible::checkpoint::is_sha256_hex;
using crucible::checkpoint::Sha256;
using crucible::checkpoint::sha256_hex;

TEST(Sha256, KnownVectors) {
  // FIPS 180-2 appendix B and the empty message.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, IncrementalMillionA) {
  // One million 'a' fed in uneven pieces equals the published digest.
  Sha256 h;
  const std::string chunk(997, 'a');
  std::size_t left = 1000000;
  while (left > 0) {
    const std::size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_THROW(h.hex_digest(), std::logic_error);
  EXPECT_THROW(h.update("x"), std::logic_error);
}

TEST(Sha256, IsSha256Hex) {
  EXPECT_TRUE(is_sha256_hex(sha256_hex("abc")));
  EXPECT_FALSE(is_sha256_hex(""));
  EXPECT_FALSE(is_sha256_hex(std::string(63, 'a')));
  EXPECT_FALSE(is_sha256_hex(std::string(64, 'A')));
  EXPECT_FALSE(is_sha256_hex(std::string(63, 'a') + "g"));
}

TEST(Sha256, MatchesPythonHashlib) {
  if (!crucible::testing::python_has("hashlib")) GTEST_SKIP() << "python3 hashlib unavailable";
  char tmpl[] = "/tmp/crucible-sha-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  std::mt19937 gen(1234);
  const std::size_t sizes[] = {0, 1, 55, 56, 63, 64, 65, 1000, 65536, 65537, 1 << 20};
  std::string args;
  std::vector<std::string> ours;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    std::string data(sizes[i], '\0');
    for (char& c : data) c = static_cast<char>(gen() & 0xFF);
    const fs::path p = dir / ("blob" + std::to_string(i));
    std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    args += " " + p.string();
    ours.push_back(sha256_hex(data));
  }
  const std::string script =
      "-c 'import hashlib,sys\nfor p in sys.argv[1:]: print(hashlib.sha256(open(p,\"rb\").read()).hexdigest())'";
  const std::string out = crucible::testing::run_python(script + args);
  fs::remove_all(dir);
  std::string expected;
  for (const auto& h : ours) expected += h + "\n";
  ASSERT_FALSE(out.empty()) << "python3 failed";
  EXPECT_EQ(out, expected);
}
