# Compiler flags shared by every target.

function(fp4moe_host_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow>)
  if(FP4MOE_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  endif()
endfunction()

function(fp4moe_cuda_flags target)
  # NOTE: --warn-on-spills makes every register spill visible in the build log; spills in a
  # streaming kernel cost bandwidth. -lineinfo keeps compute-sanitizer reports readable.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=--warn-on-spills -lineinfo --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
endfunction()
