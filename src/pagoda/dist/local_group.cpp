#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/dist/communicator.h"

namespace pagoda::dist {

/// The shared rendezvous: a reusable generation barrier that abort() can break, and one input
/// pointer per rank for the collective in flight.
struct LocalGroup::State {
  explicit State(int n) : world(n), inputs(static_cast<size_t>(n), nullptr) {}
  const int world;
  std::mutex mu;
  std::condition_variable cv;
  int waiting = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<const void*> inputs;

  void check_live() const {
    PAGODA_REQUIRE(!aborted, kFailedPrecondition, "the tensor-parallel group was aborted");
  }
  /// Blocks until every rank has arrived (or the group is aborted: throws).
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu);
    check_live();
    const uint64_t gen = generation;
    if (++waiting == world) {
      waiting = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) check_live();
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    aborted = true;
    cv.notify_all();
  }
};

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup::State> s, int rank)
      : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }
  std::string name() const override { return "local"; }

  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    require_f32(dtype);
    publish(data);
    // Every rank sums all inputs in rank order into its scratch (same bits everywhere), then
    // waits until nobody reads the inputs any more before overwriting its own.
    scratch_.assign(static_cast<size_t>(count), 0.f);
    for (int r = 0; r < s_->world; ++r) {
      const float* in = static_cast<const float*>(s_->inputs[static_cast<size_t>(r)]);
      for (int64_t i = 0; i < count; ++i) scratch_[static_cast<size_t>(i)] += in[i];
    }
    s_->arrive_and_wait();
    std::memcpy(data, scratch_.data(), static_cast<size_t>(count) * sizeof(float));
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    require_f32(dtype);
    publish(send);
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    for (int r = 0; r < s_->world; ++r)
      std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes,
                  s_->inputs[static_cast<size_t>(r)], bytes);
    s_->arrive_and_wait();
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    PAGODA_REQUIRE(root >= 0 && root < s_->world, kOutOfRange, "broadcast root {} outside [0, {})",
                   root, s_->world);
    publish(data);
    if (rank_ != root)
      std::memcpy(data, s_->inputs[static_cast<size_t>(root)], static_cast<size_t>(bytes));
    s_->arrive_and_wait();
  }

  void abort() override { s_->abort(); }

 private:
  static void require_f32(DType dtype) {
    PAGODA_REQUIRE(dtype == DType::kF32, kUnsupported,
                   "the in-process group reduces f32 only (got {})", dtype_name(dtype));
  }
  /// Makes `p` this rank's input and waits until every rank has published its own.
  /// (The previous collective ended with a barrier after its last read, so the inputs are free.)
  void publish(const void* p) {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->inputs[static_cast<size_t>(rank_)] = p;
    }
    s_->arrive_and_wait();
  }

  std::shared_ptr<LocalGroup::State> s_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

LocalGroup::LocalGroup(int world_size) {
  PAGODA_REQUIRE(world_size >= 1 && world_size <= 64, kInvalidArgument,
                 "a local group has 1..64 ranks (got {})", world_size);
  state_ = std::make_shared<State>(world_size);
}

LocalGroup::~LocalGroup() = default;

int LocalGroup::world_size() const { return state_->world; }

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  PAGODA_REQUIRE(rank >= 0 && rank < state_->world, kOutOfRange, "rank {} outside [0, {})", rank,
                 state_->world);
  return std::make_unique<LocalCommunicator>(state_, rank);
}

void LocalGroup::abort() { state_->abort(); }

}  // namespace pagoda::dist
