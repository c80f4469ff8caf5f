#include "fp4moe/error.hpp"

namespace fp4moe {

std::string_view errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::kInvalidArgument:
      return "invalid argument";
    case Errc::kUnsupported:
      return "unsupported";
    case Errc::kDoesNotFit:
      return "does not fit";
    case Errc::kBadFile:
      return "bad file";
    case Errc::kIo:
      return "I/O error";
    case Errc::kCuda:
      return "CUDA error";
    case Errc::kInternal:
      return "internal error";
  }
  return "unknown error";
}

}  // namespace fp4moe
