// The fp4moe subcommands. Each registers itself on the app and runs from its callback; errors
// are thrown as fp4moe::Error and printed by main.
#pragma once

#include <CLI/CLI.hpp>

namespace fp4moe::cli {

void register_info(CLI::App& app);
void register_explain(CLI::App& app);
void register_plan(CLI::App& app);
void register_bench(CLI::App& app);
void register_quantize(CLI::App& app);
void register_inspect(CLI::App& app);
void register_run(CLI::App& app);
void register_tune(CLI::App& app);

}  // namespace fp4moe::cli
