#pragma once
/// The conformance harness (ARCHITECTURE §5): every backend × every case against the reference
/// oracle, with real KvPool + ReqToTokenTable, permuted pages, NaN-poisoned KV outside the
/// requests and NaN-poisoned outputs. Used by `pagoda conformance` and the CTest "conformance".
///
/// The expected values come from the oracle BatchAttention run over a dense, token-granular copy
/// of each request's logical K/V (built without the pool, the table or build_paged_plan); every
/// backend under test, the reference backend included, runs the full path (plan from the table,
/// KV write, paged kernel), so the oracle is never compared with itself. A deliberately broken
/// "mutant" (causal boundary off by one) must fail, proving the comparison bites.
///
/// Device backends (capabilities().device != "cpu", e.g. "cuda") run the same cases on their
/// device: the pool is built on the device platform's allocator (a NaN-poisoned host mirror is
/// filled with the cached tokens and copied over), q/k/v are copied to device views, the outputs
/// are NaN-poisoned on the device, and O / LSE are copied back for the host comparison. The oracle
/// always runs on the host. Only the platform::Allocator interface is used, so this module needs
/// no CUDA headers; the caller supplies the platforms (Options::platforms).
///
/// The oracle (oracle.h) is an independent naive fp64 implementation of the math; the reference
/// backend is a backend under test like any other. The mutant family (mutant_family()) are
/// reference backends with one ReferenceFaults fault each; each must fail at least one case of
/// the column that targets it (it runs only that column's cases), or the run fails. A case a
/// backend's capabilities() do not declare supported is "unsupported" with the declared reason,
/// printed under the matrix; a backend that throws on a case it declares supported fails it.
/// The "long" column crosses split-KV chunks and hundreds of pages (kv up to Options::long_kv,
/// 4,096 by default), with batches mixing 1-token and long requests; its LSE check resolves a
/// single dropped key (oracle.h). The "draft-extend" column runs kDraftExtend batches: ragged
/// accepted counts (1..num_steps+1, some requests with one) over prefixes from a few tokens to
/// past the split-KV chunk size, some accepted runs crossing a page boundary.
///
/// The linear-* columns run the linear-attention (Mamba2) kind of each backend name
/// (attention/linear_backend.h; a name without one, or a prefill+decode composition, is
/// unsupported) on a real StatePool against an fp64 oracle of their own (linear_oracle.h):
/// linear-prefill (lengths around the SSD chunk size, several chunk sizes), linear-decode
/// (single steps), linear-split (a prefill cut into several calls), linear-restore (copy_slot,
/// then continue, equals continuing the original) and linear-verify (draft trees, each node
/// following its parent). Every case starts from random states, NaN-poisons y, and checks that
/// the slots and layers it does not name keep their bytes (linear_runner.cpp).
///
/// The dsa-indexer column runs a backend's DSA lightning indexer (select_index_topk) over a
/// pool whose index keys are random (per-token magnitudes, so the fp8 scales differ; some keys
/// repeated, and one row with zero head weights, so exact ties occur) on shuffled pages, the
/// rest of the pool NaN-poisoned, against an fp64 oracle that quantises the keys itself
/// (indexer_runner.cpp).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/attention/forward_mode.h"
#include "pagoda/attention/layer.h"
#include "pagoda/attention/linear_backend.h"
#include "pagoda/attention/registry.h"
#include "pagoda/core/dtype.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends::conformance {

/// What a linear-layer case runs (the linear-* columns).
enum class LinearOp : uint8_t {
  kNone,     ///< an attention case
  kPrefill,  ///< one call of every sequence
  kDecode,   ///< single-token steps
  kSplit,    ///< each sequence cut into several calls
  kRestore,  ///< a prefix, copy_slot, then the rest in both slots
  kVerify,   ///< a draft tree beside a decode and a prefill
};

