// PdRooms: the room table and counters of a disaggregated server, and the shared context.
#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "pagoda/server/api_request.h"
#include "pagoda/server/pd.h"

namespace pagoda::server {

bool PdRooms::open(uint64_t room, const std::string& state) {
  std::lock_guard lock(mu_);
  return rooms_.emplace(room, state).second;
}

void PdRooms::set_state(uint64_t room, const std::string& state) {
  std::lock_guard lock(mu_);
  rooms_[room] = state;
}

void PdRooms::end_room(uint64_t room, const std::string& failure) {
  std::lock_guard lock(mu_);
  rooms_.erase(room);
  aborted_.erase(room);
  if (failure.empty()) {
    ++completed_;
  } else {
    ++failures_[failure];
  }
}

void PdRooms::reject(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++rejected_[reason];
}

void PdRooms::add_transfer(uint64_t bytes, double seconds) {
  std::lock_guard lock(mu_);
  bytes_ += bytes;
  seconds_ += seconds;
  ++transfers_;
}

void PdRooms::add_reused(uint64_t pages) {
  std::lock_guard lock(mu_);
  reused_pages_ += pages;
}

bool PdRooms::abort(uint64_t room) {
  std::lock_guard lock(mu_);
  if (rooms_.count(room) == 0) return false;
  aborted_.insert(room);
  return true;
}

bool PdRooms::aborted(uint64_t room) const {
  std::lock_guard lock(mu_);
  return aborted_.count(room) != 0;
}

std::string PdRooms::render() const {
  std::lock_guard lock(mu_);
  const char* role = role_ == PdRole::kPrefill ? "prefill" : "decode";
  const std::vector<std::string> states =
      role_ == PdRole::kPrefill ? std::vector<std::string>{"prefilling", "transferring"}
                                : std::vector<std::string>{"preallocating", "bootstrapping"};
  std::string out =
      "# HELP pagoda_pd_rooms Disaggregation rooms in each state.\n# TYPE pagoda_pd_rooms gauge\n";
  for (const std::string& st : states) {
    int64_t n = 0;
    for (const auto& [room, s] : rooms_) n += s == st;
    out += fmt::format("pagoda_pd_rooms{{role=\"{}\",state=\"{}\"}} {}\n", role, st, n);
  }
  out += fmt::format(
      "# HELP pagoda_pd_rooms_completed_total Rooms whose KV moved and committed.\n"
      "# TYPE pagoda_pd_rooms_completed_total counter\n"
      "pagoda_pd_rooms_completed_total{{role=\"{}\"}} {}\n",
      role, completed_);
  out += "# HELP pagoda_pd_room_failures_total Rooms that failed, by reason.\n"
         "# TYPE pagoda_pd_room_failures_total counter\n";
  for (const auto& [reason, n] : failures_)
    out += fmt::format("pagoda_pd_room_failures_total{{role=\"{}\",reason=\"{}\"}} {}\n", role,
                       reason, n);
  out += "# HELP pagoda_pd_rejected_total Bootstrap messages or answers rejected, by reason.\n"
         "# TYPE pagoda_pd_rejected_total counter\n";
  for (const auto& [reason, n] : rejected_)
    out += fmt::format("pagoda_pd_rejected_total{{role=\"{}\",reason=\"{}\"}} {}\n", role,
                       reason, n);
  out += fmt::format(
      "# HELP pagoda_pd_transfer_bytes_total KV bytes written to or received from the peer.\n"
      "# TYPE pagoda_pd_transfer_bytes_total counter\n"
      "pagoda_pd_transfer_bytes_total{{role=\"{0}\"}} {1}\n"
      "# HELP pagoda_pd_transfer_seconds_total Time spent in KV transfers.\n"
      "# TYPE pagoda_pd_transfer_seconds_total counter\n"
      "pagoda_pd_transfer_seconds_total{{role=\"{0}\"}} {2}\n"
      "# HELP pagoda_pd_transfers_total KV transfers.\n"
      "# TYPE pagoda_pd_transfers_total counter\n"
      "pagoda_pd_transfers_total{{role=\"{0}\"}} {3}\n",
      role, bytes_, seconds_, transfers_);
  if (role_ == PdRole::kDecode)
    out += fmt::format(
        "# HELP pagoda_pd_reused_pages_total Prompt pages found in this server's radix cache "
        "(not transferred).\n# TYPE pagoda_pd_reused_pages_total counter\n"
        "pagoda_pd_reused_pages_total {}\n",
        reused_pages_);
  return out;
}

nlohmann::json layout_json(const disagg::KvLayout& l) {
  return {{"model", l.model},
          {"weights", l.weights},
          {"dtype", std::string(dtype_name(l.dtype))},
          {"kv_dtype", std::string(dtype_name(l.kv_dtype))},
          {"page_size", l.page_size},
          {"num_layers", l.num_layers},
          {"num_kv_heads", l.num_kv_heads},
          {"head_dim", l.head_dim},
          {"head_dim_v", l.head_dim_v}};
}

disagg::KvLayout parse_layout(const nlohmann::json& j) {
  if (!j.is_object()) throw_invalid("layout", "must be an object");
  auto get = [&](const char* key) -> const nlohmann::json& {
    auto it = j.find(key);
    if (it == j.end()) throw_invalid(std::string("layout.") + key, "is missing");
    return *it;
  };
  auto dtype = [&](const char* key) {
    const std::string name = get(key).is_string() ? get(key).get<std::string>() : "";
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4M3, DType::kFp8E5M2})
      if (dtype_name(t) == name) return t;
    throw_invalid(std::string("layout.") + key, "unknown dtype '" + name + "'");
  };
  auto integer = [&](const char* key) {
    if (!get(key).is_number_integer()) throw_invalid(std::string("layout.") + key, "must be an integer");
    return get(key).get<int32_t>();
  };
  if (!get("model").is_string()) throw_invalid("layout.model", "must be a string");
  if (!get("weights").is_number_unsigned() && !get("weights").is_number_integer())
    throw_invalid("layout.weights", "must be an integer");
  return disagg::KvLayout{.model = get("model").get<std::string>(),
                          .weights = get("weights").get<uint64_t>(),
                          .dtype = dtype("dtype"),
                          .kv_dtype = dtype("kv_dtype"),
                          .page_size = integer("page_size"),
                          .num_layers = integer("num_layers"),
                          .num_kv_heads = integer("num_kv_heads"),
                          .head_dim = integer("head_dim"),
                          .head_dim_v = integer("head_dim_v")};
}

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    out += kDigits[static_cast<unsigned>(b) >> 4];
    out += kDigits[static_cast<unsigned>(b) & 15];
  }
  return out;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) throw_invalid("descriptor", "odd number of hex digits");
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw_invalid("descriptor", "not lower-case hex");
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return out;
}

