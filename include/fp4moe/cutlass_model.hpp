// fp4moe: a model of the shared memory of CUTLASS's grouped GEMM kernels, as TensorRT-LLM /
// FlashInfer instantiate them for MoE layers, so a tile that cannot launch is known (and
// explained with numbers) before anything is compiled or run.
//
// What is modelled (CUTLASS 4.2.1, the version FlashInfer 0.6.3 pins):
//   - cutlass-grouped: SM90 TMA warp-specialized grouped GEMM (cooperative or ping-pong), BF16 or
//     FP8 operands (Hopper has no FP4 tensor cores).
//   - cutlass-grouped-blockscaled: block-scaled grouped GEMM with NVFP4, MXFP4 or MXFP8 x MXFP4
//     operands on SM100/SM103 (1-SM or 2-SM UMMA) and SM120/SM121 (cooperative or ping-pong).
//   - the NONE epilogue (plain store of D) and FINALIZE (TensorRT-LLM's fused scatter + top-k
//     reduction), with or without swap_ab.
// For each: the stage count exactly as StageCountAutoCarveout computes it (or a given
// StageCount<N>), then the kernel's whole SharedStorage, which also holds what the carveout leaves
// out (pipeline barriers, scheduler responses, tensor maps) and 1024-byte rounding, then the
// verdict against the architecture's opt-in limit. Terms not confirmed by measurement are marked
// `estimated` (docs/PLANNER.md says which and why).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp4moe/arch.hpp"

namespace fp4moe {

enum class Operand : std::uint8_t { kBf16, kFp8, kNvfp4, kMxfp4, kMxfp8 };
std::string_view operand_name(Operand op) noexcept;  // "bf16", "fp8", "nvfp4", "mxfp4", "mxfp8"
Operand parse_operand(std::string_view name);        // throws Error naming the value and the choices
int operand_bits(Operand op) noexcept;               // 16, 8, 4, 4, 8

enum class CutlassKernel : std::uint8_t {
  kGrouped,             // "cutlass-grouped"
  kGroupedBlockScaled,  // "cutlass-grouped-blockscaled"
};
std::string_view cutlass_kernel_name(CutlassKernel kernel) noexcept;
CutlassKernel parse_cutlass_kernel(std::string_view name);

enum class CutlassSchedule : std::uint8_t {
  kAuto,         // what the builder picks: cooperative (SM90, SM120), 1-SM or 2-SM by tile M (SM100)
  kCooperative,  // SM90, SM120
  kPingpong,     // SM90, SM120
  k1Sm,          // SM100, SM103
  k2Sm,          // SM100, SM103
};
std::string_view cutlass_schedule_name(CutlassSchedule schedule) noexcept;  // "auto", "cooperative", ...
CutlassSchedule parse_cutlass_schedule(std::string_view name);

enum class Epilogue : std::uint8_t {
  kNone,      // D = alpha * acc (+ C), stored through shared memory by TMA
  kFinalize,  // TensorRT-LLM FINALIZE: scale by the router weight, scatter-add into the token's row
};
std::string_view epilogue_name(Epilogue epilogue) noexcept;  // "none", "finalize"
Epilogue parse_epilogue(std::string_view name);

struct TileShape {
  int m = 0;  // CTA tile, in elements of the kernel's own (M, N, K) problem
  int n = 0;
  int k = 0;
  std::string to_string() const;  // "128x256x128"
  constexpr bool operator==(const TileShape&) const = default;
};
// "128x256x128" -> {128, 256, 128}; throws Error naming the text when it is not three positive
// integers joined by 'x'.
TileShape parse_tile(std::string_view text);

struct CutlassConfig {
  CutlassKernel kernel = CutlassKernel::kGroupedBlockScaled;
  // The MoE GEMM's operands: A the activations [tokens, K], B the expert weights [N, K]. With
  // swap_ab the kernel computes D^T = B A^T: its A is the weights and the tile's M runs along N.
  Operand a = Operand::kNvfp4;
  Operand b = Operand::kNvfp4;
  TileShape tile{128, 128, 128};
  Epilogue epilogue = Epilogue::kNone;
  bool swap_ab = false;
  CutlassSchedule schedule = CutlassSchedule::kAuto;
  int stages = 0;  // 0: StageCountAutoCarveout (what TensorRT-LLM uses); N > 0: StageCount<N>

