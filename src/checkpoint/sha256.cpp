#include "crucible/checkpoint/sha256.h"

#include <openssl/evp.h>

#include <stdexcept>
#include <utility>

namespace crucible::checkpoint {

namespace {
EVP_MD_CTX* as_ctx(void* p) { return static_cast<EVP_MD_CTX*>(p); }
}  // namespace

Sha256::Sha256() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) throw std::runtime_error("SHA-256: EVP_MD_CTX_new failed");
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    throw std::runtime_error("SHA-256: EVP_DigestInit_ex failed");
  }
  ctx_ = ctx;
}

Sha256::~Sha256() {
  if (ctx_) EVP_MD_CTX_free(as_ctx(ctx_));
}

Sha256::Sha256(Sha256&& other) noexcept
    : ctx_(std::exchange(other.ctx_, nullptr)), finished_(other.finished_) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    if (ctx_) EVP_MD_CTX_free(as_ctx(ctx_));
    ctx_ = std::exchange(other.ctx_, nullptr);
    finished_ = other.finished_;
  }
  return *this;
}

void Sha256::update(const void* data, std::size_t size) {
  if (!ctx_ || finished_) throw std::logic_error("SHA-256: update after hex_digest");
  if (size == 0) return;
  if (EVP_DigestUpdate(as_ctx(ctx_), data, size) != 1)
    throw std::runtime_error("SHA-256: EVP_DigestUpdate failed");
}

std::string Sha256::hex_digest() {
  if (!ctx_ || finished_) throw std::logic_error("SHA-256: hex_digest called twice");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(as_ctx(ctx_), md, &len) != 1 || len != 32)
    throw std::runtime_error("SHA-256: EVP_DigestFinal_ex failed");
  finished_ = true;
  static const char* kHex = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 0xF];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

bool is_sha256_hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace crucible::checkpoint
