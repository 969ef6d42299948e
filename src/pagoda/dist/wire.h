#pragma once
/// Wire: a minimal little-endian-native binary writer/reader for messages between the ranks of
/// one machine (same binary, same endianness). Scalars are trivially copyable values; vectors are
/// a u64 length followed by the elements. The reader bounds-checks every read and throws
/// Error(kInvalidArgument) on a short or malformed message (nothing read past the end).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "pagoda/core/error.h"

namespace pagoda::dist {

class WireWriter {
 public:
  explicit WireWriter(std::vector<std::byte>& out) : out_(&out) {}
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&v, sizeof(T));
  }
  template <typename T>
  void put_vec(std::span<const T> v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    append(v.data(), v.size_bytes());
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put_vec(std::span<const T>(v));
  }
  void put_str(const std::string& s) {
    put_vec(std::span<const char>(s.data(), s.size()));
  }

 private:
  // resize + memcpy (vector::insert of a few bytes trips GCC 12's -Wstringop-overflow).
  void append(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, p, n);
  }
  std::vector<std::byte>* out_;
};

class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename T>
  void get_vec(std::vector<T>& out) {
    static_assert(std::is_trivially_copyable_v<T>);
    const uint64_t n = get<uint64_t>();
    PAGODA_REQUIRE(n <= (in_.size() - pos_) / sizeof(T), kInvalidArgument,
                   "wire message: a vector of {} elements overruns the message", n);
    out.resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out.data(), in_.data() + pos_, static_cast<size_t>(n) * sizeof(T));
    pos_ += static_cast<size_t>(n) * sizeof(T);
  }
  std::string get_str() {
    std::vector<char> v;
    get_vec(v);
    return std::string(v.begin(), v.end());
  }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  void need(size_t n) const {
    PAGODA_REQUIRE(n <= in_.size() - pos_, kInvalidArgument,
                   "wire message cut short ({} bytes needed at offset {} of {})", n, pos_,
                   in_.size());
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

}  // namespace pagoda::dist