  // "cutlass-grouped-blockscaled nvfp4 x nvfp4, tile 128x256x128, epilogue finalize, swap_ab off, auto
  // stages"
  std::string to_string() const;
};

// One line of a breakdown. A term either adds bytes or rounds the running total up.
struct ByteTerm {
  std::string name;
  std::int64_t bytes = 0;  // bytes added (for a rounding term: the padding it added)
  std::string how;         // the arithmetic, e.g. "128 x 128 x 4 bit"
  bool rounding = false;
  bool outside_carveout = false;  // kernel storage the stage formula never counts
  bool estimated = false;         // not confirmed by measurement (see docs/PLANNER.md)
};

struct CutlassAlternative {
  std::string change;  // "StageCount<2>", "swap_ab", "NONE epilogue + separate finalize", "K tile 64"
  CutlassConfig config;
  int stages = 0;
  std::int64_t total_bytes = 0;
  bool fits = false;
  std::string note;  // what the change costs, e.g. "one more pass over T*k*H outputs"
};

struct CutlassVerdict {
  CutlassConfig config;
  std::string arch;   // "sm_120"
  std::string model;  // "SM120 block-scaled grouped GEMM (CUTLASS 4.2.1 sm120_blockscaled_mma_builder.inl),
                      // cooperative"
  bool supported = true;
  std::string unsupported_reason;  // set when !supported: which constraint, with the values

  // One mainloop pipeline stage as the stage formula counts it.
  std::vector<ByteTerm> stage_terms;
  std::int64_t stage_bytes = 0;
  // The stage count.
  std::int64_t capacity_bytes = 0;  // what the builder divides (after its own reductions)
  std::int64_t carveout_bytes =
      0;  // StageCountAutoCarveout<carveout>: sizeof(CollectiveEpilogue::SharedStorage)
  int stages = 0;
  std::int64_t stage_spare_bytes = 0;  // capacity - carveout - stages * stage
  std::string stages_how;              // "(101376 - 17408) / 27664 = 3, 976 B to spare"
  // The epilogue's shared storage (the carveout).
  std::string epilogue_tile;  // "64x32"
  int epilogue_stages_c = 0;
  int epilogue_stages_d = 0;
  std::vector<ByteTerm> epilogue_terms;
  // The kernel's SharedStorage: what the launch asks for.
  std::vector<ByteTerm> kernel_terms;
  std::int64_t outside_carveout_bytes = 0;
  std::int64_t total_bytes = 0;
  std::int64_t limit_bytes = 0;  // the arch's opt-in shared memory per block
  bool fits = false;
  std::int64_t over_by_bytes = 0;                // 0 when it fits
  bool estimated = false;                        // some term is estimated
  std::string reason;                            // one sentence: why it fits or not, with the numbers
  std::vector<CutlassAlternative> alternatives;  // when it does not fit: changes, each with its total

  std::string to_string() const;  // the breakdown table, the verdict, the cause and the fixes
  std::string to_json() const;    // one JSON object (fits, total_bytes, limit_bytes, stages, ...)
  std::string one_line()
      const;  // "128x256x128 finalize: DOES NOT FIT 102400 B > 101376 B (3 stages, over by 1024 B)"
};

// The verdict for one configuration on one architecture. Never throws for a configuration the
// model does not support: the verdict says so (supported = false) with the reason.
CutlassVerdict explain_cutlass(const CutlassConfig& config, const ArchInfo& arch);

// TensorRT-LLM's SM120 grouped-GEMM candidate tiles (cutlass_heuristic.cpp,
// get_candidate_configs_sm120), converted from its K-in-bytes names to elements for the given
// operands: 128x128x128B, 128x128x64B, 128x256x64B and 256x128x64B.
std::vector<TileShape> trtllm_sm120_tiles(Operand a, Operand b);

}  // namespace fp4moe
