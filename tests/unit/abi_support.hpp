// Support for the C ABI tests (test_abi.cpp, test_abi_errors.cpp): where
// tests/plugins builds the test plugins (one folder per case), and
// optimizer step args over whole vectors.
#pragma once

#include <tessera/optimizer.h>

#include <cstdint>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace tessera::test::abi_support {

// The folder of one test case, and a library in it: tests/plugins builds
// target T of case C as <test-plugins>/C/libT.so.
inline std::string case_dir(const std::string &name) {
  return std::string(TESSERA_TEST_BAD_PLUGIN_DIR) + "/" + name;
}
inline std::string test_lib(const std::string &case_name, const std::string &target) {
  return case_dir(case_name) + "/lib" + target + ".so";
}

// Step args over whole vectors; `state` may be empty.
inline tsr_optimizer_step_args step_args(std::vector<float> &params,
                                         const std::vector<float> &grads, float *const *state,
                                         const std::vector<tsr_segment> &segments, double lr,
                                         int64_t step, double grad_scale = 1.0) {
  auto a = tessera::sdk::make<tsr_optimizer_step_args>();
  a.device = DLDevice{kDLCPU, 0};
  a.params = params.data();
  a.grads = grads.data();
  a.state = state;
  a.n = params.size();
  a.segments = segments.data();
  a.num_segments = segments.size();
  a.lr = lr;
  a.grad_scale = grad_scale;
  a.step = step;
  a.compute_dtype = tessera::sdk::dtype_f32();
  return a;
}

}  // namespace tessera::test::abi_support
