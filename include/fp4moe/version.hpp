// fp4moe: what this build is.
#pragma once

#include <string>

namespace fp4moe {

std::string version();               // "0.3.0"
std::string build_commit();          // git commit of the build, "-dirty" if it had local changes
std::string cuda_architectures();    // e.g. "80-real;90a-real;120a-real", empty without CUDA
std::string cuda_runtime_version();  // "13.0" of the runtime linked in, or "none"

}  // namespace fp4moe
