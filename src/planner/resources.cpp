// Registers and static shared memory of compiled kernels: the build's resource report (written
// by cmake/resource_report.py from ptxas --resource-usage) and the lookup by kernel name.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "common/fail.hpp"
#include "fp4moe/planner.hpp"

namespace fp4moe {
namespace {

// The integers of a kernel name after `prefix`, up to its argument list: words of their own
// ("1", "1u"), or one letter then digits ("m1").
std::vector<int> name_numbers(std::string_view name, std::string_view prefix) {
  std::vector<int> numbers;
  const auto at = name.find(prefix);
  if (at == std::string_view::npos) return numbers;
  std::string_view rest = name.substr(at + prefix.size());
  int depth = 0;
  std::size_t end = 0;
  for (; end < rest.size(); ++end) {
    const char ch = rest[end];
    if (ch == '<') ++depth;
    if (ch == '>') --depth;
    if (ch == '(' && depth == 0) break;
  }
  rest = rest.substr(0, end);
  std::size_t i = 0;
  while (i < rest.size()) {
    if (!std::isalnum(static_cast<unsigned char>(rest[i]))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < rest.size() && std::isalnum(static_cast<unsigned char>(rest[j]))) ++j;
    std::string_view word = rest.substr(i, j - i);
    i = j;
    if (!word.empty() && std::isalpha(static_cast<unsigned char>(word.front()))) word.remove_prefix(1);
    if (!word.empty() && word.back() == 'u') word.remove_suffix(1);
    int v = 0;
    const auto* wend = word.data() + word.size();
    const auto r = std::from_chars(word.data(), wend, v);
    if (!word.empty() && r.ec == std::errc() && r.ptr == wend) numbers.push_back(v);
  }
  return numbers;
}

template <typename T>
T field(const nlohmann::json& entry, const char* key, const std::string& path, std::size_t index) {
  const auto it = entry.find(key);
  if (it == entry.end()) {
    fail(Errc::kBadFile, "{}: kernels[{}] has no \"{}\"", path, index, key);
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) fail(Errc::kBadFile, "{}: kernels[{}].{} is not a string", path, index, key);
  } else {
    if (!it->is_number_integer() || it->template get<std::int64_t>() < 0) {
      fail(Errc::kBadFile, "{}: kernels[{}].{} is not a non-negative integer ({})", path, index, key,
           it->dump());
    }
  }
  return it->template get<T>();
}

int arch_number(const std::string& arch, const std::string& path, std::size_t index) {
  std::string_view s = arch;
  if (s.starts_with("sm_")) s.remove_prefix(3);
  while (!s.empty() && std::isalpha(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  int v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) {
    fail(Errc::kBadFile, "{}: kernels[{}].arch '{}' is not sm_<number>[a|f]", path, index, arch);
  }
  return v;
}

}  // namespace

std::string_view resource_source_name(ResourceSource source) noexcept {
  switch (source) {
    case ResourceSource::kNone:
      return "none";
    case ResourceSource::kMeasured:
      return "measured";
    case ResourceSource::kBuildReport:
      return "build report";
  }
  return "?";
}

const KernelResourceUsage* KernelResources::find(std::string_view prefix, const std::vector<int>& params,
                                                 int sm) const {
  const KernelResourceUsage* best = nullptr;
  for (const auto& k : kernels) {
    if (k.sm != sm || k.kernel.find(prefix) == std::string::npos) continue;
    const auto numbers = name_numbers(k.kernel, prefix);
    if (numbers.size() < params.size() || !std::equal(params.begin(), params.end(), numbers.begin()))
      continue;
    if (best == nullptr || k.registers > best->registers) best = &k;
  }
  return best;
}

KernelResources load_resource_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(Errc::kIo, "cannot open the resource report {}", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail(Errc::kBadFile, "{}: not JSON ({})", path, e.what());
  }
  if (!j.is_object() || !j.contains("kernels") || !j["kernels"].is_array()) {
    fail(Errc::kBadFile, "{}: expected an object with a \"kernels\" array", path);
  }
  KernelResources r;
  r.source = ResourceSource::kBuildReport;
  r.origin = path;
  const auto& arr = j["kernels"];
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const auto& e = arr[i];
    if (!e.is_object()) fail(Errc::kBadFile, "{}: kernels[{}] is not an object", path, i);
    KernelResourceUsage u;
    u.kernel = field<std::string>(e, "name", path, i);
    u.sm = arch_number(field<std::string>(e, "arch", path, i), path, i);
    u.registers = static_cast<int>(field<std::int64_t>(e, "registers", path, i));
    u.static_smem_bytes = field<std::int64_t>(e, "static_smem_bytes", path, i);
    u.spill_bytes = field<std::int64_t>(e, "spill_store_bytes", path, i) +
                    field<std::int64_t>(e, "spill_load_bytes", path, i);
    r.kernels.push_back(std::move(u));
  }
  return r;
}

std::string default_resource_report_path() {
#ifdef FP4MOE_RESOURCE_REPORT_PATH
  return FP4MOE_RESOURCE_REPORT_PATH;
#else
  return {};
#endif
}

const KernelResources& build_resources() {
  static const KernelResources resources = [] {
    const std::string path = default_resource_report_path();
    KernelResources r;
    if (path.empty()) {
      r.origin = "this build has no resource report";
      return r;
    }
    if (!std::ifstream(path)) {
      r.origin = fmt::format("no resource report at {} (written by CUDA builds only)", path);
      return r;
    }
    return load_resource_report(path);
  }();
  return resources;
}

}  // namespace fp4moe
