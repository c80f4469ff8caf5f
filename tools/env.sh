# Sourced by the tools/*.sh scripts: puts nvcc on PATH where the CUDA toolkit is installed in
# its usual place, and picks the build parallelism.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
FP4MOE_JOBS=${FP4MOE_JOBS:-$(nproc)}
export CMAKE_BUILD_PARALLEL_LEVEL=$FP4MOE_JOBS
