// GPU tests of how the launchers behave: CUDA graph capture and replay on new inputs, concurrent
// streams, the vector and scalar paths, a cache of more than 2^31 elements, a grid that a 2-D/3-D
// launch would overflow, the paths the launch policy chooses between (through the experimental policy
// override), and the decode kernel (S = 1).
#include <algorithm>
#include <vector>

#include "support/gpu_problem.cuh"

using namespace kvrope;
using namespace kvrope::testing;

TEST_CASE("a call captured in a CUDA graph replays correctly on new inputs", "[gpu][graph]") {
  for (Variant variant : {Variant::kOutOfPlace, Variant::kInPlace}) {
    Problem<__nv_bfloat16, int64_t> p(
        Config{{2, 8, 37, 300, 128}, Layout::kBHSD, Positions::kPermutation, variant, false, 21});
    cudaStream_t stream;
    KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KVROPE_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status captured = p.launch(stream);  // allocates nothing, syncs nothing: capturable
    KVROPE_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    REQUIRE(captured.ok());
    KVROPE_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    for (uint64_t round = 0; round < 3; ++round) {
      // New inputs in the same buffers, then a replay.
      uint64_t seed = 777 + 10 * round;
      for (DeviceBuffer<__nv_bfloat16>* b : {&p.gk, &p.gv, &p.key, &p.cos, &p.sin}) fill_random(*b, ++seed);
      p.launch_and_check([&] { KVROPE_CUDA_REQUIRE(cudaGraphLaunch(exec, stream)); });
    }
    KVROPE_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
    KVROPE_CUDA_REQUIRE(cudaGraphDestroy(graph));
    KVROPE_CUDA_REQUIRE(cudaStreamDestroy(stream));
  }
}

TEST_CASE("calls on several streams run concurrently and each is right", "[gpu][streams]") {
  constexpr int kStreams = 4;
  std::vector<Problem<__half, int32_t>> problems;
  for (int i = 0; i < kStreams; ++i)
    problems.emplace_back(Config{{3, 4, 50 + i, 400, 64 + 32 * (i % 2)},
                                 i % 2 ? Layout::kBSHD : Layout::kBHSD,
                                 Positions::kPermutation,
                                 i % 2 ? Variant::kInPlace : Variant::kOutOfPlace,
                                 false,
                                 uint64_t(31 + i)});
  std::vector<cudaStream_t> streams(kStreams);
  for (auto& s : streams) KVROPE_CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Snapshot every input first, then launch all, then check all.
  std::vector<std::vector<__half>> gk(kStreams), gv(kStreams), key(kStreams), cos(kStreams), sin(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    problems[i].poison_outputs();
    gk[i] = problems[i].gk.to_host(), gv[i] = problems[i].gv.to_host(), key[i] = problems[i].key.to_host();
    cos[i] = problems[i].cos.to_host(), sin[i] = problems[i].sin.to_host();
  }
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (int i = 0; i < kStreams; ++i) REQUIRE(problems[i].launch(streams[i]).ok());
  KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (int i = 0; i < kStreams; ++i) problems[i].check(gk[i], gv[i], key[i], cos[i], sin[i]);
  for (auto& s : streams) KVROPE_CUDA_REQUIRE(cudaStreamDestroy(s));
}

TEST_CASE("misaligned pointers and odd strides take the scalar path and stay right", "[gpu][alignment]") {
  struct Case {
    int64_t offset, pad_row;
    BackwardPath expected;
  };
  for (const Case c : {Case{0, 0, BackwardPath::kCompiledHeadDim}, Case{0, 8, BackwardPath::kCompiledHeadDim},
                       Case{1, 0, BackwardPath::kGenericScalar}, Case{0, 1, BackwardPath::kGenericScalar},
                       Case{1, 3, BackwardPath::kGenericScalar}}) {
    for (Variant variant : {Variant::kOutOfPlace, Variant::kInPlace}) {
      Config cfg{{2, 4, 19, 64, 128}, Layout::kBSHD, Positions::kNegative, variant, true, 41};
      cfg.offset = c.offset;
      cfg.pad_row = c.pad_row;
      Problem<__nv_bfloat16, int64_t> p(cfg);
      BackwardPlan plan;
      REQUIRE(p.plan(&plan).ok());
      INFO(cfg.describe());
      CHECK(plan.path == c.expected);
      p.run_and_check();
    }
  }
}

TEST_CASE("a cache of more than 2^31 elements", "[gpu][large]") {
  // 4 x 1 x (2^29 / 128 + 256) rows x 128 = 2^31 + 131072 elements per cache (4.3 GB in bf16).
  const int64_t rows = (int64_t{1} << 29) / 128 + 256;
  for (Variant variant : {Variant::kOutOfPlace, Variant::kInPlace}) {
    Problem<__nv_bfloat16, int64_t> p(
        Config{{4, 1, 16, rows, 128}, Layout::kBHSD, Positions::kPermutation, variant, false, 51});
    REQUIRE(p.gk.size() > (size_t{1} << 31));
    p.run_and_check();
  }
}

