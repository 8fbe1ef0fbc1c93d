// Content hashes of checkpoint files, as the Hugging Face cache names its blobs: large (LFS)
// files by the SHA-256 of their bytes, small (plain git) files by their git blob id,
// sha1("blob " + decimal size + "\0" + bytes). OpenSSL's libcrypto does the hashing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "tools/verify.h"

namespace moonrun {

namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

std::string to_hex(const unsigned char* digest, unsigned int n) {
  static const char* kHex = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned int i = 0; i < n; ++i) {
    s[2 * i] = kHex[digest[i] >> 4];
    s[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return s;
}

}  // namespace

Result<FileHashes> hash_file(const std::string& path, bool want_sha256, bool want_git_sha1,
                             void (*on_bytes)(uint64_t, void*), void* ctx) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);

  MdCtx sha256(EVP_MD_CTX_new()), sha1(EVP_MD_CTX_new());
  if (!sha256 || !sha1 || (want_sha256 && EVP_DigestInit_ex(sha256.get(), EVP_sha256(), nullptr) != 1) ||
      (want_git_sha1 && EVP_DigestInit_ex(sha1.get(), EVP_sha1(), nullptr) != 1)) {
    ::close(fd);
    return internal_error(path + ": cannot initialise OpenSSL digests");
  }
  if (want_git_sha1) {
    const std::string prefix = "blob " + std::to_string(static_cast<uint64_t>(st.st_size));
    EVP_DigestUpdate(sha1.get(), prefix.c_str(), prefix.size() + 1);  // includes the '\0'
  }

  constexpr size_t kChunkBytes = 8u << 20;
  std::vector<unsigned char> buf(kChunkBytes);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string err = std::strerror(errno);
      ::close(fd);
      return data_loss(path + ": read failed after " + std::to_string(total) + " bytes: " + err);
    }
    if (n == 0) break;
    if (want_sha256) EVP_DigestUpdate(sha256.get(), buf.data(), static_cast<size_t>(n));
    if (want_git_sha1) EVP_DigestUpdate(sha1.get(), buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
    if (on_bytes != nullptr) on_bytes(static_cast<uint64_t>(n), ctx);
  }
  ::close(fd);
  if (total != static_cast<uint64_t>(st.st_size))
    return data_loss(path + ": changed size while being hashed (" + std::to_string(st.st_size) +
                     " -> " + std::to_string(total) + " bytes)");

  FileHashes out;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (want_sha256) {
    EVP_DigestFinal_ex(sha256.get(), digest, &len);
    out.sha256_hex = to_hex(digest, len);
  }
  if (want_git_sha1) {
    EVP_DigestFinal_ex(sha1.get(), digest, &len);
    out.git_sha1_hex = to_hex(digest, len);
  }
  return out;
}

}  // namespace moonrun
