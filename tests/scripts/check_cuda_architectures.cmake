# The CUDA architecture default (cmake/CudaArchitectures.cmake) against fake nvidia-smi
# programs: a Hopper -> 90a, another GPU -> native, a mix with a Hopper -> each listed (the
# Hopper as 90a), no usable GPU -> 80;90a. Run as `cmake -P` (ctest: check_cuda_architectures).
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/CudaArchitectures.cmake)

set(dir "${CMAKE_CURRENT_BINARY_DIR}/tg_fake_nvidia_smi")
file(MAKE_DIRECTORY "${dir}")
set(failures 0)

# A fake nvidia-smi: `-L` exits with list_rc; the compute-capability query prints caps.
function(check name list_rc caps expected)
  set(fake "${dir}/${name}")
  file(WRITE "${fake}" "#!/bin/sh\nif [ \"$1\" = -L ]; then exit ${list_rc}; fi\nprintf '${caps}'\n")
  file(CHMOD "${fake}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  set(TG_NVIDIA_SMI "${fake}")
  tg_default_cuda_architectures(archs why)
  if(archs STREQUAL expected)
    message(STATUS "ok: ${name}: ${archs} (${why})")
  else()
    message(STATUS "FAIL: ${name}: got '${archs}' (${why}), expected '${expected}'")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  endif()
endfunction()

check(hopper 0 "9.0\\n" "90a")
check(two_hoppers 0 "9.0\\n9.0\\n" "90a")
check(ampere 0 "8.0\\n" "native")
check(mixed 0 "8.6\\n9.0\\n" "86;90a")
check(no_gpu 9 "" "80;90a")
check(no_answer 0 "" "80;90a")

file(REMOVE_RECURSE "${dir}")
if(failures GREATER 0)
  message(FATAL_ERROR "check_cuda_architectures: ${failures} check(s) failed")
endif()
message(STATUS "check_cuda_architectures: all checks passed")
