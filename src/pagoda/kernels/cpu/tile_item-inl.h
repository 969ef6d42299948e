// The bf16 extend tile path of the CPU kernels: one work item's query rows of one KV head form a
// tile with the rows in vector lanes (Q packed once as bf16 pairs). Per block of kv_block keys:
//   S^T = K·Q^T  (tile_scores_bf16: vdpbf16ps, K pairs broadcast straight from the paged cache),
//   online softmax down the key axis, all rows of a vector at once (f32, Highway),
//   P rounded to bf16 pairs, V packed into key pairs, O^T += V^T·P^T (tile_pv_bf16).
// GQA: the query heads of one KV head are rows of the same tile, so K/V are read once per group.
// Included once per Highway target inside HWY_NAMESPACE by paged_attention.cpp (after ItemMasks
// and FinishRow); no include guard on purpose.

/// True when item `it` takes the tile path: bf16 q/K/V, even head dims, 4-byte aligned K rows,
/// more than kDirectMaxRowsPerHead rows per KV head, p.bf16_tiles and a CPU with AVX512-BF16.
HWY_INLINE bool TileEligible(const CpuAttentionParams& p, const CpuWorkItem& it) {
  const int rph = (it.q_end - it.q_begin) * (it.group_end - it.group_begin);
  const bool aligned = reinterpret_cast<uintptr_t>(p.k.data) % 4 == 0 &&
                       (p.k.stride_page | p.k.stride_slot | p.k.stride_head) % 2 == 0;
  return rph > kDirectMaxRowsPerHead && p.q_dtype == DType::kBF16 &&
         p.k.dtype == DType::kBF16 && p.v.dtype == DType::kBF16 && p.head_dim_qk % 2 == 0 &&
         p.head_dim_v % 2 == 0 && aligned && p.bf16_tiles &&
         detail::cpu_avx512bf16_available();
}

/// bf16 bits (round to nearest even) of finite non-negative f32 lanes, in the low 16 bits.
template <class DU, class V>
HWY_INLINE hn::Vec<DU> Bf16Bits(DU du, V v) {
  const auto u = hn::BitCast(du, v);
  const auto bias = hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
  return hn::ShiftRight<16>(hn::Add(u, bias));
}

/// The running max of a row is only raised when a block's max exceeds it by more than this
/// (natural-log units): probabilities then stay <= e^8 (no overflow in f32 or bf16) and the
/// output rescale, a pass over the whole accumulator, is skipped for most blocks.
constexpr float kLazyRescale = 8.f;

