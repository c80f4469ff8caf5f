#include <gtest/gtest.h>

#include "test_util/run_command.hpp"

namespace fp4moe {
namespace {

TEST(Cli, HelpListsSubcommands) {
  const auto r = test_util::run_cli("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("info"), std::string::npos) << r.output;
}

TEST(Cli, InfoPrintsBuildAndGpus) {
  const auto r = test_util::run_cli("info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp4moe "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU"), std::string::npos) << r.output;
}

TEST(Cli, UnknownSubcommandFails) {
  const auto r = test_util::run_cli("no-such-command");
  EXPECT_NE(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace fp4moe
