// Calls kvrope's public per-row device functions from a kernel of its own: RoPE applied to query
// rows in a BSHD tensor (as an attention kernel's prologue would), then undone with rope_backward
// (for a true rotation, cos^2 + sin^2 = 1, the backward is the inverse). Checked on the CPU.
// Exits 77 (skipped) when there is no GPU.
#include <kvrope/rope.cuh>

#include <cmath>
#include <cstdio>
#include <vector>

using T = __nv_bfloat16;
constexpr int kHeadDim = 128, kHalf = kHeadDim / 2, kVec = 8;  // 8 bf16 = one 16-byte access

// One thread per chunk pair: elements [c*8, c*8+8) and [h + c*8, h + c*8 + 8) of one query row.
__global__ void rotate_queries(T* q, T* restored, const T* cos, const T* sin, int rows, int heads) {
  const int pairs = kHalf / kVec;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * pairs) return;
  const int row = i / pairs, c = i % pairs, token = row / heads;
  const auto cs = kvrope::load_chunk<kVec>(cos + token * kHeadDim, kHalf, c * kVec);
  const auto sn = kvrope::load_chunk<kVec>(sin + token * kHeadDim, kHalf, c * kVec);
  const auto x = kvrope::load_chunk<kVec>(q + row * kHeadDim, kHalf, c * kVec);
  const auto y = kvrope::rope_forward(x, cs, sn);
  kvrope::store_chunk(q + row * kHeadDim, kHalf, c * kVec, y);
  kvrope::store_chunk(restored + row * kHeadDim, kHalf, c * kVec, kvrope::rope_backward(y, cs, sn));
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const int S = 16, H = 4, rows = S * H;  // [S, H, D] queries of one sequence
  std::vector<T> h_q(rows * kHeadDim), h_cos(S * kHeadDim), h_sin(S * kHeadDim);
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < kHeadDim; ++d) h_q[r * kHeadDim + d] = __float2bfloat16(std::sin(0.37f * r + 0.11f * d));
  for (int s = 0; s < S; ++s)
    for (int d = 0; d < kHeadDim; ++d) {
      const float angle = s * std::pow(10000.0f, -2.0f * (d % kHalf) / kHeadDim);
      h_cos[s * kHeadDim + d] = __float2bfloat16(std::cos(angle));
      h_sin[s * kHeadDim + d] = __float2bfloat16(std::sin(angle));
    }
  T *q, *restored, *cos, *sin;
  cudaMalloc(&q, h_q.size() * sizeof(T));
  cudaMalloc(&restored, h_q.size() * sizeof(T));
  cudaMalloc(&cos, h_cos.size() * sizeof(T));
  cudaMalloc(&sin, h_sin.size() * sizeof(T));
  cudaMemcpy(q, h_q.data(), h_q.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(cos, h_cos.data(), h_cos.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(sin, h_sin.data(), h_sin.size() * sizeof(T), cudaMemcpyHostToDevice);
  const int threads = rows * (kHalf / kVec);
  rotate_queries<<<(threads + 127) / 128, 128>>>(q, restored, cos, sin, rows, H);
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess || cudaGetLastError() != cudaSuccess) {
    std::printf("kernel failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<T> out(h_q.size()), back(h_q.size());
  cudaMemcpy(out.data(), q, out.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(back.data(), restored, back.size() * sizeof(T), cudaMemcpyDeviceToHost);

  // CPU: the rotated rows within one bf16 rounding, and the restored rows close to the input.
  double worst_rotated = 0, worst_restored = 0;
  for (int r = 0; r < rows; ++r) {
    const int s = r / H;
    for (int d = 0; d < kHeadDim; ++d) {
      const auto at = [&](const std::vector<T>& v, int row, int col) {
        return double(__bfloat162float(v[row * kHeadDim + col]));
      };
      const double x = at(h_q, r, d), partner = d < kHalf ? -at(h_q, r, d + kHalf) : at(h_q, r, d - kHalf);
      const double want = x * at(h_cos, s, d) + partner * at(h_sin, s, d);
      worst_rotated = std::fmax(worst_rotated, std::fabs(at(out, r, d) - want) / (std::fabs(want) + 1e-2));
      worst_restored = std::fmax(worst_restored, std::fabs(at(back, r, d) - x));
    }
  }
  std::printf(
      "rope_forward relative error %.2e (bf16 rounding 3.9e-03); forward then backward restores the "
      "input within %.2e\n",
      worst_rotated, worst_restored);
  cudaFree(q);
  cudaFree(restored);
  cudaFree(cos);
  cudaFree(sin);
  return worst_rotated <= 8e-3 && worst_restored <= 3e-2 ? 0 : 1;
}