/// Online-softmax update of one block for rows [0, rp) (rows in lanes): caps and masks the
/// scores st[j * ld + r] of keys j in [0, n) (key index t0 + j; masking skipped when `full`, i.e.
/// every key is visible to every row), updates m (the last attained max, or -inf), l, rescales
/// ot, and writes the probabilities: as bf16 pairs into pt when pt is non-null, else as f32
/// over st.
HWY_INLINE void TileSoftmax(float* HWY_RESTRICT st, int n, int t0, bool full, int ld, int rp,
                            int dv, const int32_t* lo, const int32_t* hi, float cap, float* m,
                            float* l, uint32_t* HWY_RESTRICT pt, float* HWY_RESTRICT ot) {
  const DF d;
  const DI di;
  const hn::RebindToUnsigned<DF> du;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vinf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const VF vcap = hn::Set(d, cap);
  const VF one = hn::Set(d, 1.f);
  const int np = (n + 1) / 2;
  for (int rv = 0; rv < rp; rv += N) {
    const auto lom1 = hn::Sub(hn::LoadU(di, lo + rv), hn::Set(di, 1));
    const auto hiv = hn::LoadU(di, hi + rv);
    VF vmax = vinf;
    if (cap > 0.f || !full) {
      for (int j = 0; j < n; ++j) {
        float* sp = st + static_cast<int64_t>(j) * ld + rv;
        VF s = hn::LoadU(d, sp);
        if (cap > 0.f) s = hn::IfThenElse(hn::Eq(s, vinf), s, hn::Mul(vcap, hn::Tanh(d, s)));
        if (!full) {
          const auto key = hn::Set(di, t0 + j);
          const auto vis = hn::And(hn::Gt(key, lom1), hn::Lt(key, hiv));
          s = hn::IfThenElse(hn::RebindMask(d, vis), s, vinf);
        }
        hn::StoreU(s, d, sp);
        vmax = hn::Max(vmax, s);
      }
    } else {
      for (int j = 0; j < n; ++j) vmax = hn::Max(vmax, hn::LoadU(d, st + static_cast<int64_t>(j) * ld + rv));
    }
    const VF m_old = hn::LoadU(d, m + rv);
    const VF m_new = hn::Max(m_old, vmax);
    const auto first = hn::Eq(m_old, vinf);
    const auto grow = hn::Or(first, hn::Gt(m_new, hn::Add(m_old, hn::Set(d, kLazyRescale))));
    const VF m_keep = hn::IfThenElse(grow, m_new, m_old);
    const VF m_use = hn::IfThenZeroElse(hn::Eq(m_keep, vinf), m_keep);
    const auto rescale = hn::AndNot(first, grow);
    const bool any_rescale = !hn::AllFalse(d, rescale);
    const VF alpha = any_rescale ? hn::IfThenElse(rescale, hn::Exp(d, hn::Sub(m_old, m_new)), one) : one;
    VF lsum = hn::Zero(d);
    for (int j2 = 0; j2 < np; ++j2) {
      const VF s0 = hn::LoadU(d, st + static_cast<int64_t>(2 * j2) * ld + rv);
      const VF p0 = hn::IfThenZeroElse(hn::Eq(s0, vinf), hn::Exp(d, hn::Sub(s0, m_use)));
      VF p1 = hn::Zero(d);
      float* s1p = st + static_cast<int64_t>(2 * j2 + 1) * ld + rv;
      if (2 * j2 + 1 < n) {
        const VF s1 = hn::LoadU(d, s1p);
        p1 = hn::IfThenZeroElse(hn::Eq(s1, vinf), hn::Exp(d, hn::Sub(s1, m_use)));
      }
      lsum = hn::Add(lsum, hn::Add(p0, p1));
      if (pt != nullptr) {
        const auto pair = hn::Or(Bf16Bits(du, p0), hn::ShiftLeft<16>(Bf16Bits(du, p1)));
        hn::StoreU(pair, du, pt + static_cast<int64_t>(j2) * ld + rv);
      } else {
        hn::StoreU(p0, d, st + static_cast<int64_t>(2 * j2) * ld + rv);
        if (2 * j2 + 1 < n) hn::StoreU(p1, d, s1p);
      }
    }
    hn::StoreU(hn::MulAdd(hn::LoadU(d, l + rv), alpha, lsum), d, l + rv);
    hn::StoreU(m_keep, d, m + rv);
    if (any_rescale) {
      for (int x = 0; x < dv; ++x) {
        float* o = ot + static_cast<int64_t>(x) * ld + rv;
        hn::StoreU(hn::Mul(alpha, hn::LoadU(d, o)), d, o);
      }
    }
  }
}

/// vpk[j2 * dv + x] = (v_{2 j2}[x], v_{2 j2 + 1}[x]) as a bf16 pair; a missing odd key is 0.
HWY_INLINE void PackValuePairs(const uint16_t* const* vrows, int n, int dv,
                               uint32_t* HWY_RESTRICT vpk) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, decltype(du)> d16;
  const int N = static_cast<int>(hn::Lanes(du));
  for (int j2 = 0; j2 < (n + 1) / 2; ++j2) {
    const uint16_t* a = vrows[2 * j2];
    const uint16_t* b = 2 * j2 + 1 < n ? vrows[2 * j2 + 1] : nullptr;
    uint32_t* dst = vpk + static_cast<int64_t>(j2) * dv;
    int x = 0;
    for (; x + N <= dv; x += N) {
      const auto va = hn::PromoteTo(du, hn::LoadU(d16, a + x));
      const auto vb = b != nullptr ? hn::PromoteTo(du, hn::LoadU(d16, b + x)) : hn::Zero(du);
      hn::StoreU(hn::Or(va, hn::ShiftLeft<16>(vb)), du, dst + x);
    }
    for (; x < dv; ++x) dst[x] = a[x] | (b != nullptr ? static_cast<uint32_t>(b[x]) << 16 : 0u);
  }
}

