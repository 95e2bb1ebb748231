// Host tests of the bulk copy's chunk bookkeeping: the windows of cache rows, the chunks of a window,
// each block's range of them, and the division-free cursor the copy warp walks them with.
#include <kvrope/kvrope.cuh>

#include <cstdint>
#include <vector>

#include "support/catch.hpp"

using kvrope::detail::BulkCursor;
using kvrope::detail::BulkRange;
using kvrope::detail::BulkWindow;
using kvrope::detail::FusedArgs;

namespace {

FusedArgs<__nv_bfloat16> args(int64_t batch, int64_t heads, int64_t cache_len, int64_t head_dim, int64_t window_rows,
                              int chunk_rows) {
  FusedArgs<__nv_bfloat16> a{};
  a.bulk_chunk_rows = chunk_rows;
  a.batch = batch;
  a.heads = heads;
  a.cache_len = cache_len;
  a.head_dim = head_dim;
  a.window_rows = window_rows;
  return a;
}

// The chunk numbered c, decoded the plain way: cache-major, then batch, head, rows.
void check_chunk(const BulkWindow& w, int64_t c, const BulkCursor& got) {
  const int64_t slab = c / w.per_slab, k = c % w.per_slab;
  const int64_t bh = slab % (w.batch * w.heads);
  INFO("chunk " << c << " of " << w.total);
  CHECK(got.value == (slab >= w.batch * w.heads));
  CHECK(got.b == bh / w.heads);
  CHECK(got.j == bh % w.heads);
  CHECK(got.r0 == w.w0 + k * w.rows_per_chunk);
  CHECK(got.n >= 1);
  CHECK(got.n <= w.rows_per_chunk);
  CHECK(got.r0 + got.n <= w.w0 + w.wlen);
  // The chunks of one slab tile its rows: the last one ends at the window's end.
  if (k == w.per_slab - 1)
    CHECK(got.r0 + got.n == w.w0 + w.wlen);
  else
    CHECK(got.n == w.rows_per_chunk);
}

}  // namespace

TEST_CASE("the cursor walks every block's range exactly as the plain decoding numbers the chunks", "[host][bulk]") {
  struct Shape {
    int64_t batch, heads, cache_len, head_dim, window_rows;
    int chunk_rows;  // asked for (0: a full stage)
  };
  // D = 128 bf16: 128 rows a 32 KiB chunk; D = 48: 341 rows; windows cut long caches; small caches
  // get chunks of fewer rows.
  const Shape shapes[] = {{1, 8, 256, 128, 256, 0},     {32, 8, 2048, 128, 2048, 0}, {3, 5, 33, 48, 64, 0},
                          {2, 1, 1000, 128, 256, 0},    {1, 64, 129, 128, 160, 0},   {70, 1, 2, 64, 32, 0},
                          {4, 1, 70000, 128, 65536, 0}, {1, 8, 256, 128, 256, 16},   {2, 3, 1000, 128, 1024, 32},
                          {3, 5, 33, 48, 64, 8},        {1, 2, 100, 128, 128, 1000}};
  for (const Shape& sh : shapes) {
    const auto a = args(sh.batch, sh.heads, sh.cache_len, sh.head_dim, sh.window_rows, sh.chunk_rows);
    const int64_t stage_rows = kvrope::detail::kBulkStageBytes / (sh.head_dim * 2);
    const int64_t windows = (sh.cache_len + sh.window_rows - 1) / sh.window_rows;
    for (int64_t win = 0; win < windows; ++win) {
      const BulkWindow w = kvrope::detail::bulk_window(a, kvrope::detail::row_window(a, win));
      REQUIRE(w.rows_per_chunk == (sh.chunk_rows > 0 && sh.chunk_rows < stage_rows ? sh.chunk_rows : stage_rows));
      REQUIRE(w.total == 2 * sh.batch * sh.heads * w.per_slab);
      for (int64_t blocks : {1, 7, 132, 1000}) {
        std::vector<int> seen(static_cast<size_t>(w.total), 0);
        for (int64_t block = 0; block < blocks; ++block) {
          const BulkRange r = kvrope::detail::bulk_range(w, block, blocks);
          REQUIRE(r.begin <= r.end);
          if (r.begin == r.end) continue;
          BulkCursor cursor = BulkCursor::at(w, r.begin);
          for (int64_t c = r.begin; c < r.end; ++c, cursor.next(w)) {
            check_chunk(w, c, cursor);
            ++seen[static_cast<size_t>(c)];
          }
        }
        for (int64_t c = 0; c < w.total; ++c) {
          INFO("blocks " << blocks << ", chunk " << c);
          CHECK(seen[static_cast<size_t>(c)] == 1);  // every chunk in exactly one block's range
        }
      }
    }
  }
}
