// libFuzzer target for the safetensors reader: any byte string must either parse into a header
// whose every tensor lies inside the file with the size its shape and dtype give, or be refused
// with fp4moe::Error. Any other exception, a crash, or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fp4moe/error.hpp"
#include "fp4moe/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> file(data, size);
  fp4moe::SafetensorsHeader header;
  try {
    header = fp4moe::parse_safetensors(file, "fuzz");
  } catch (const fp4moe::Error&) {
    return 0;
  }
  std::uint64_t expected_begin = 0;
  for (const auto& t : header.tensors) {
    const std::uint64_t bits = static_cast<std::uint64_t>(t.numel()) * fp4moe::dtype_bits(t.dtype);
    if (t.begin != expected_begin || t.end < t.begin || bits / 8 != t.bytes() ||
        header.data_offset + t.end > size) {
      __builtin_trap();
    }
    // Touch the first and last byte, so ASan checks the range against the input buffer.
    if (t.bytes() > 0) {
      volatile std::uint8_t sink = data[header.data_offset + t.begin] ^ data[header.data_offset + t.end - 1];
      (void)sink;
    }
    expected_begin = t.end;
  }
  if (header.data_offset + expected_begin != size) __builtin_trap();
  return 0;
}
