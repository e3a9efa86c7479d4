#pragma once
// SHA-256 digests (OpenSSL libcrypto's EVP API) for checkpoint integrity.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace crucible::checkpoint {

/// Incremental SHA-256. Feed bytes with `update`, then take the digest once
/// with `hex_digest` (64 lowercase hex characters); further calls after
/// `hex_digest` throw std::logic_error. Throws std::runtime_error when
/// libcrypto fails (out of memory, FIPS policy forbidding SHA-256).
/// Not copyable; movable.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  /// Adds `size` bytes at `data` to the digest.
  void update(const void* data, std::size_t size);
  /// Adds the bytes of `data` to the digest.
  void update(std::string_view data) { update(data.data(), data.size()); }
  /// Finishes the digest and returns it as 64 lowercase hex characters.
  std::string hex_digest();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX*
  bool finished_ = false;
};

/// SHA-256 of `data` as 64 lowercase hex characters, e.g.
/// sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".
std::string sha256_hex(std::string_view data);

/// True when `s` looks like a digest from `hex_digest`: exactly 64 characters
/// from [0-9a-f].
bool is_sha256_hex(std::string_view s);

}  // namespace crucible::checkpoint
