# The build's kernel resource report: registers, static shared memory and spills of every
# kernel in kernels/*.cu for every architecture in CMAKE_CUDA_ARCHITECTURES, as ptxas reports
# them (cmake/resource_report.py). `fp4moe plan` reads it (path compiled into the library) to
# count registers in occupancy when no GPU is there to ask; without CUDA there is no report and
# the planner says occupancy comes from shared memory and threads only.
set(FP4MOE_RESOURCE_REPORT ${CMAKE_BINARY_DIR}/fp4moe_resources.json)
target_compile_definitions(fp4moe PRIVATE FP4MOE_RESOURCE_REPORT_PATH="${FP4MOE_RESOURCE_REPORT}")

if(FP4MOE_HAVE_CUDA)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  file(GLOB _fp4moe_report_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cu)
  file(GLOB _fp4moe_report_headers CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.hpp
       ${CMAKE_SOURCE_DIR}/kernels/*.cuh ${CMAKE_SOURCE_DIR}/include/fp4moe/*.hpp)
  # 80-real, 90a-real, 120a -> 80, 90a, 120a. "native", "all" and friends name no architecture
  # we can compile for one by one: they are skipped with a warning.
  set(_fp4moe_report_args)
  foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    string(REGEX REPLACE "-(real|virtual)$" "" arch "${arch}")
    if(arch MATCHES "^[0-9]+[af]?$")
      list(APPEND _fp4moe_report_args --arch ${arch})
    else()
      message(WARNING "fp4moe: resource report skips CUDA architecture '${arch}' (not a number)")
    endif()
  endforeach()
  # A kernel whose wgmmas ptxas serialized fails the build (resource_report.py); this option turns
  # that into a warning, e.g. for a toolkit whose ptxas judges the pipeline differently.
  option(FP4MOE_ALLOW_SERIALIZED_WGMMA "Build even when ptxas serializes a kernel's wgmmas" OFF)
  if(FP4MOE_ALLOW_SERIALIZED_WGMMA)
    list(APPEND _fp4moe_report_args --allow-serialized-wgmma)
  endif()
  find_program(FP4MOE_DEMANGLER NAMES cu++filt c++filt HINTS ${CUDAToolkit_BIN_DIR})
  if(FP4MOE_DEMANGLER)
    list(APPEND _fp4moe_report_args --demangler ${FP4MOE_DEMANGLER})
  endif()
  if(_fp4moe_report_sources AND _fp4moe_report_args MATCHES "--arch")
    add_custom_command(
      OUTPUT ${FP4MOE_RESOURCE_REPORT}
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/cmake/resource_report.py --out ${FP4MOE_RESOURCE_REPORT}
              --nvcc ${CMAKE_CUDA_COMPILER} --std ${CMAKE_CUDA_STANDARD} --root ${CMAKE_SOURCE_DIR}
              --include ${CMAKE_SOURCE_DIR} --include ${CMAKE_SOURCE_DIR}/include
              --flag=--expt-relaxed-constexpr ${_fp4moe_report_args} ${_fp4moe_report_sources}
      DEPENDS ${_fp4moe_report_sources} ${_fp4moe_report_headers} ${CMAKE_SOURCE_DIR}/cmake/resource_report.py
      COMMENT "fp4moe: kernel resource report (ptxas --resource-usage)"
      VERBATIM)
    add_custom_target(fp4moe_resource_report ALL DEPENDS ${FP4MOE_RESOURCE_REPORT})
  endif()
endif()