/// vf[j * dv + x] = v_j[x] as f32 for keys j in [0, n).
HWY_INLINE void PackValuesF32(const uint16_t* const* vrows, int n, int dv, float* HWY_RESTRICT vf) {
  for (int j = 0; j < n; ++j) {
    ConvertRow(DType::kBF16, vrows[j], dv, dv, vf + static_cast<int64_t>(j) * dv);
  }
}

/// Runs work item `it` on the tile path (see TileEligible); same outputs as ProcessItem.
void ProcessItemTile(const CpuAttentionParams& p, const CpuSchedule& sch, const CpuWorkItem& it,
                     float* scratch) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int b = it.request;
  const int64_t qo_start = p.qo_indptr[b];
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gs = it.group_end - it.group_begin;
  const int rph = (it.q_end - it.q_begin) * gs;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v, dq2 = dqk / 2;
  const int T = sch.kv_block;
  const detail::ScratchLayout lay(sch.max_rows, sch.max_rows, dqk, dv, T);
  const detail::TileLayout tl(sch.max_rows, dqk, dv, T);
  float* base = scratch + lay.tile;
  const int ld = static_cast<int>(tl.ld);
  const int nrv = (rph + 15) / 16;
  const int rp = nrv * 16;
  auto* qt = reinterpret_cast<uint32_t*>(base + tl.qt);
  float* st = base + tl.st;
  auto* pt = reinterpret_cast<uint32_t*>(base + tl.pt);
  auto* vpk = reinterpret_cast<uint32_t*>(base + tl.vpk);
  float* ot = base + tl.ot;
  float* mrow = base + tl.m;
  float* lrow = base + tl.l;
  auto* lo = reinterpret_cast<int32_t*>(base + tl.lo);
  auto* hi = reinterpret_cast<int32_t*>(base + tl.hi);
  auto* qs = reinterpret_cast<uint32_t*>(base + tl.qs);
  float* orow = scratch + lay.acc;

  RowMask masks[kCpuMaxRows];
  int ulo = 0, uhi = 0;
  ItemMasks(p, it, masks, &ulo, &uhi);
  int max_lo = std::numeric_limits<int32_t>::min(), min_hi = std::numeric_limits<int32_t>::max();
  for (int rr = 0; rr < rp; ++rr) {
    lo[rr] = rr < rph ? masks[rr / gs].lo : std::numeric_limits<int32_t>::max();
    hi[rr] = rr < rph ? masks[rr / gs].hi : std::numeric_limits<int32_t>::min();
    if (rr < rph) {
      max_lo = std::max(max_lo, lo[rr]);
      min_hi = std::min(min_hi, hi[rr]);
    }
  }
  // Padding rows (rr >= rph) see garbage-free zero queries; their lanes are never written out.
  const float cap = p.logit_cap;
  const float qscale = p.sm_scale * p.k_scale / (cap > 0.f ? cap : 1.f);
  const int32_t* pages = p.kv_indices + p.kv_indptr[b];
  const auto* kb = static_cast<const uint16_t*>(p.k.data);
  const auto* vb = static_cast<const uint16_t*>(p.v.data);
  const uint32_t* krows[256];
  const uint16_t* vrows[256];
  // P·V in bf16 only for a bf16 output (P's rounding, 2^-9 relative, is then below the output's
  // own); f32 / f16 outputs keep exact f32 probabilities.
  const bool bf16_p = p.out_dtype == DType::kBF16;

  for (int h = it.kv_head_begin; h < it.kv_head_end; ++h) {
    // Q pairs: rows copied contiguously (vector loads, many misses in flight), then transposed
    // inside L1 into rows-in-lanes order.
    for (int rr = 0; rr < rp; ++rr) {
      uint32_t* dst = qs + static_cast<int64_t>(rr) * dq2;
      if (rr < rph) {
        const int qhead = h * group + it.group_begin + rr % gs;
        std::memcpy(dst, static_cast<const uint16_t*>(p.q) +
                             (qo_start + it.q_begin + rr / gs) * p.q_stride_token +
                             static_cast<int64_t>(qhead) * p.q_stride_head,
                    static_cast<size_t>(dq2) * sizeof(uint32_t));
      } else {
        std::memset(dst, 0, static_cast<size_t>(dq2) * sizeof(uint32_t));
      }
      mrow[rr] = neg_inf;
      lrow[rr] = 0.f;
    }
    for (int d2 = 0; d2 < dq2; ++d2) {
      uint32_t* dst = qt + static_cast<int64_t>(d2) * ld;
      for (int rr = 0; rr < rp; ++rr) dst[rr] = qs[static_cast<int64_t>(rr) * dq2 + d2];
    }
    for (int x = 0; x < dv; ++x) {
      for (int rv = 0; rv < rp; rv += N) hn::StoreU(hn::Zero(d), d, ot + static_cast<int64_t>(x) * ld + rv);
    }
    for (int t0 = ulo; t0 < uhi; t0 += T) {
      const int n = std::min(T, uhi - t0);
      int page_idx = t0 / p.page_size;
      int slot = t0 % p.page_size;
      for (int j = 0; j < n; ++j) {
        const int64_t page = pages[page_idx];
        krows[j] = reinterpret_cast<const uint32_t*>(
            kb + page * p.k.stride_page + slot * p.k.stride_slot + h * p.k.stride_head);
        vrows[j] = vb + page * p.v.stride_page + slot * p.v.stride_slot + h * p.v.stride_head;
        if (++slot == p.page_size) {
          slot = 0;
          ++page_idx;
        }
      }
      // Software prefetch of the next block's K/V rows (page gathers defeat the hardware
      // stream prefetchers); the GEMMs of this block hide their latency.
      for (int j = 0, t = t0 + T; j < T && t < uhi; ++j, ++t) {
        const int64_t page = pages[t / p.page_size];
        const int sl = t % p.page_size;
        const auto* kr = reinterpret_cast<const char*>(
            kb + page * p.k.stride_page + sl * p.k.stride_slot + h * p.k.stride_head);
        const auto* vr = reinterpret_cast<const char*>(
            vb + page * p.v.stride_page + sl * p.v.stride_slot + h * p.v.stride_head);
        for (int o = 0; o < dqk * 2; o += 64) hwy::Prefetch(kr + o);
        for (int o = 0; o < dv * 2; o += 64) hwy::Prefetch(vr + o);
      }
      detail::tile_scores_bf16(krows, n, qt, dq2, ld, nrv, qscale, st);
      if (p.mask == CpuMask::kCustom) {
        for (int rr = 0; rr < rph; ++rr) {
          const RowMask& rm = masks[rr / gs];
          for (int j = 0; j < n; ++j) {
            const int64_t bit = rm.bit_base + t0 + j;
            if (((rm.bits[bit >> 3] >> (bit & 7)) & 1) == 0) st[static_cast<int64_t>(j) * ld + rr] = neg_inf;
          }
        }
      }
      const bool full = p.mask != CpuMask::kCustom && t0 >= max_lo && t0 + n <= min_hi;
      TileSoftmax(st, n, t0, full, ld, rp, dv, lo, hi, cap, mrow, lrow, bf16_p ? pt : nullptr, ot);
      if (bf16_p) {
        PackValuePairs(vrows, n, dv, vpk);
        detail::tile_pv_bf16(pt, vpk, (n + 1) / 2, dv, ld, nrv, ot);
      } else {
        PackValuesF32(vrows, n, dv, reinterpret_cast<float*>(vpk));
        detail::tile_pv_f32(st, reinterpret_cast<const float*>(vpk), n, dv, ld, nrv, ot);
      }
    }
    for (int rr = 0; rr < rph; ++rr) {
      const float l = lrow[rr];
      const float lse = l > 0.f ? mrow[rr] + std::log(l) : neg_inf;
      const float f = l > 0.f ? p.v_scale / l : 0.f;
      for (int x = 0; x < dv; ++x) orow[x] = f * ot[static_cast<int64_t>(x) * ld + rr];
      FinishRow(p, sch, it, (h - it.kv_head_begin) * rph + rr, orow, lse);
    }
  }
}