/// A linear-layer case: the op, the layer's sizes and each sequence's tokens (kVerify: the
/// tree's size first).
struct LinearCase {
  LinearOp op = LinearOp::kNone;
  attention::LinearShape shape;
  std::vector<int> lengths;
};

/// One conformance case: a batch shape, the layer's features and the step's mode.
struct Case {
  std::string feature;  ///< matrix column ("decode", "extend", "sinks", "verify-tree", ...)
  attention::ForwardMode mode = attention::ForwardMode::kDecode;
  int page_size = 16;
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim_qk = 128;
  int head_dim_v = 128;
  bool mla = false;  ///< absorbed MLA (576 / 512) over an MLA pool
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  float k_scale = 1.f;
  float v_scale = 1.f;
  attention::MaskKind mask = attention::MaskKind::kCausal;
  int window_left = -1;
  float logit_cap = 0.f;
  bool sinks = false;
  int batch_size = 3;
  int max_len = 90;  ///< upper bound of the random prefix / sequence lengths
  // Speculative decoding.
  int topk = 1;
  int num_steps = 3;         ///< draft steps; kDraftExtend: 1..num_steps+1 accepted per request
  int draft_step = -1;       ///< >= 0: multi-step draft step (mode kDecode)
  int num_draft_tokens = 0;  ///< kTargetVerify: tree size D
  bool tree_mask = true;     ///< kTargetVerify: pass the FULL_MASK (false: chain, no mask)
  /// > 0: long context: even requests hold long_kv - (0..long_kv/4) tokens (request 0 exactly
  /// long_kv), odd requests are 1-token requests (decode: kv 1; extend: no prefix).
  int long_kv = 0;
  /// > 0: DeepSeek sparse attention (MLA only): the pool holds index keys, and every query row
  /// attends to the dsa_topk visible positions of highest random score (ties to the lower
  /// position, as the indexer selects; a row that sees fewer keeps them all), handed to the
  /// backend through set_sparse_topk; the oracle gets the selection as a custom mask.
  int dsa_topk = 0;
  /// The dsa-indexer column (indexer_runner.cpp): no forward, but the backend's
  /// select_index_topk with k = dsa_topk over a pool of random index keys on shuffled pages
  /// (num_q_heads index heads of head_dim_qk), checked against an fp64 oracle of the scores,
  /// the selection and its tie rule.
  bool dsa_indexer = false;
  /// The ragged column: the step runs as MLA's expanded prefill form drives a backend
  /// (save_kv of the new K/V, gather_kv of every visible row into NaN-poisoned buffers,
  /// forward_ragged over them) instead of forward(); the same oracle as the paged step, no LSE.
  bool ragged = false;
  /// linear.op != kNone: a linear-layer case; the attention fields above are unused.
  LinearCase linear;

  /// "decode p16 gqa8/2 d128 bf16/bf16 ..." (stable; used in failure messages).
  std::string describe() const;
  /// What a backend must support to run this case (an attention case).
  attention::BackendRequirements requirements() const;
  /// What a linear-attention backend must support to run this case (a linear case).
  attention::LinearRequirements linear_requirements() const;
};

/// The full grid (quick = false) or a representative subset covering every feature column;
/// the "long" cases reach `long_kv` keys.
std::vector<Case> make_cases(bool quick, int long_kv = 4096);

/// One member of the mutant family: spec "mutant:<name>", one fault of the reference oracle,
/// and the matrix column (Case::feature) that must catch it.
struct MutantInfo {
  std::string spec;
  std::string column;
  std::string fault;  ///< what is broken, for the legend
};
/// Every mutant: causal shift, dropped sinks, window off by one, soft cap skipped, one mask bit
/// flipped, page index off by one, split-KV merge with a wrong LSE, fp8 scale ignored, wrong GQA
/// head mapping; two draft-extend planning faults in front of the reference (draft extend
/// planned as decode; each request's kv range one key short, its last accepted token left out);
/// and a DSA selection missing one token per row (the reference given each row's top-k without
/// its first entry); three faults of the reference's DSA indexer (each key read one page off,
/// the keys' scales ignored, each row's best position left out); for the linear kind, a stale state
/// (every call from a zero state) and a conv window one input early (the reference linear backend
/// with a LinearFaults fault).
const std::vector<MutantInfo>& mutant_family();
/// The family member named `spec`, or nullptr.
const MutantInfo* find_mutant(const std::string& spec);

