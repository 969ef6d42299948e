#include "pagoda/cli/kernel_options_flag.h"

#include <string>
#include <vector>

#include <fmt/format.h>

namespace pagoda::cli {

void add_kernel_option_flag(CLI::App* cmd, backends::KernelOptions& options) {
  std::string names;
  for (const auto& [name, value] : backends::kernel_option_values(backends::KernelOptions{})) {
    names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", name, value);
  }
  cmd->add_option_function<std::vector<std::string>>(
      "--kernel-option",
      [&options](const std::vector<std::string>& values) {
        for (const std::string& v : values) backends::set_kernel_option(options, v);
      },
      "Kernel variant NAME=VALUE, repeatable (docs/design/cuda_backend.md, \"Kernel options\"); "
      "names (defaults): " + names);
}

nlohmann::json kernel_options_json(const backends::KernelOptions& options) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, value] : backends::kernel_option_values(options)) {
    if (value == "true" || value == "false") {
      j[name] = value == "true";
    } else {
      j[name] = std::stoi(value);
    }
  }
  return j;
}

}  // namespace pagoda::cli
