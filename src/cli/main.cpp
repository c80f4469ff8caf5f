// fp4moe: command-line driver for everything the library does.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "cli/commands.hpp"
#include "fp4moe/error.hpp"
#include "fp4moe/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fp4moe: NVFP4 / MXFP4 Mixture-of-Experts layers on NVIDIA GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fp4moe " + fp4moe::version() + " (" + fp4moe::build_commit() + ")");
  fp4moe::cli::register_info(app);
  fp4moe::cli::register_explain(app);
  fp4moe::cli::register_plan(app);
  fp4moe::cli::register_bench(app);
  fp4moe::cli::register_quantize(app);
  fp4moe::cli::register_inspect(app);
  fp4moe::cli::register_run(app);
  fp4moe::cli::register_tune(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp4moe::Error& e) {
    fmt::print(stderr, "fp4moe: {}: {}\n", fp4moe::errc_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fp4moe: unexpected error: {}\n", e.what());
    return 1;
  }
  return 0;
}