std::string render_pd_metrics(const PdContext& pd) {
  return pd.rooms.render() +
         fmt::format(
             "# HELP pagoda_pd_staging_pages Pinned staging pages of the KV transfer.\n"
             "# TYPE pagoda_pd_staging_pages gauge\n"
             "pagoda_pd_staging_pages{{state=\"free\"}} {}\n"
             "pagoda_pd_staging_pages{{state=\"total\"}} {}\n",
             pd.staging->free_pages(), pd.staging->capacity());
}

std::unique_ptr<platform::Event> compute_mark(PdContext& pd) {
  std::unique_ptr<platform::Event> mark;
  pd.loop->run_on_loop([&](engine::Engine&) {
    mark = pd.platform->make_event();
    mark->record();
  });
  return mark;
}

std::unique_ptr<PdContext> make_pd_context(PdRole role, engine::Engine& engine,
                                           platform::Platform& platform, EngineLoop& loop,
                                           const std::string& model, uint64_t weights,
                                           double timeout_s, int64_t staging_tokens) {
  kv::KvPool& pool = engine.worker().kv_pool();
  auto pd = std::make_unique<PdContext>(role);
  pd->loop = &loop;
  pd->platform = &platform;
  pd->pool = &pool;
  pd->layout = disagg::layout_of(pool, model, weights, engine.stats().dtype);
  const int64_t tokens = staging_tokens > 0 ? staging_tokens : engine.max_context_len();
  const int64_t pages = (tokens + pool.page_size() - 1) / pool.page_size();
  PAGODA_REQUIRE(pages <= INT32_MAX / pool.page_size() - 1, kInvalidArgument,
                 "--disaggregation-staging-tokens {} is too large", tokens);
  try {
    pd->staging = std::make_unique<disagg::StagingPool>(
        pool.config(), static_cast<int32_t>(pages), platform.pinned_allocator());
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kResourceExhausted) throw;
    throw_error(ErrorCode::kResourceExhausted,
                "the KV transfer's staging of {} tokens does not fit in pinned memory (lower "
                "--disaggregation-staging-tokens): {}",
                tokens, e.what());
  }
  pd->transfer = disagg::make_ucx_transfer(pd->staging->regions());
  pd->timeout_s = timeout_s;
  return pd;
}

}  // namespace pagoda::server
