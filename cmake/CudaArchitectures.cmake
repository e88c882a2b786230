# tg_default_cuda_architectures(<out_var> <why_var>): the CUDA architectures to build for when
# the user named none: the GPU(s) present at configure time (`native`), except that a Hopper
# (compute capability 9.0) gets `90a`, as the wgmma/TMA kernels need the `a` features; with no
# usable GPU (`nvidia-smi -L` fails or there is no nvidia-smi), `80;90a`: an sm_80 build that
# any Ampere-or-newer GPU runs (the mma.sync paths) and Hopper's own code.
# TG_NVIDIA_SMI, when defined, names the nvidia-smi to ask (tests pass a fake one).
function(tg_default_cuda_architectures out_var why_var)
  set(archs "80;90a")
  set(why "no usable GPU found by nvidia-smi")
  if(NOT DEFINED TG_NVIDIA_SMI)
    find_program(TG_NVIDIA_SMI nvidia-smi)
  endif()
  if(TG_NVIDIA_SMI)
    execute_process(COMMAND ${TG_NVIDIA_SMI} -L RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0)
      execute_process(COMMAND ${TG_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                      RESULT_VARIABLE rc OUTPUT_VARIABLE caps ERROR_QUIET TIMEOUT 30)
      string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${caps}")
      if(rc EQUAL 0 AND caps)
        set(why "GPU(s) of compute capability ${caps}")
        if("9.0" IN_LIST caps)
          # `native` would give plain 90; spell the list out with 90a.
          set(archs "")
          foreach(cap IN LISTS caps)
            string(REPLACE "." "" arch "${cap}")
            if(arch STREQUAL "90")
              set(arch "90a")
            endif()
            list(APPEND archs ${arch})
          endforeach()
          list(REMOVE_DUPLICATES archs)
        else()
          set(archs native)
        endif()
      endif()
    endif()
  endif()
  set(${out_var} "${archs}" PARENT_SCOPE)
  set(${why_var} "${why}" PARENT_SCOPE)
endfunction()
