#include "bench/energy.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace fp4moe::bench {

// NVML's C interface as its documentation gives it: functions return 0 (NVML_SUCCESS) or an
// error code, devices are opaque handles. Only the four entry points the counter needs.
struct EnergyCounter::Api {
  using Device = void*;
  using InitFn = int (*)();
  using ShutdownFn = int (*)();
  using ByBusIdFn = int (*)(const char*, Device*);
  using EnergyFn = int (*)(Device, unsigned long long*);
  using ClockFn = int (*)(Device, int, unsigned*);  // (device, nvmlClockType_t, MHz)
  using ErrorStringFn = const char* (*)(int);

  void* lib = nullptr;
  ShutdownFn shutdown = nullptr;
  EnergyFn energy = nullptr;
  ClockFn clock = nullptr;  // optional
  Device device = nullptr;
  bool initialized = false;

  ~Api() {
    if (initialized && shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

namespace {

template <typename Fn>
Fn symbol(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

}  // namespace

std::unique_ptr<EnergyCounter> EnergyCounter::open(const std::string& pci_bus_id, std::string* why) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    *why = "NVML (libnvidia-ml.so.1, from the NVIDIA driver) could not be loaded";
    return nullptr;
  }
  const auto init = symbol<Api::InitFn>(api->lib, "nvmlInit_v2");
  api->shutdown = symbol<Api::ShutdownFn>(api->lib, "nvmlShutdown");
  const auto by_bus_id = symbol<Api::ByBusIdFn>(api->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  api->energy = symbol<Api::EnergyFn>(api->lib, "nvmlDeviceGetTotalEnergyConsumption");
  api->clock = symbol<Api::ClockFn>(api->lib, "nvmlDeviceGetClockInfo");
  const auto error_string = symbol<Api::ErrorStringFn>(api->lib, "nvmlErrorString");
  if (!init || !api->shutdown || !by_bus_id || !api->energy) {
    *why = "libnvidia-ml.so.1 lacks the entry points of the energy counter";
    return nullptr;
  }
  const auto message = [&](int rc) {
    return error_string ? fmt::format("{} ({})", error_string(rc), rc) : fmt::format("error {}", rc);
  };
  if (const int rc = init(); rc != 0) {
    *why = fmt::format("nvmlInit failed: {}", message(rc));
    return nullptr;
  }
  api->initialized = true;
  if (const int rc = by_bus_id(pci_bus_id.c_str(), &api->device); rc != 0) {
    *why = fmt::format("NVML has no GPU at PCI bus id '{}': {}", pci_bus_id, message(rc));
    return nullptr;
  }
  unsigned long long mj = 0;
  if (const int rc = api->energy(api->device, &mj); rc != 0) {
    *why = fmt::format("the GPU's energy counter cannot be read: {}", message(rc));
    return nullptr;
  }
  return std::unique_ptr<EnergyCounter>(new EnergyCounter(std::move(api)));
}

EnergyCounter::EnergyCounter(std::unique_ptr<Api> api) : api_(std::move(api)) {}
EnergyCounter::~EnergyCounter() = default;

std::optional<std::uint64_t> EnergyCounter::millijoules() const {
  unsigned long long mj = 0;
  if (api_->energy(api_->device, &mj) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(mj);
}

std::optional<unsigned> EnergyCounter::sm_clock_mhz() const {
  constexpr int kClockSm = 1;  // NVML_CLOCK_SM
  unsigned mhz = 0;
  if (api_->clock == nullptr || api_->clock(api_->device, kClockSm, &mhz) != 0) return std::nullopt;
  return mhz;
}

}  // namespace fp4moe::bench
