// Host tests of how the token work is split: every (head, chunk pair) of a token is covered by
// exactly one lane of exactly one of its parts, with a chunk pair's heads in one warp, and the
// launch's choice of parts (token_parts_log2) stays within what the grid and the row can use; and the
// launch's cache of per-kernel queries.
#include <kvrope/kvrope.cuh>

#include <cstdint>
#include <tuple>
#include <vector>

#include "support/catch.hpp"

namespace {

// The lanes' walk of process_token (detail/fused/token_work.cuh), counting what each (head, pair) gets.
template <int kHeadDim, int kVec>
void check_cover(int64_t heads, int64_t head_dim, int parts) {
  const kvrope::detail::TokenLayout<kHeadDim, kVec> w(head_dim, heads, parts);
  INFO("H " << heads << ", D " << head_dim << ", vec " << kVec << ", parts " << parts << ": slots " << w.slots
            << ", pairs " << w.pairs);
  REQUIRE(w.slots >= 1);
  REQUIRE(w.slots <= 32);
  REQUIRE((w.slots & (w.slots - 1)) == 0);  // a power of two: a chunk pair's lanes never straddle warps
  REQUIRE((1 << w.slots_log2) == w.slots);  // the kernel shifts by it instead of dividing
  REQUIRE(w.pairs == head_dim / 2 / kVec);
  std::vector<int> seen(static_cast<size_t>(heads * w.pairs), 0);
  for (int part = 0; part < parts; ++part) {
    for (int lane = 0; lane < 32; ++lane) {
      const int slot = (part * 32 + lane) & (w.slots - 1);
      for (int c0 = (part * 32) >> w.slots_log2; c0 < w.pairs; c0 += w.per_step) {
        const int c = c0 + (lane >> w.slots_log2);
        if (c >= w.pairs) continue;
        for (int64_t j = slot; j < heads; j += w.slots) ++seen[static_cast<size_t>(j * w.pairs + c)];
      }
    }
  }
  for (int64_t j = 0; j < heads; ++j)
    for (int c = 0; c < w.pairs; ++c) {
      INFO("head " << j << ", pair " << c);
      CHECK(seen[static_cast<size_t>(j * w.pairs + c)] == 1);
    }
}

}  // namespace

TEST_CASE("every head row chunk of a token is covered once, whatever the parts", "[host][token]") {
  for (int parts : {1, 2, 4, 8}) {
    for (int64_t heads : {1, 2, 3, 5, 8, 16, 31, 32, 33, 64}) {
      check_cover<128, 4>(heads, 128, parts);  // bf16 / fp16 D = 128: 16 pairs of 4
      check_cover<64, 4>(heads, 64, parts);
      check_cover<256, 4>(heads, 256, parts);                                         // 32 pairs
      check_cover<80, 4>(heads, 80, parts);                                           // 10 pairs: not a power of two
      for (int64_t d : {2, 6, 48, 96, 130, 512}) check_cover<0, 1>(heads, d, parts);  // the scalar path
      for (int64_t d : {16, 48, 192}) check_cover<0, 4>(heads, d, parts);             // generic vectorized
    }
  }
}

TEST_CASE("a token gets as many warps as the grid allows, up to what its row can use", "[host][token]") {
  using kvrope::detail::token_parts_log2;
  // H = 8, D = 128, 4 elements an access: 16 pairs x 8 slots = 128 lanes, so at most 4 warps.
  CHECK(token_parts_log2(1, 1452, 8, 128, 4) == 2);
  CHECK(token_parts_log2(691, 1452, 8, 128, 4) == 1);   // leaderboard case 1: 1 382 items on 1 452 warps
  CHECK(token_parts_log2(4096, 1452, 8, 128, 4) == 0);  // more tokens than warps: one warp a token
  CHECK(token_parts_log2(1, 1452, 1, 128, 4) == 0);     // H = 1: 16 lanes already cover the row
  CHECK(token_parts_log2(1, 1452, 64, 256, 1) == 3);    // at most 8 warps
  for (int64_t tokens : {1, 2, 7, 100, 1000, 100000})
    for (int64_t warps : {1, 12, 352, 1452, 3168})
      for (int64_t heads : {1, 3, 8, 32})
        for (int vec : {1, 4}) {
          const int log2 = token_parts_log2(tokens, warps, heads, 128, vec);
          INFO("tokens " << tokens << ", warps " << warps << ", H " << heads << ", vec " << vec);
          CHECK(log2 >= 0);
          CHECK(log2 <= 3);
          if (log2 > 0) {
            CHECK(tokens << log2 <= warps);  // every item has a warp of its own
            int64_t slots = 1;
            while (slots < 32 && slots < heads) slots *= 2;
            CHECK((128 / 2 / vec) * slots >= (int64_t{32} << log2));  // no part without a chunk
          }
        }
}

TEST_CASE("the launch's per-kernel query cache asks once per key and keeps the 8 newest", "[host][launch]") {
  using kvrope::Status;
  int asked = 0;
  auto ask = [&](int key) {
    int value = -1;
    REQUIRE(kvrope::detail::cached_query(std::make_tuple(key), &value, [&](int* v) {
              ++asked;
              *v = 10 * key;
              return Status{};
            }).ok());
    return value;
  };
  for (int round = 0; round < 2; ++round)
    for (int key = 0; key < 8; ++key) CHECK(ask(key) == 10 * key);
  CHECK(asked == 8);  // the second round came from the cache
  CHECK(ask(8) == 80);
  CHECK(asked == 9);
  CHECK(ask(0) == 0);  // key 0, the oldest, was replaced by key 8
  CHECK(asked == 10);
  CHECK(ask(7) == 70);
  CHECK(asked == 10);
}
