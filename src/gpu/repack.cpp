#include "gpu/repack.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/fail.hpp"
#include "fp4moe/bf16.hpp"
#include "kernels/weight_layout.hpp"

namespace fp4moe::gpu {
namespace {

using kernels::WeightLayout;

// Where one device row's data comes from: a source matrix row, or zeros (padding).
struct RowSource {
  const QuantizedMatrix* m = nullptr;
  std::int64_t row = 0;
  int scale_shift = 0;  // MXFP4: s_max - 17 of that matrix (scale bytes are (s - shift) << 3)
};

std::uint8_t code_at(const QuantizedMatrix& m, std::int64_t r, std::int64_t c) {
  const std::uint8_t byte = m.packed[static_cast<std::size_t>(r * (m.cols / 2) + c / 2)];
  return (c & 1) ? static_cast<std::uint8_t>(byte >> 4) : static_cast<std::uint8_t>(byte & 0xf);
}

// NVFP4 E4M3 scale code -> (device byte, code transform): 0 = keep, 1 = flip signs, 2 = zero.
struct ScaleEncoding {
  std::uint8_t byte = 0;
  int transform = 0;
};

ScaleEncoding encode_e4m3_scale(std::uint8_t code, const QuantizedMatrix& m, std::int64_t r,
                                std::int64_t block) {
  const int exp_field = (code >> 3) & 0xf;
  const int mant = code & 7;
  if (exp_field == 15 && mant == 7) {
    fail(Errc::kInvalidArgument,
         "NVFP4 block scale at row {}, block {} is NaN (E4M3 code 0x{:02x}); a checkpoint "
         "scale must be a number",
         r, block, code);
  }
  (void)m;
  ScaleEncoding enc;
  enc.transform = (code & 0x80) ? 1 : 0;
  int e = 0;  // unbiased exponent of the normalized value
  int mm = 0;
  if (exp_field > 0) {
    e = exp_field - 7;
    mm = mant;
  } else if (mant == 0) {
    enc.transform = 2;
    return enc;
  } else {
    const int p = std::bit_width(static_cast<unsigned>(mant)) - 1;  // msb of the subnormal mantissa
    e = p - 9;
    mm = (mant << (3 - p)) & 7;
  }
  enc.byte = static_cast<std::uint8_t>(((e + 9) << 3) | mm);
  return enc;
}

ScaleEncoding encode_ue8m0_scale(std::uint8_t code, int scale_shift, std::int64_t r, std::int64_t block) {
  if (code == 0xff) {
    fail(Errc::kInvalidArgument, "MXFP4 block scale at row {}, block {} is NaN (UE8M0 code 0xff)", r, block);
  }
  ScaleEncoding enc;
  const int rel = static_cast<int>(code) - scale_shift;
  if (rel < 0) {
    enc.transform = 2;  // more than 2^17 below the matrix's largest block: flushed to zero
    return enc;
  }
  enc.byte = static_cast<std::uint8_t>(rel << 3);
  return enc;
}

int mxfp4_max_scale(const QuantizedMatrix& m) {
  int s_max = 0;
  for (std::uint8_t s : m.scales) {
    if (s != 0xff && s > s_max) s_max = s;
  }
  return s_max;
}

void check_matrix(const QuantizedMatrix& m, const char* what) {
  m.validate();
  if (m.format == WeightFormat::kNvfp4 && !(std::isfinite(m.global_scale) && m.global_scale > 0.0f)) {
    fail(Errc::kInvalidArgument, "{}: NVFP4 weight_scale_2 = {} must be a positive finite number", what,
         m.global_scale);
  }
}

// Fills the fragment layout for `device_rows` rows whose sources `source(row)` gives.
template <typename SourceFn>
void fill_layout(std::int64_t device_rows, std::int64_t k, WeightFormat format, SourceFn source,
                 std::span<std::uint8_t> out) {
  const std::int64_t n_groups = WeightLayout::groups(device_rows);
  const std::int64_t n_chunks = WeightLayout::chunks(k);
  const std::int64_t need = WeightLayout::matrix_bytes(device_rows, k);
  if (static_cast<std::int64_t>(out.size()) != need) {
    fail(Errc::kInternal, "repack: output span has {} bytes, the layout needs {}", out.size(), need);
  }
  std::memset(out.data(), 0, out.size());
  const int block = block_size(format);
  for (std::int64_t grp = 0; grp < n_groups; ++grp) {
    for (std::int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      std::uint8_t* blk = out.data() + WeightLayout::block_offset(grp, chunk, n_chunks);
      for (int tile = 0; tile < WeightLayout::kTilesPerGroup; ++tile) {
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          const std::int64_t k0 = chunk * WeightLayout::kChunkK + 16 * t;
          std::uint32_t words[4] = {0, 0, 0, 0};
          std::uint8_t scale_bytes[2] = {0, 0};
          for (int h = 0; h < 2; ++h) {
            const std::int64_t row = grp * WeightLayout::kGroupRows + tile * 16 + g + 8 * h;
            const RowSource src = source(row);
            if (src.m == nullptr || k0 >= k) continue;
            const std::int64_t scale_col = k0 / block;
            const std::uint8_t sc =
                src.m->scales[static_cast<std::size_t>(src.row * src.m->scale_cols() + scale_col)];
            const ScaleEncoding enc = format == WeightFormat::kNvfp4
                                          ? encode_e4m3_scale(sc, *src.m, src.row, scale_col)
                                          : encode_ue8m0_scale(sc, src.scale_shift, src.row, scale_col);
            if (enc.transform == 2) continue;
            scale_bytes[h] = enc.byte;
            for (int j = 0; j < 16; ++j) {
              std::uint32_t code = code_at(*src.m, src.row, k0 + j);
              if (enc.transform == 1) code ^= 8u;
              const int s = j / 4;
              const int o = j % 4;
              for (int b = 0; b < 4; ++b) {
                words[s] |= ((code >> b) & 1u) << kernels::code_bit_position(h, o, b);
              }
            }
          }
          std::uint8_t* wdst =
              blk + tile * WeightLayout::kTileWeightBytes + lane * WeightLayout::kLaneWeightBytes;
          std::memcpy(wdst, words, sizeof(words));  // little-endian words, as the GPU loads them
          std::uint8_t* sdst = blk + WeightLayout::kBlockWeightBytes + tile * WeightLayout::kTileScaleBytes +
                               lane * WeightLayout::kLaneScaleBytes;
          sdst[0] = scale_bytes[0];
          sdst[1] = scale_bytes[1];
        }
      }
    }
  }
}

float post_scale_of(const QuantizedMatrix& m, int s_max) {
  if (m.format == WeightFormat::kNvfp4) return 128.0f * m.global_scale;
  return std::ldexp(1.0f, s_max - 128);
}

}  // namespace

