// The device layout of fp4moe's expert weights ("fragment layout"), shared by the host repack
// (src/gpu/repack.cpp), the kernels, and the CPU tests that simulate the kernels' decode.
// Pure C++ plus FP4MOE_HD: host code includes it too.
//
// One matrix W [N rows, K] (NVFP4 or MXFP4) is cut into 16-row mma tiles, 4 tiles to a 64-row
// group, and K into chunks of 64. One (group, chunk) block is 2304 bytes, exactly the bytes of
// 64 x 64 NVFP4 values and their scales, so streaming it reads nothing twice:
//
//   [ tile 0: lane 0..31 x 16 B ][ tile 1 ][ tile 2 ][ tile 3 ]   weights, 4 x 512 B
//   [ tile 0: lane 0..31 x  2 B ][ tile 1 ][ tile 2 ][ tile 3 ]   scales,  4 x  64 B
//
// Blocks are stored group-major: block(group, chunk) at (group * n_chunks + chunk) * 2304, so a
// warp that owns a row group walks K through contiguous memory.
//
// NOTE (mma.sync.m16n8k16 bf16 fragments, PTX ISA "Matrix Fragments for mma.m16n8k16"): lane
// (g = lane/4, t = lane%4) holds A rows g and g+8 at mma-k {2t, 2t+1, 2t+8, 2t+9} and B column
// (token) g at the same mma-k. Any permutation of k applied to A and B alike leaves the product
// unchanged, so in k-step s (0..3) of a chunk we map mma-k to the real k so that lane t sees
//   real k = 16t + 4s + {0, 1} for mma-k {2t, 2t+1}   and   16t + 4s + {2, 3} for {2t+8, 2t+9}.
// Over the 4 steps a lane then holds real k = 16t .. 16t+15: one whole NVFP4 scale block per row
// (one scale per row per chunk, not one per step), and its B values for a token are 32
// contiguous bytes of the activation row.
//
// The 16 bytes of lane (g, t) are 4 words, one per k-step s. Word s holds the 8 E2M1 codes of
// the four bf16x2 A registers of that step:
//   a0 = row g   k 4s+{0, 1}     a1 = row g+8 k 4s+{0, 1}
//   a2 = row g   k 4s+{2, 3}     a3 = row g+8 k 4s+{2, 3}      (k relative to 16t; lo, hi half)
// Each code's four bits (sign, e1, e0, m) are stored where one shift brings them to their place
// in the register (bf16 bits 15 | 8 7 | 6, and 31 | 24 23 | 22 for the high half): a0 needs one
// AND, a1 a left shift and an AND, a2 and a3 two shifts each (sign and magnitude bits come from
// different ones) and two LOP3s: 11 integer instructions per 8 values with shifts and masks, as few
// as any placement allows (a search over all placements, with shifts and rotations), and 4 of
// them are left shifts, which the compiler can issue as IMAD.SHL on the FMA pipe: 7 on the
// integer ALU pipe instead of the 11 (rotations) of fp4moe 0.2.0. Both pipes take a warp
// instruction every second cycle, and the decode kept the ALU pipe busiest (kSignShift /
// kMagShift). a2's two left shifts are one multiply (kA2Multiplier, below): 10 in all. The scale pair of
// lane (g, t) is the byte of row g then the byte of row g+8, for NVFP4 block 4*chunk + t (MXFP4:
// the 32-block holding it).
//
// Decoding. An E2M1 code s|e1 e0|m placed at bf16 bits 15 | 8 7 | 6 reads as the bf16 number
// e2m1 * 2^-126 (exponent field e, mantissa top bit m; e = 0 gives the subnormal m * 2^-127).
// The scale byte is stored re-encoded so that scale_bits = byte * 16 + 0x7680 is a bf16 number
// 2^(F - 127) * (1 + m/8) with exponent field F = 237 + (byte >> 3), F <= 254. The bf16 product
// e2m1 * 2^-126 * scale_factor is exact (at most 2 x 4 significant bits, normal range), and the
// GEMM's fp32 epilogue multiplies the accumulator by a per-matrix `post_scale` that undoes the
// offsets: NVFP4 byte = ((E + 9) << 3) | m for a scale 2^E (1 + m/8), E in [-9, 8] (every E4M3
// value), so F = E + 246 and post_scale = 2^7 * weight_scale_2. MXFP4 scales 2^(s-127) are
// mapped with the matrix's largest exponent s_max to F = 254 (byte = (s - s_max + 17) << 3) and
// post_scale = 2^(s_max - 128); blocks more than 2^17 below the largest are flushed to zero.
// A zero NVFP4 scale is stored with zeroed codes; a negative one with every code's sign flipped.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_HD inline
#endif

namespace fp4moe::kernels {

struct WeightLayout {
  static constexpr int kTileRows = 16;
  static constexpr int kTilesPerGroup = 4;
  static constexpr int kGroupRows = kTileRows * kTilesPerGroup;  // 64
  static constexpr int kChunkK = 64;
  static constexpr int kLaneWeightBytes = 16;
  static constexpr int kLaneScaleBytes = 2;
  static constexpr int kTileWeightBytes = 32 * kLaneWeightBytes;                            // 512
  static constexpr int kTileScaleBytes = 32 * kLaneScaleBytes;                              // 64
  static constexpr int kBlockWeightBytes = kTilesPerGroup * kTileWeightBytes;               // 2048
  static constexpr int kBlockBytes = kBlockWeightBytes + kTilesPerGroup * kTileScaleBytes;  // 2304
  static constexpr std::uint32_t kScaleBitsBias = 0x7680;  // exponent field 237 at byte 0

