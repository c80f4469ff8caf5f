// fp4moe info: the build, and the GPUs found with the numbers the planner uses.
#include <fmt/format.h>

#include <string>

#include "cli/commands.hpp"
#include "fp4moe/device.hpp"
#include "fp4moe/version.hpp"

namespace fp4moe::cli {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the build (version, commit, CUDA) and the GPUs found");
  cmd->callback([] {
    fmt::print("fp4moe {} (commit {})\n", version(), build_commit());
    if (built_with_cuda()) {
      fmt::print("CUDA: on (kernels for {}; runtime {})\n", cuda_architectures(), cuda_runtime_version());
    } else {
      fmt::print("CUDA: off (built without nvcc; the CPU reference backend only)\n");
    }
    std::string why;
    const auto gpus = list_gpus(&why);
    if (gpus.empty()) {
      fmt::print("GPUs: none ({})\n", why);
      return;
    }
    for (const auto& g : gpus) {
      fmt::print(
          "GPU {}: {}, compute capability {}.{} (sm_{}), {} SMs, {} B shared memory per block (opt-in), "
          "{} B per SM, {:.0f} MiB L2, {:.1f} GiB\n",
          g.index, g.name, g.cc_major, g.cc_minor, g.sm(), g.sm_count, g.smem_per_block_optin, g.smem_per_sm,
          g.l2_bytes / 1048576.0, g.global_memory_bytes / 1073741824.0);
    }
  });
}

}  // namespace fp4moe::cli
