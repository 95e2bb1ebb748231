// Host tests of unit_place (detail/forward/args.cuh): where a lane's unit of a head row lies, in every
// rotary style and partial rotary, for the vector (N = 8) and scalar (N = 1) widths. The units must
// partition the row, pair the elements as docs/spec.md §2.4 says, and name the table-cache columns
// of §2.3.
#include <kvrope/detail/common/rotary_units.cuh>

#include <vector>

#include "support/catch.hpp"

using kvrope::RotaryStyle;

namespace {

template <int N>
void check_row(RotaryStyle style, int64_t R, int64_t D) {
  INFO("style " << static_cast<int>(style) << " R " << R << " D " << D << " N " << N);
  const int units = static_cast<int>(D / (2 * N)), rotary_units = static_cast<int>(R / (2 * N));
  std::vector<int> covered(static_cast<size_t>(D), 0);
  for (int u = 0; u < units; ++u) {
    const kvrope::detail::UnitPlace p = kvrope::detail::unit_place<N>(style, R, D, rotary_units, u);
    CHECK(p.rotated == (u < rotary_units));
    for (int i = 0; i < N; ++i) {
      ++covered[static_cast<size_t>(p.lo + i)];
      ++covered[static_cast<size_t>(p.hi + i)];
    }
    if (!p.rotated) {
      CHECK(p.lo >= R);  // the pass-through part
      continue;
    }
    CHECK(p.hi < R);
    for (int i = 0; i < N; ++i) {
      // Element i of the lo chunk and its partner: across the chunks, or inside the lo chunk.
      const int64_t a = p.lo + i;
      const int64_t partner = kvrope::rotary_partner(style, R, a);
      if (p.cross) {
        CHECK(partner == p.hi + i);
        CHECK(kvrope::rotary_pair_index(style, R, a) == p.pair_lo + i);
      } else {
        CHECK(partner == (i % 2 == 0 ? a + 1 : a - 1));
        CHECK(kvrope::rotary_pair_index(style, R, a) == p.pair_lo + i / 2);
        CHECK(kvrope::rotary_pair_index(style, R, p.hi + i) == p.pair_hi + i / 2);
      }
    }
    if (u + 1 < rotary_units) {  // consecutive units, consecutive chunks: a warp's access is contiguous
      const kvrope::detail::UnitPlace next = kvrope::detail::unit_place<N>(style, R, D, rotary_units, u + 1);
      if (!(style == RotaryStyle::kInterleaved && N == 1)) CHECK(next.lo == p.lo + N);
    }
  }
  for (int64_t e = 0; e < D; ++e) {
    INFO("element " << e);
    CHECK(covered[static_cast<size_t>(e)] == 1);  // every element in exactly one unit
  }
}

}  // namespace

TEST_CASE("units partition a head row and pair its elements as the style says", "[host][forward]") {
  for (const RotaryStyle style : {RotaryStyle::kRotateHalf, RotaryStyle::kInterleaved}) {
    for (const int64_t D : {16, 64, 128, 256}) {
      for (const int64_t R : {D, D / 2, int64_t{16}}) {
        if (R > D || R % 16 != 0 || (D - R) % 16 != 0) continue;
        check_row<8>(style, R, D);
      }
    }
    for (const int64_t D : {2, 6, 30, 80}) {
      for (const int64_t R : {D, int64_t{2}, D / 2 - (D / 2) % 2}) {
        if (R == 0 || R > D) continue;
        check_row<1>(style, R, D);
      }
    }
  }
}