/// Outcome of one backend on one case.
enum class Verdict { kPass, kFail, kUnsupported };
struct CaseResult {
  Verdict verdict = Verdict::kPass;
  std::string message;  ///< failure detail or unsupported reason
};

/// A backend under test: a registry name, "prefill+decode" (HybridBackend), or a mutant
/// ("mutant:<name>"; plain "mutant" is the causal-shift one).
struct BackendUnderTest {
  std::string spec;
  bool expect_failure = false;  ///< a mutant: must fail at least one case of `target`
  std::string target;           ///< a mutant's column (empty: any column)
};

/// Runs `c` on `backend` (built through `registry`) with inputs derived from `seed`; a linear
/// case on the spec's linear-attention kind (a device one on a StatePool of `device_platform`).
/// `device_platform` is the platform a device backend runs on (its name() must equal the
/// backend's capabilities().device; the harness synchronises it around the run). CPU backends
/// ignore it and get a fresh CPU platform per case. A device backend without a matching
/// platform throws Error(kFailedPrecondition). Unsupported requirements: Verdict::kUnsupported.
CaseResult run_case(const attention::BackendRegistry& registry, const BackendUnderTest& backend,
                    const Case& c, uint64_t seed, platform::Platform* device_platform = nullptr);

/// The device a backend spec runs on ("cpu" for mutants; a hybrid's children share one).
std::string device_of(const attention::BackendRegistry& registry, const std::string& spec);

struct Options {
  /// Empty: every registered backend + a hybrid. "mutant" expands to the whole family, which
  /// is appended when no mutant is named.
  std::vector<std::string> backends;
  bool quick = false;
  uint64_t seed = 1234;
  bool verbose = false;  ///< print every case, not only failures
  int long_kv = 4096;    ///< longest context of the "long" column
  /// A device backend of the default list without its platform fails the run (Error
  /// kUnsupported) instead of being skipped (`pagoda conformance --require-gpu`).
  bool require_gpu = false;
  /// Platforms for device backends: one is made per device backend row with
  /// platforms->make(device). Null, or a device absent on this machine: device backends are
  /// skipped from the default list, and a named one throws Error(kUnsupported).
  const platform::PlatformRegistry* platforms = nullptr;
};

/// Per-backend, per-feature counts.
struct Cell {
  int pass = 0, fail = 0, unsupported = 0;
};
struct BackendRow {
  BackendUnderTest backend;
  std::vector<Cell> cells;  ///< aligned with Report::features
  int target_col = -1;      ///< a mutant's column index in Report::features (-1: absent / any)
  /// (column, declared reason) of the first unsupported case of each column.
  std::vector<std::pair<std::string, std::string>> unsupported;
  int total_fail() const;
  /// The row passes: no failure, or (a mutant) at least one failure in its target column.
  bool ok() const;
};
struct Report {
  uint64_t seed = 0;
  bool quick = false;
  std::vector<std::string> features;
  std::vector<BackendRow> rows;
  std::vector<std::string> failures;  ///< one line per failing case (backend, case, seed)
  bool ok() const;
  /// The backend × feature matrix as a Markdown table, then the mutants' faults and every
  /// declared unsupported reason.
  std::string markdown() const;
};

/// Runs every backend of `options` on every case, printing progress and failures to stdout.
Report run_conformance(const attention::BackendRegistry& registry, const Options& options);

}  // namespace pagoda::backends::conformance