TEST_CASE("more batches x heads than a grid's y or z dimension could hold", "[gpu][large]") {
  Problem<float, int32_t> p(
      Config{{70000, 1, 1, 2, 64}, Layout::kBHSD, Positions::kNegative, Variant::kOutOfPlace, false, 61});
  p.run_and_check();
}

TEST_CASE("every bulk-copy choice stays right: speculated chunks, chunk sizes, token zeros, the register copy",
          "[gpu][policy]") {
  // Small caches (chunks cut down, speculated, zero rows by the token warps) and one over the
  // speculation limit; positions that repeat rows, leave gaps and wrap.
  const Config configs[] = {
      {{1, 8, 1, 256, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 71},
      {{2, 8, 45, 512, 128}, Layout::kBHSD, Positions::kDuplicates, Variant::kOutOfPlace, false, 72},
      {{3, 4, 33, 700, 64}, Layout::kBSHD, Positions::kNegative, Variant::kOutOfPlace, true, 73},
      {{2, 8, 300, 4096, 128}, Layout::kBHSD, Positions::kSparse, Variant::kOutOfPlaceNoTables, false, 74},
  };
  for (const Config& cfg : configs) {
    Problem<__nv_bfloat16, int64_t> p(cfg);
    for (const int spec : {0, 1, 6})
      for (const int min_chunks : {0, 8})
        for (const bool bulk : {true, false}) {
          if (!bulk && (spec != 0 || min_chunks != 0)) continue;  // those values are the bulk copy's
          LaunchPolicy policy = device_policy();
          policy.bulk_speculate_chunks = spec;
          policy.bulk_min_chunks_per_block = min_chunks;
          policy.bulk_copy = bulk;
          policy.decode_copy_max_mib = 0;  // the S = 1 shape through the fused kernel
          LaunchConfig launch;
          REQUIRE(p.plan(&launch, &policy).ok());
          INFO("spec " << spec << " min_chunks " << min_chunks << " bulk " << bulk << " token zeros "
                       << launch.token_zeros << " chunk rows " << launch.bulk_chunk_rows);
          CHECK(launch.plan.kernel == BackwardKernel::kFused);
          CHECK(launch.plan.bulk_copy == bulk);
          if (launch.token_zeros) CHECK(launch.bulk_speculated_chunks > 0);
          p.run_and_check(&policy);
        }
  }
}

TEST_CASE("blocks sharing a large cache's copy through the workspace stay right, call after call", "[gpu][policy]") {
  // Chunks of 4 KiB make these caches large enough to share (more than 8 chunks per block); rows in
  // cache_position that repeat, wrap or leave gaps land in shared chunks; BSHD copies row by row.
  const Config configs[] = {
      {{2, 8, 45, 2048, 128}, Layout::kBHSD, Positions::kDuplicates, Variant::kOutOfPlace, false, 81},
      {{2, 4, 33, 4000, 64}, Layout::kBSHD, Positions::kNegative, Variant::kOutOfPlace, true, 82},
      {{2, 8, 300, 8192, 128}, Layout::kBHSD, Positions::kSparse, Variant::kOutOfPlaceNoTables, false, 83},
  };
  for (const Config& cfg : configs) {
    Problem<__nv_bfloat16, int64_t> p(cfg);
    for (const bool workspace : {true, false})
      for (const int chunk_bytes : {4096, 32768})
        for (const bool share : {true, false})
          for (const int spec : {6, 0}) {  // the first chunks speculated, or not
            if ((!workspace && !share) || (spec == 0 && !(workspace && share && chunk_bytes == 4096))) continue;
            p.use_workspace = workspace;
            LaunchPolicy policy = device_policy();
            policy.bulk_chunk_bytes = chunk_bytes;
            if (!share) policy.bulk_share_min_chunks_per_block = 1 << 30;
            policy.bulk_speculate_chunks = spec;
            LaunchConfig launch;
            REQUIRE(p.plan(&launch, &policy).ok());
            INFO("workspace " << workspace << " chunk bytes " << chunk_bytes << " share " << share << " spec " << spec
                              << " shared chunks " << launch.bulk_shared_chunks << " speculated "
                              << launch.bulk_speculated_chunks);
            const Shape& sh = cfg.shape;  // shared only above bulk_share_min_chunks_per_block chunks a block
            const int64_t rows = std::max(launch.bulk_chunk_rows, 1);
            const bool large = 2 * sh.batch * sh.heads * ((sh.cache_len + rows - 1) / rows) >
                               int64_t{policy.bulk_share_min_chunks_per_block} * launch.plan.grid;
            if (chunk_bytes == 4096 && share) CHECK(large);
            CHECK((launch.bulk_shared_chunks > 0) == (workspace && share && large && launch.plan.bulk_copy));
            for (int call = 0; call < 2; ++call)  // the second call starts from the workspace the first left
              p.run_and_check(&policy);
          }
  }
}

TEST_CASE("in place: items spread over the blocks and rows prefetched ahead stay right, with and without the bitmask",
          "[gpu][policy]") {
  // More items than the largest grid has warps (1 584 on an H200), so that warps have several and the
  // next item's rows are prefetched, in each of: one position a batch (no bitmask; a head dim with no
  // decode instance), rows that repeat (the row groups), BSHD rows, no table gradients (no key rows
  // prefetched) with broadcast tables, more heads than a warp has lanes, and positions out of range.
  // A small one as well: a block an item.
  const Config configs[] = {
      {{4096, 4, 1, 4, 96}, Layout::kBHSD, Positions::kArange, Variant::kInPlace, false, 91},
      {{4, 8, 1500, 2048, 128}, Layout::kBHSD, Positions::kDuplicates, Variant::kInPlace, false, 92},
      {{8, 8, 900, 2048, 128}, Layout::kBSHD, Positions::kPermutation, Variant::kInPlace, false, 93},
      {{8, 4, 1000, 1200, 64}, Layout::kBHSD, Positions::kNegative, Variant::kInPlaceNoTables, true, 94},
      {{8, 40, 300, 400, 64}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 95},
      {{2, 8, 45, 512, 128}, Layout::kBHSD, Positions::kSparse, Variant::kInPlace, false, 96},
  };
  for (const Config& cfg : configs) {
    Problem<__nv_bfloat16, int64_t> p(cfg);
    LaunchConfig launch;
    REQUIRE(p.plan(&launch, nullptr).ok());
    INFO(cfg.describe() << " grid " << launch.plan.grid << " parts " << launch.token_parts);
    CHECK(launch.plan.kernel == BackwardKernel::kFused);
    CHECK(launch.token_prefetch);  // aligned rows, sm_90 code (the GPU tests run on sm_90+)
    const Shape& sh = cfg.shape;
    const int64_t items = sh.batch * sh.seq_len * launch.token_parts;
    if (cfg.seed != 96) CHECK(items > int64_t{launch.plan.grid} * launch.plan.block / 32);
    if (cfg.seed == 96) CHECK(launch.plan.grid >= sh.batch * sh.seq_len);  // a block an item, up to one wave
    p.run_and_check();
  }
}

TEST_CASE("the fused kernel's warps a token: in place split while at most four warps a SM", "[gpu][policy]") {
  // In place (H = 8, D = 128, bf16: at most 4 warps a token by the row): S = SMs tokens get 4 warps,
  // 2 x SMs get 2, and 300 get 1 where that is more than 2 x SMs (an H200 has 132). Out of place, 300
  // tokens get 4 where the grid has 1 200 token warps or more (an H200: 132 x 11).
  int sms = 0;
  KVROPE_CUDA_REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Expect {
    int64_t seq_len;
    Variant variant;
    int parts;  // 0: no expectation here
  };
  const Expect cases[] = {{sms, Variant::kInPlace, 4},
                          {2 * sms, Variant::kInPlace, 2},
                          {300, Variant::kInPlace, 2 * 300 > 4 * sms ? 1 : 0},
                          {300, Variant::kOutOfPlace, 4}};
  for (const Expect& e : cases) {
    const Config cfg{{1, 8, e.seq_len, 1024, 128}, Layout::kBHSD, Positions::kPermutation, e.variant, false, 97};
    Problem<__nv_bfloat16, int64_t> p(cfg);
    LaunchConfig launch;
    REQUIRE(p.plan(&launch, nullptr).ok());
    INFO(cfg.describe() << " parts " << launch.token_parts << " grid " << launch.plan.grid << " token warps "
                        << launch.token_warps << " SMs " << sms);
    if (e.parts > 0 && (p.in_place() || int64_t{launch.plan.grid} * launch.token_warps >= 4 * e.seq_len))
      CHECK(launch.token_parts == e.parts);
    p.run_and_check();
  }
}

TEST_CASE("the in-place prefetch applies only where it was measured", "[gpu][policy]") {
  // Not out of place, not on the scalar path (rows not 16-byte aligned).
  Problem<__nv_bfloat16, int64_t> oop(
      Config{{2, 8, 45, 512, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 97});
  Config misaligned{{2, 8, 45, 512, 128}, Layout::kBHSD, Positions::kArange, Variant::kInPlace, false, 98};
  misaligned.offset = 1;
  Problem<__nv_bfloat16, int64_t> scalar(misaligned);
  LaunchConfig launch;
  REQUIRE(oop.plan(&launch, nullptr).ok());
  CHECK_FALSE(launch.token_prefetch);
  oop.run_and_check();
  REQUIRE(scalar.plan(&launch, nullptr).ok());
  CHECK(launch.plan.path == BackwardPath::kGenericScalar);
  CHECK_FALSE(launch.token_prefetch);
  scalar.run_and_check();
}

TEMPLATE_TEST_CASE(
    "one position a batch (S = 1): the decode kernel stays right, and where it does not apply the "
    "fused one",
    "[gpu][decode]", __nv_bfloat16, __half, float) {
  // Both variants, with and without table gradients; head dims with a compiled decode instance
  // (64, 128, 256) and generic ones (16, 32); BSHD and padded rows; a position that wraps, one out
  // of range; more heads than a token's warps cover in one batch of passes (H = 40); more tokens
  // than the out-of-place grid has blocks (B = 300); int32 positions; one, two and four warps a
  // token as the heads and head dim choose. Out of place each also through the fused kernel.
  const Config configs[] = {
      {{5, 8, 1, 300, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 101},
      {{3, 12, 1, 77, 64}, Layout::kBSHD, Positions::kNegative, Variant::kInPlace, true, 102},
      {{4, 3, 1, 50, 256}, Layout::kBHSD, Positions::kOutOfRange, Variant::kOutOfPlaceNoTables, false, 103},
      {{2, 40, 1, 33, 32}, Layout::kBHSD, Positions::kPermutation, Variant::kInPlaceNoTables, false, 104},
      {{300, 2, 1, 9, 16}, Layout::kBSHD, Positions::kArange, Variant::kOutOfPlace, true, 105},
      {{2, 8, 1, 40, 128}, Layout::kBHSD, Positions::kOutOfRange, Variant::kInPlace, false, 106},
      {{1, 1, 1, 1, 64}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 107},
      {{2, 1, 1, 40, 128}, Layout::kBHSD, Positions::kArange, Variant::kInPlace, false, 111},
  };
  for (Config cfg : configs) {
    for (const bool padded : {false, true}) {
      cfg.pad_row = padded ? 8 : 0;  // 16 bytes or more: rows stay 16-byte aligned
      cfg.pad_head = padded ? 16 : 0;
      for (const bool decode : {true, false}) {
        if (!decode && (cfg.variant == Variant::kInPlace || cfg.variant == Variant::kInPlaceNoTables)) continue;
        Problem<TestType, int64_t> p(cfg);
        Problem<TestType, int32_t> p32(cfg);
        LaunchPolicy policy = device_policy();
        if (!decode) policy.decode_copy_max_mib = 0;
        LaunchConfig launch;
        REQUIRE(p.plan(&launch, &policy).ok());
        INFO(cfg.describe() << " decode " << decode << " warps a token " << launch.token_parts << " grid "
                            << launch.plan.grid << " block " << launch.plan.block);
        CHECK((launch.plan.kernel == BackwardKernel::kDecode) == decode);
        // Chosen for H = 8, D = 128 in 16-bit types: 2 in place, 4 out of place.
        if (decode && cfg.shape.heads == 8 && cfg.shape.head_dim == 128 && sizeof(TestType) == 2)
          CHECK(launch.token_parts == (p.in_place() ? 2 : 4));
        p.run_and_check(&policy);
        p32.run_and_check(&policy);
      }
    }
  }
  // Where it does not apply: a cache over the limit (out of place), a misaligned row, S = 2.
  Config large{{2, 8, 1, 4096, 128}, Layout::kBHSD, Positions::kArange, Variant::kOutOfPlace, false, 108};
  Config misaligned{{2, 8, 1, 64, 128}, Layout::kBHSD, Positions::kArange, Variant::kInPlace, false, 109};
  misaligned.offset = 1;
  Config two{{2, 8, 2, 64, 128}, Layout::kBHSD, Positions::kArange, Variant::kInPlace, false, 110};
  LaunchPolicy policy = device_policy();
  policy.decode_copy_max_mib = 1;  // the large cache: 2 x 2 x 8 x 4096 x 128 elements, 16 MiB in bf16
  for (const Config& cfg : {large, misaligned, two}) {
    Problem<TestType, int64_t> p(cfg);
    LaunchConfig launch;
    REQUIRE(p.plan(&launch, &policy).ok());
    INFO(cfg.describe());
    CHECK(launch.plan.kernel == BackwardKernel::kFused);
    p.run_and_check(&policy);
  }
}
