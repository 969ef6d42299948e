// amx_tiles_available (amx_support.h).
#include "pagoda/kernels/cpu/amx_support.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace pagoda::kernels::cpu::detail {
namespace {

/// arch_prctl requests of Linux 5.16+: permission for the AMX tile-data state (feature 18).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

}  // namespace

bool amx_tiles_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool amx_bf16 = ((d >> 22) & 1) != 0, amx_tile = ((d >> 24) & 1) != 0;
    return amx_bf16 && amx_tile &&
           syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

}  // namespace pagoda::kernels::cpu::detail

#else  // not x86-64 Linux with GCC or Clang

namespace pagoda::kernels::cpu::detail {
bool amx_tiles_available() { return false; }
}  // namespace pagoda::kernels::cpu::detail

#endif
