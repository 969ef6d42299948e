#pragma once
// The fp64 oracle of sparse absorbed-MLA attention shared by the backend tests (sparse_mla_test,
// sparse_gather_test): written from the math, independently of the backends under test.

#include <algorithm>
#include <cmath>
#include <vector>

namespace pagoda::backends::testing {

struct SparseExpected {
  std::vector<double> out;  ///< [rows, heads, rank]
  std::vector<double> lse;  ///< [rows, heads], base 2; -inf for a row that sees nothing
};

/// Query row r, head h (q [rows, heads, dim]) attends to the keys seen[r] lists (each `dim`
/// floats, the value its first `rank`): softmax(scale · q · key) · value in f64, and the LSE.
inline SparseExpected sparse_mla_oracle(const std::vector<float>& q, int heads, int dim, int rank,
                                        double scale,
                                        const std::vector<std::vector<const float*>>& seen) {
  SparseExpected e{std::vector<double>(seen.size() * heads * rank, 0.0),
                   std::vector<double>(seen.size() * heads, -INFINITY)};
  std::vector<double> s;
  for (size_t r = 0; r < seen.size(); ++r)
    for (int h = 0; h < heads; ++h) {
      if (seen[r].empty()) continue;
      const float* qh = q.data() + (r * heads + h) * dim;
      s.clear();
      for (const float* key : seen[r]) {
        double dot = 0;
        for (int j = 0; j < dim; ++j) dot += double(qh[j]) * key[j];
        s.push_back(scale * dot);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* o = e.out.data() + (r * heads + h) * rank;
      for (size_t j = 0; j < s.size(); ++j)
        for (int c = 0; c < rank; ++c) o[c] += s[j] / sum * seen[r][j][c];
      e.lse[r * heads + h] = (mx + std::log(sum)) / std::log(2.0);
    }
  return e;
}

}  // namespace pagoda::backends::testing
