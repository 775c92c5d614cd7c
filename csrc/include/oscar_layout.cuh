// The "frag" code order of one 32-token block (quant/packed.py: frag_token, frag_channel, frag_slots): the
// device side of the same map, used by the pack kernel to write it and by the decode kernel to read it.
#pragma once

namespace oscar {

// Token (0..31) held by row `row` (0..15) of 16-token tile `tile`.
__host__ __device__ constexpr int frag_token(int tile, int row) {
  return 8 * ((row & 7) >> 1) + 4 * tile + 2 * (row >> 3) + (row & 1);
}

// Channel of k-index `k` (0..15) of key k-step `ks`.
__host__ __device__ constexpr int frag_channel(int ks, int k) {
  return 8 * (4 * (ks >> 1) + ((k & 7) >> 1)) + 4 * (ks & 1) + 2 * (k >> 3) + (k & 1);
}

// Natural (token, channel) of 2-bit field i of word W of a block (2 D words), keys or values.
template <int D>
__device__ __forceinline__ void frag_slot(bool keys, int word, int i, int& t, int& ch) {
  constexpr int kPerLane = D / 16;
  const int lane = (word >> 2) & 31, w = 4 * (word >> 7) + (word & 3);
  const int g = lane >> 2, c = lane & 3, h = i >> 3, f = 8 * w + (i & 7);
  const int q = f / kPerLane, r = q & 3, tile = q >> 2, x = f % kPerLane;
  if (keys) {
    t = frag_token(tile, g + 8 * (r & 1));
    ch = frag_channel(x, 2 * c + 8 * (r >> 1) + h);
  } else {
    t = frag_token(tile, 2 * c + 8 * (r >> 1) + h);
    ch = 16 * x + g + 8 * (r & 1);
  }
}

}  // namespace oscar
