# SPDX-License-Identifier: MIT
# Fuzz targets.  Always: regress_<target> replays tests/fuzz/corpus/<target>
# (seeds, everything a campaign kept, every crash found) under ctest.
# With -DFLEXFS_FUZZ=ON and clang: fuzz_<target> libFuzzer binaries
# (ASan + UBSan); see tests/fuzz/README.md for campaigns.
option(FLEXFS_FUZZ "Build libFuzzer targets (clang)" OFF)

set(flx_fuzz_dir ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
set(flx_fuzz_targets pickle pickle_window zipitem metadata safetensors options
  megatron)
list(APPEND flx_fuzz_targets paddle_meta paddle_distcp)
list(APPEND flx_fuzz_targets zstditem)
list(APPEND flx_fuzz_targets aoa)
list(APPEND flx_fuzz_targets ms_ckpt ms_strategy)
list(APPEND flx_fuzz_targets megatron_zarr)
list(APPEND flx_fuzz_targets torchfile)
list(APPEND flx_fuzz_targets megatron_legacy)
list(APPEND flx_fuzz_targets deepspeed)
list(APPEND flx_fuzz_targets pickle_sink)
set(flx_fuzz_libs_pickle flx_resolver)
set(flx_fuzz_libs_pickle_window flx_resolver)
# any pickle is a seed of pickle_window: it replays pickle's corpus too
set(flx_fuzz_more_pickle_window ${flx_fuzz_dir}/corpus/pickle)
set(flx_fuzz_libs_pickle_sink flx_resolver)
# DCP and Paddle .metadata files are its seeds, any other pickle too
set(flx_fuzz_more_pickle_sink ${flx_fuzz_dir}/corpus/metadata
  ${flx_fuzz_dir}/corpus/paddle_meta ${flx_fuzz_dir}/corpus/pickle)
set(flx_fuzz_libs_zipitem flx_resolver)
set(flx_fuzz_libs_zstditem flx_resolver)
set(flx_fuzz_libs_aoa flx_reshard)
set(flx_fuzz_libs_metadata flx_fs)
set(flx_fuzz_libs_safetensors flx_fs)
set(flx_fuzz_libs_megatron flx_fs)
set(flx_fuzz_libs_megatron_zarr flx_fs)
set(flx_fuzz_libs_paddle_meta flx_fs)
set(flx_fuzz_libs_paddle_distcp flx_fs)
set(flx_fuzz_libs_options flx_mountopts)
set(flx_fuzz_libs_ms_ckpt flx_fs)
set(flx_fuzz_libs_ms_strategy flx_resolver)
set(flx_fuzz_libs_torchfile flx_resolver)
set(flx_fuzz_libs_megatron_legacy flx_fs)
set(flx_fuzz_libs_deepspeed flx_fs)

foreach(t ${flx_fuzz_targets})
  add_executable(regress_${t} ${flx_fuzz_dir}/regression_driver.c
    ${flx_fuzz_dir}/fuzz_${t}.c)
  target_link_libraries(regress_${t} PRIVATE ${flx_fuzz_libs_${t}})
  add_test(NAME fuzz_regress_${t}
    COMMAND regress_${t} ${flx_fuzz_dir}/corpus/${t} ${flx_fuzz_more_${t}}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(fuzz_regress_${t} PROPERTIES LABELS fuzz)
  if(FLEXFS_FUZZ)
    add_executable(fuzz_${t} ${flx_fuzz_dir}/fuzz_${t}.c)
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${t} PRIVATE ${flx_fuzz_libs_${t}})
  endif()
endforeach()
if(FLEXFS_FUZZ)
  # the libraries too: coverage feedback needs their edges
  foreach(lib flx_resolver flx_reshard flx_fs flx_gpu flx_mountopts)
    target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link)
  endforeach()
endif()
