// Device helpers shared by fp4moe's kernels: async copies, tensor-core MMA, bf16 arithmetic,
// programmatic dependent launch. CUDA headers and the project's own headers only (see
// DEVICE.md: host libraries stay out of .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4moe::kernels {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (weights are read once).
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16-byte copy that writes zeros instead when `valid` is false (src is then not read).
__device__ __forceinline__ void cp_async16_zfill(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // src-size 0: nothing is read, 16 zero bytes are written
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// L2 eviction policies (createpolicy, sm_80+) for the cache_hint forms of the copies: evict-first
// for data read once per forward (expert weights at decode sizes), so that its lines leave L2
// before the lines other loads still want (activations, lines prefetched for a later read). A
// run-time choice between the two costs one select. (An explicit evict-normal policy is not what a
// copy without a hint gets: on the H200 it measured slower, docs/KERNELS.md.)
__device__ __forceinline__ std::uint64_t l2_policy(bool evict_first) {
  std::uint64_t first, normal;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(first));
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(normal));
  return evict_first ? first : normal;
}
// cp_async16 with an L2 eviction policy (l2_policy).
__device__ __forceinline__ void cp_async16_hint(std::uint32_t dst, const void* src, std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "l"(policy)
               : "memory");
}

// NOTE: rows of 128 bytes (64 bf16) with 16-byte piece c of row r stored at piece c ^ (r % 8):
// the 128-byte swizzle of wgmma's K-major layouts (PTX ISA, "Shared Memory Matrix Layout"), and
// for LDS.128 it puts the 8 lanes of a phase (rows g, pieces 2t + h) on 8 distinct bank groups.
__device__ __forceinline__ int swizzle128_offset(int row, int piece) {
  return row * 128 + ((piece ^ (row & 7)) << 4);
}

// v through a move ptxas cannot see through, so that it keeps the value in a register rather than
// recomputing it where it is used.
__device__ __forceinline__ std::uint32_t opaque_u32(std::uint32_t v) {
  std::uint32_t r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async.wait_group takes an immediate: dispatch a run-time count (uniform across the warp)
// in [Lo, Hi] by binary search, four compares for 0..15. (A switch became a jump table: more
// instructions per wait and a few more registers.) Counts outside the range wait for Lo or Hi.
template <int Lo = 0, int Hi = 15>
__device__ __forceinline__ void cp_async_wait_dynamic(int n) {
  if constexpr (Lo == Hi) {
    cp_async_wait<Lo>();
  } else {
    constexpr int kMid = (Lo + Hi + 1) / 2;
    if (n < kMid) {
      cp_async_wait_dynamic<Lo, kMid - 1>(n);
    } else {
      cp_async_wait_dynamic<kMid, Hi>(n);
    }
  }
}

__device__ __forceinline__ uint4 lds128(std::uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ std::uint32_t lds16(std::uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}

// NOTE: d = a * b on bf16x2, rounded to nearest even. fma.rn.bf16x2 (sm_80+) with c = -0.0
// keeps +0 products +0 (+0 + -0 = +0) and has no flush-to-zero form for bf16, so the subnormal
// E2M1 operand (code 1 is 2^-127 before scaling) is honoured (PTX ISA, "Half Precision
// Floating-Point Instructions: fma").
__device__ __forceinline__ std::uint32_t bf16x2_mul(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// D[16x8] += A[16x16] * B[16x8], bf16 inputs, fp32 accumulators (PTX mma.sync.m16n8k16).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90+): a kernel launched with the PDL attribute may start
// while the previous one drains; it must wait before reading what the previous one wrote.
// Elsewhere these are no-ops (the launch then serializes as usual).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Asks L2 to fetch [src, src + bytes) from memory (src 16-byte aligned, bytes a multiple of 16):
// a hint that returns nothing and waits for nothing. sm_90+ (cp.async.bulk.prefetch); older GPUs
// skip it.
__device__ __forceinline__ void prefetch_l2(const void* src, std::uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ std::uint16_t f32_to_bf16_bits(float f) {
  std::uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(f));
  return r;
}
__device__ __forceinline__ float bf16_bits_to_f32(std::uint32_t b) {
  return __uint_as_float(b << 16);
}

}  // namespace fp4moe::kernels