float repack_matrix(const QuantizedMatrix& w, std::span<std::uint8_t> out) {
  check_matrix(w, "matrix");
  const int s_max = w.format == WeightFormat::kMxfp4 ? mxfp4_max_scale(w) : 0;
  fill_layout(
      w.rows, w.cols, w.format,
      [&](std::int64_t row) {
        if (row >= w.rows) return RowSource{};
        return RowSource{&w, row, s_max - 17};
      },
      out);
  return post_scale_of(w, s_max);
}

GateUpScales repack_gate_up(const QuantizedMatrix& gate, const QuantizedMatrix& up,
                            std::span<std::uint8_t> out) {
  check_matrix(gate, "gate");
  check_matrix(up, "up");
  if (gate.rows != up.rows || gate.cols != up.cols || gate.format != up.format) {
    fail(Errc::kInvalidArgument, "gate [{}, {}] {} and up [{}, {}] {} must have the same shape and format",
         gate.rows, gate.cols, format_name(gate.format), up.rows, up.cols, format_name(up.format));
  }
  if (gate.rows % 8 != 0) {
    fail(Errc::kInvalidArgument, "intermediate size {} must be a multiple of 8 for the gate/up interleave",
         gate.rows);
  }
  const int s_gate = gate.format == WeightFormat::kMxfp4 ? mxfp4_max_scale(gate) : 0;
  const int s_up = up.format == WeightFormat::kMxfp4 ? mxfp4_max_scale(up) : 0;
  const std::int64_t inter = gate.rows;
  fill_layout(
      2 * inter, gate.cols, gate.format,
      [&](std::int64_t row) {
        const std::int64_t tile = row / 16;
        const std::int64_t r = row % 16;
        const std::int64_t j = tile * 8 + r % 8;
        if (j >= inter) return RowSource{};
        return r < 8 ? RowSource{&gate, j, s_gate - 17} : RowSource{&up, j, s_up - 17};
      },
      out);
  return {post_scale_of(gate, s_gate), post_scale_of(up, s_up)};
}

// Rows [r0, r0 + n) of m (zero rows past its end).
QuantizedMatrix slice_rows(const QuantizedMatrix& m, std::int64_t r0, std::int64_t n) {
  QuantizedMatrix s;
  s.format = m.format;
  s.rows = n;
  s.cols = m.cols;
  s.global_scale = m.global_scale;
  s.packed.assign(static_cast<std::size_t>(n * m.cols / 2), 0);
  s.scales.assign(static_cast<std::size_t>(n * m.scale_cols()), 0);
  const std::int64_t have = std::max<std::int64_t>(0, std::min(n, m.rows - r0));
  if (have > 0) {
    std::memcpy(s.packed.data(), m.packed.data() + r0 * m.cols / 2,
                static_cast<std::size_t>(have * m.cols / 2));
    std::memcpy(s.scales.data(), m.scales.data() + r0 * m.scale_cols(),
                static_cast<std::size_t>(have * m.scale_cols()));
  }
  return s;
}

