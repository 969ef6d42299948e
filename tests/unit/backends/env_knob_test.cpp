/// env_knob / env_knob_off (kernels/cuda/env_knob.h), the CUDA launchers' environment knobs:
/// unset, empty and non-numeric values take the fallback, whole numbers (negative too) are
/// read, and only exactly "0" turns a path off. Host-only: no GPU, no CUDA toolkit.

#include <gtest/gtest.h>

#include <cstdlib>

#include "pagoda/kernels/cuda/env_knob.h"

namespace pagoda::kernels::cuda {
namespace {

constexpr const char* kName = "PAGODA_ENV_KNOB_TEST";

TEST(EnvKnob, ParsesWholeNumbersElseFallsBack) {
  unsetenv(kName);
  EXPECT_EQ(env_knob(kName, 7), 7);
  setenv(kName, "", 1);
  EXPECT_EQ(env_knob(kName, 7), 7);
  setenv(kName, "0", 1);
  EXPECT_EQ(env_knob(kName, 7), 0);
  setenv(kName, "12", 1);
  EXPECT_EQ(env_knob(kName, 7), 12);
  setenv(kName, "-1", 1);
  EXPECT_EQ(env_knob(kName, 7), -1);
  setenv(kName, "3x", 1);
  EXPECT_EQ(env_knob(kName, 7), 7);
  setenv(kName, "on", 1);
  EXPECT_EQ(env_knob(kName, 7), 7);
  unsetenv(kName);
}

TEST(EnvKnob, OffOnlyForExactlyZero) {
  unsetenv(kName);
  EXPECT_FALSE(env_knob_off(kName));
  for (const char* v : {"1", "2", "", "00", "0 ", "off"}) {
    setenv(kName, v, 1);
    EXPECT_FALSE(env_knob_off(kName)) << "'" << v << "'";
  }
  setenv(kName, "0", 1);
  EXPECT_TRUE(env_knob_off(kName));
  unsetenv(kName);
}

}  // namespace
}  // namespace pagoda::kernels::cuda