  static constexpr std::int64_t groups(std::int64_t rows) { return (rows + kGroupRows - 1) / kGroupRows; }
  static constexpr std::int64_t chunks(std::int64_t k) { return (k + kChunkK - 1) / kChunkK; }
  static constexpr std::int64_t matrix_bytes(std::int64_t rows, std::int64_t k) {
    return groups(rows) * chunks(k) * kBlockBytes;
  }
  static constexpr std::int64_t block_offset(std::int64_t group, std::int64_t chunk, std::int64_t n_chunks) {
    return (group * n_chunks + chunk) * kBlockBytes;
  }
};

static_assert(WeightLayout::kBlockBytes == 64 * 64 / 2 + 64 * 4);

// Shifts (left if positive, right if negative) that bring register i's sign bits and magnitude
// bits into place.
inline constexpr int kSignShift[4] = {0, 3, 1, 2};
inline constexpr int kMagShift[4] = {0, 3, 6, -3};
inline constexpr std::uint32_t kSignBits = 0x80008000u;  // bf16 sign of both halves
inline constexpr std::uint32_t kMagBits = 0x01c001c0u;   // e1 e0 m: bf16 bits 8:6 of both halves

// The A register (0..3) and half (0 = lo) that hold the code of tile row half h (0: row g,
// 1: row g+8) at k offset o (0..3) within a k-step.
FP4MOE_HD constexpr int code_register(int h, int o) {
  return (o / 2) * 2 + h;
}
FP4MOE_HD constexpr int code_half(int o) {
  return o & 1;
}

// Where bit b (0: m, 1: e0, 2: e1, 3: sign) of that code is stored in the step's word.
FP4MOE_HD constexpr int code_bit_position(int h, int o, int b) {
  const int reg = code_register(h, o);
  const int base = 16 * code_half(o);
  const int target = b == 3 ? 15 : 6 + b;  // bit in the register's half
  const int shift = b == 3 ? kSignShift[reg] : kMagShift[reg];
  return base + target - shift;
}

// a2's sign and magnitude bits come by different left shifts (1 and 6). Masking both sets of source
// bits first and multiplying by 2^1 + 2^6 shifts them at once: the two shifted copies share no
// bit, so the product is their OR (no carries), and one AND drops each copy's bits that are not
// its own. 3 operations (AND, multiply, AND) where the two shifts, an AND and a LOP3 were 4. (a3's
// magnitude goes right, which no multiply does: it keeps its 4.)
inline constexpr std::uint32_t kA2Sources = (kSignBits >> kSignShift[2]) | (kMagBits >> kMagShift[2]);
inline constexpr std::uint32_t kA2Multiplier = (1u << kSignShift[2]) + (1u << kMagShift[2]);
static_assert(kSignShift[2] > 0 && kMagShift[2] > 0 && kSignShift[2] != kMagShift[2], "two left shifts");
static_assert(((kA2Sources << kSignShift[2]) & (kA2Sources << kMagShift[2])) == 0,
              "the shifted copies share no bit: the multiply carries nothing");
static_assert(((kA2Sources << kSignShift[2]) & (kSignBits | kMagBits)) == kSignBits &&
                  ((kA2Sources << kMagShift[2]) & (kSignBits | kMagBits)) == kMagBits,
              "each copy lands only its own bits in the register's sign and magnitude places");

// Word s (8 codes) -> the four bf16x2 A registers of k-step s, each element e2m1 * 2^-126.
FP4MOE_HD void decode_e2m1x8(std::uint32_t w, std::uint32_t (&a)[4]) {
  a[0] = w & (kSignBits | kMagBits);
  a[1] = (w << 3) & (kSignBits | kMagBits);
  a[2] = ((w & kA2Sources) * kA2Multiplier) & (kSignBits | kMagBits);
  a[3] = ((w << 2) & kSignBits) | ((w >> 3) & kMagBits);
}

static_assert(kSignShift[0] == kMagShift[0] && kSignShift[1] == kMagShift[1], "a0, a1 use one shift each");

// Where real k sits in mma-k order (the order the tensor cores pair A and B in): within each
// 64-chunk, k = 16t + 4s + o goes to k-step s at mma-k 2t + o (o < 2) or 2t + 8 + (o - 2).
// Activations laid out this way (the wgmma kernel's B operand in shared memory) meet the
// permuted weight fragments at the right k.
FP4MOE_HD constexpr int permuted_k(int k) {
  const int r = k % 64;
  const int t = r / 16;
  const int s = (r % 16) / 4;
  const int o = r % 4;
  return k - r + 16 * s + (o < 2 ? 2 * t + o : 2 * t + 8 + (o - 2));
}

// Scale byte -> bf16 bits of the scale factor (see the header comment).
FP4MOE_HD constexpr std::uint32_t scale_bits(std::uint32_t byte) {
  return byte * 16u + WeightLayout::kScaleBitsBias;
}

// A scale byte b placed in both 16-bit halves (b | b << 16) -> the bf16x2 (factor, factor).
FP4MOE_HD constexpr std::uint32_t scale_pair_from_bytes(std::uint32_t replicated) {
  return replicated * 16u + (WeightLayout::kScaleBitsBias | (WeightLayout::kScaleBitsBias << 16));
}

}  // namespace fp4moe::kernels
