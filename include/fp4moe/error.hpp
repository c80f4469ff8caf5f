// fp4moe: errors.
//
// Every failure in the library is reported by throwing fp4moe::Error, whose message names the
// bad value and what was expected ("hidden=6143 is not a multiple of 16 (NVFP4 block size)").
// The library never calls exit() or abort(); the CLI catches Error and prints its message.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace fp4moe {

enum class Errc {
  kInvalidArgument,  // a value outside what the function accepts (shape, option, NaN input)
  kUnsupported,      // valid, but not supported by this build, arch or format
  kDoesNotFit,       // a kernel configuration does not fit the device (shared memory, registers)
  kBadFile,          // a file that is malformed or inconsistent
  kIo,               // the operating system refused a read or write
  kCuda,             // a CUDA runtime or cuBLAS call failed
  kInternal,         // a broken invariant inside fp4moe (a bug: please report it)
};

std::string_view errc_name(Errc code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

}  // namespace fp4moe