// Columns [c0, c0 + n) of m (zero columns past its end); c0 and n multiples of the block.
QuantizedMatrix slice_cols(const QuantizedMatrix& m, std::int64_t c0, std::int64_t n) {
  QuantizedMatrix s;
  s.format = m.format;
  s.rows = m.rows;
  s.cols = n;
  s.global_scale = m.global_scale;
  const std::int64_t block = block_size(m.format);
  s.packed.assign(static_cast<std::size_t>(m.rows * n / 2), 0);
  s.scales.assign(static_cast<std::size_t>(m.rows * n / block), 0);
  const std::int64_t have = std::max<std::int64_t>(0, std::min(n, m.cols - c0));
  for (std::int64_t r = 0; r < m.rows && have > 0; ++r) {
    std::memcpy(s.packed.data() + r * n / 2, m.packed.data() + r * m.cols / 2 + c0 / 2,
                static_cast<std::size_t>(have / 2));
    std::memcpy(s.scales.data() + r * n / block, m.scales.data() + r * m.scale_cols() + c0 / block,
                static_cast<std::size_t>(have / block));
  }
  return s;
}

RepackedMatrix repack(const QuantizedMatrix& w) {
  RepackedMatrix m;
  m.rows = w.rows;
  m.k = w.cols;
  m.bytes.resize(static_cast<std::size_t>(WeightLayout::matrix_bytes(w.rows, w.cols)));
  const float ps = repack_matrix(w, m.bytes);
  m.post_scale[0] = m.post_scale[1] = ps;
  return m;
}

RepackedMatrix repack(const QuantizedMatrix& gate, const QuantizedMatrix& up) {
  RepackedMatrix m;
  m.rows = 2 * gate.rows;
  m.k = gate.cols;
  m.bytes.resize(static_cast<std::size_t>(WeightLayout::matrix_bytes(m.rows, m.k)));
  const GateUpScales s = repack_gate_up(gate, up, m.bytes);
  m.post_scale[0] = s.gate;
  m.post_scale[1] = s.up;
  return m;
}

std::vector<float> simulate_fragment_gemm(const RepackedMatrix& m, std::span<const std::uint16_t> x,
                                          std::int64_t tokens) {
  const std::int64_t n_groups = WeightLayout::groups(m.rows);
  const std::int64_t n_chunks = WeightLayout::chunks(m.k);
  std::vector<float> y(static_cast<std::size_t>(tokens * m.rows), 0.0f);
  auto bf16 = [](std::uint32_t bits) { return std::bit_cast<float>(bits << 16); };
  for (std::int64_t grp = 0; grp < n_groups; ++grp) {
    for (int tile = 0; tile < WeightLayout::kTilesPerGroup; ++tile) {
      for (std::int64_t tok = 0; tok < tokens; ++tok) {
        // acc[row in tile], accumulated chunk by chunk, step by step, as one mma column does.
        float acc[16] = {};
        for (std::int64_t chunk = 0; chunk < n_chunks; ++chunk) {
          const std::uint8_t* blk = m.bytes.data() + WeightLayout::block_offset(grp, chunk, n_chunks);
          for (int s = 0; s < 4; ++s) {
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane / 4;
              const int t = lane % 4;
              std::uint32_t words[4];
              std::memcpy(words, blk + tile * WeightLayout::kTileWeightBytes + lane * 16, 16);
              const std::uint8_t* sc =
                  blk + WeightLayout::kBlockWeightBytes + tile * WeightLayout::kTileScaleBytes + lane * 2;
              std::uint32_t a[4];
              kernels::decode_e2m1x8(words[s], a);
              const float scale[2] = {bf16(kernels::scale_bits(sc[0])), bf16(kernels::scale_bits(sc[1]))};
              for (int reg = 0; reg < 4; ++reg) {
                const int h = reg & 1;         // a0, a2: row g; a1, a3: row g+8
                const int o = (reg >> 1) * 2;  // a0, a1: k 4s+{0,1}; a2, a3: k 4s+{2,3}
                for (int half = 0; half < 2; ++half) {
                  // The GPU multiplies in bf16 (rounding to nearest even); the product is exact by design.
                  const float w = round_to_bf16(bf16((a[reg] >> (16 * half)) & 0xffff) * scale[h]);
                  const std::int64_t kk = chunk * 64 + 16 * t + 4 * s + o + half;
                  const float xv = kk < m.k ? bf16(x[static_cast<std::size_t>(tok * m.k + kk)]) : 0.0f;
                  acc[g + 8 * h] += w * xv;
                }
              }
            }
          }
        }
        for (int r = 0; r < 16; ++r) {
          const std::int64_t row = grp * 64 + tile * 16 + r;
          if (row >= m.rows) continue;
          const bool up_half = r >= 8;
          y[static_cast<std::size_t>(tok * m.rows + row)] = acc[r] * m.post_scale[up_half ? 1 : 0];
        }
      }
    }
  }
  return y;
}

}  // namespace fp4moe::gpu
