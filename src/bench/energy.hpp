// A GPU's energy counter, for `fp4moe bench --sustain`: NVML's total energy consumption (mJ since
// the driver loaded, Volta and newer), and its SM clock, for `--trace-clock`; read through
// libnvidia-ml.so.1, which the NVIDIA driver installs. The library is loaded at run time (dlopen):
// the build needs no NVML header or stub, and a machine without the driver's library still runs
// every other part of the bench.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace fp4moe::bench {

class EnergyCounter {
 public:
  // The counter of the GPU with this PCI bus id (as cudaDeviceGetPCIBusId writes it, e.g.
  // "0000:3B:00.0"); nullptr with the reason in *why when NVML or the counter is not available.
  static std::unique_ptr<EnergyCounter> open(const std::string& pci_bus_id, std::string* why);
  ~EnergyCounter();
  EnergyCounter(const EnergyCounter&) = delete;
  EnergyCounter& operator=(const EnergyCounter&) = delete;

  // Millijoules since the driver loaded; nullopt when the read fails.
  std::optional<std::uint64_t> millijoules() const;
  // The SM clock now, in MHz (nvmlDeviceGetClockInfo, NVML_CLOCK_SM); nullopt when the driver's
  // library lacks the call or the read fails.
  std::optional<unsigned> sm_clock_mhz() const;

  struct Api;  // the NVML entry points (energy.cpp)

 private:
  explicit EnergyCounter(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace fp4moe::bench
