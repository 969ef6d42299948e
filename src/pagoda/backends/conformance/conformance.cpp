#include "pagoda/backends/conformance/conformance.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "pagoda/backends/conformance/tensors.h"
#include "pagoda/core/error.h"

namespace pagoda::backends::conformance {

int BackendRow::total_fail() const {
  int n = 0;
  for (const Cell& c : cells) n += c.fail;
  return n;
}

bool BackendRow::ok() const {
  if (!backend.expect_failure) return total_fail() == 0;
  if (!backend.target.empty()) {
    return target_col >= 0 && cells[static_cast<size_t>(target_col)].fail > 0;
  }
  return total_fail() > 0;
}

bool Report::ok() const {
  return std::all_of(rows.begin(), rows.end(), [](const BackendRow& r) { return r.ok(); });
}

namespace {

std::string cell_text(const Cell& c, bool mutant) {
  if (c.pass + c.fail + c.unsupported == 0) return "";
  std::vector<std::string> parts;
  if (c.fail) parts.push_back(fmt::format("{} {}", mutant ? "caught" : "**FAIL**", c.fail));
  if (c.pass) parts.push_back(fmt::format("{} {}", mutant ? "missed" : "pass", c.pass));
  if (c.unsupported) parts.push_back(fmt::format("unsupported {}", c.unsupported));
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

/// A platform for `device` from `platforms`, or nullptr when it is absent on this machine.
std::unique_ptr<platform::Platform> try_platform(const platform::PlatformRegistry* platforms,
                                                 const std::string& device) {
  if (platforms == nullptr) return nullptr;
  const auto names = platforms->names();
  if (std::find(names.begin(), names.end(), device) == names.end()) return nullptr;
  try {
    return platforms->make(device);
  } catch (const Error&) {
    return nullptr;
  }
}

uint64_t case_seed(uint64_t seed, size_t index) {
  uint64_t x = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::string Report::markdown() const {
  std::string s = fmt::format(
      "Conformance matrix ({} grid, seed {}): every backend × case against the independent fp64 "
      "oracle.\nCells count cases: pass / FAIL / unsupported (declared by capabilities(); reasons "
      "below). Each `mutant:*` row is the reference with one fault, run on the column that must "
      "catch it; \"caught\" counts the cases where the harness detected it.\n\n| backend |",
      quick ? "quick" : "full", seed);
  for (const auto& f : features) s += fmt::format(" {} |", f);
  s += " result |\n|---|";
  for (size_t i = 0; i < features.size(); ++i) s += "---|";
  s += "---|\n";
  for (const BackendRow& r : rows) {
    s += fmt::format("| {} |", r.backend.spec);
    for (const Cell& c : r.cells) s += fmt::format(" {} |", cell_text(c, r.backend.expect_failure));
    int pass = 0, unsup = 0;
    for (const Cell& c : r.cells) {
      pass += c.pass;
      unsup += c.unsupported;
    }
    if (r.backend.expect_failure) {
      const std::string where = r.backend.target.empty() ? "" : " in " + r.backend.target;
      s += r.ok() ? fmt::format(" caught{} ({} cases) |\n", where, r.total_fail())
                  : fmt::format(" **NOT CAUGHT{}** |\n", where);
    } else {
      s += r.ok() ? fmt::format(" pass ({} run, {} unsupported) |\n", pass, unsup)
                  : fmt::format(" **FAIL ({} cases)** |\n", r.total_fail());
    }
  }
  std::string legend;
  for (const BackendRow& r : rows) {
    if (const MutantInfo* m = find_mutant(r.backend.spec); m != nullptr) {
      legend += fmt::format("- `{}` ({}): {}\n", r.backend.spec, m->column, m->fault);
    }
  }
  if (!legend.empty()) s += "\nMutants:\n" + legend;
  std::string unsupported;
  for (const BackendRow& r : rows) {
    for (const auto& [col, why] : r.unsupported) {
      unsupported += fmt::format("- {} / {}: {}\n", r.backend.spec, col, why);
    }
  }
  if (!unsupported.empty()) s += "\nDeclared unsupported (first reason per column):\n" + unsupported;
  return s;
}

Report run_conformance(const attention::BackendRegistry& registry, const Options& options) {
  Report report;
  report.seed = options.seed;
  report.quick = options.quick;
  std::vector<std::string> specs = options.backends;
  if (specs.empty()) {
    // Device backends join when their platform exists on this machine.
    for (const auto& n : registry.names()) {
      const std::string device = registry.capabilities(n).device;
      if (device == "cpu" || try_platform(options.platforms, device) != nullptr) {
        specs.push_back(n);
      } else {
        // require_gpu (the GPU evidence runs): a device backend that cannot run fails.
        PAGODA_REQUIRE(!options.require_gpu, kUnsupported,
                       "backend '{}' needs a {} platform, absent on this machine "
                       "(--require-gpu is set)",
                       n, device);
        fmt::print("skipping '{}': no {} platform on this machine\n", n, device);
      }
    }
    // A hybrid: reference prefill with the cpu kernels' decode where built (amx decodes on
    // them too, over fewer dtypes), else another host backend's, else reference.
    std::string decode = "reference";
    for (const auto& n : registry.names()) {
      if (n != "reference" && registry.capabilities(n).device == "cpu") decode = n;
    }
    if (registry.contains("cpu")) decode = "cpu";
    specs.push_back("reference+" + decode);
  }
  const std::vector<Case> cases = make_cases(options.quick, options.long_kv);
  for (const Case& c : cases) {
    if (std::find(report.features.begin(), report.features.end(), c.feature) == report.features.end()) {
      report.features.push_back(c.feature);
    }
  }
  std::vector<BackendUnderTest> backends;
  auto add_mutant = [&](const MutantInfo& m) { backends.push_back({m.spec, true, m.column}); };
  for (const auto& s : specs) {
    if (s == "mutant") {
      for (const MutantInfo& m : mutant_family()) add_mutant(m);
    } else if (const MutantInfo* m = find_mutant(s); m != nullptr) {
      add_mutant(*m);
    } else {
      if (s.rfind("mutant", 0) == 0) mutant_faults(s);  // throws, naming the family
      backends.push_back({s, false, ""});
    }
  }
  if (std::none_of(backends.begin(), backends.end(), [](const auto& b) { return b.expect_failure; })) {
    for (const MutantInfo& m : mutant_family()) add_mutant(m);
  }
  fmt::print("pagoda conformance: {} cases × {} backends, seed {}\n", cases.size(),
             backends.size(), options.seed);
  for (const BackendUnderTest& b : backends) {
    BackendRow row{b, std::vector<Cell>(report.features.size()), -1, {}};
    if (!b.target.empty()) {
      const auto it = std::find(report.features.begin(), report.features.end(), b.target);
      if (it != report.features.end()) row.target_col = static_cast<int>(it - report.features.begin());
    }
    // One device platform per device backend row (its stream and allocator serve every case).
    const std::string device = device_of(registry, b.spec);
    std::unique_ptr<platform::Platform> device_platform;
    if (device != "cpu") {
      PAGODA_REQUIRE(options.platforms != nullptr, kUnsupported,
                     "backend '{}' runs on {}; the harness was given no platform registry",
                     b.spec, device);
      device_platform = options.platforms->make(device);  // kUnsupported when absent
      fmt::print("  {} runs on {} ({})\n", b.spec, device,
                 device_platform->capabilities().device_name);
    }
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      if (!b.target.empty() && c.feature != b.target) continue;  // a mutant runs its column
      const uint64_t seed = case_seed(options.seed, i);
      CaseResult r;
      try {
        r = run_case(registry, b, c, seed, device_platform.get());
      } catch (const std::exception& e) {
        r = {Verdict::kFail, fmt::format("harness error: {}", e.what())};
      }
      const size_t col = static_cast<size_t>(
          std::find(report.features.begin(), report.features.end(), c.feature) -
          report.features.begin());
      Cell& cell = row.cells[col];
      if (r.verdict == Verdict::kPass) ++cell.pass;
      if (r.verdict == Verdict::kUnsupported) {
        if (cell.unsupported++ == 0) row.unsupported.emplace_back(c.feature, r.message);
      }
      if (r.verdict == Verdict::kFail) {
        ++cell.fail;
        if (!b.expect_failure) {
          report.failures.push_back(fmt::format("{}: case #{} {} (case seed {}): {}", b.spec, i,
                                                c.describe(), seed, r.message));
          fmt::print("FAIL {}\n", report.failures.back());
        }
      }
      if (options.verbose) {
        fmt::print("  {:<10} #{:<3} {:<5} {} {}\n", b.spec, i,
                   r.verdict == Verdict::kPass ? "pass" : r.verdict == Verdict::kFail ? "FAIL" : "skip",
                   c.describe(), r.message);
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("  {:<24} {} ({} failed) in {:.1f} s\n", b.spec,
               row.ok() ? (b.expect_failure ? "caught" : "ok") : "NOT OK", row.total_fail(), secs);
    report.rows.push_back(std::move(row));
  }
  return report;
}

}  // namespace pagoda::backends::conformance
