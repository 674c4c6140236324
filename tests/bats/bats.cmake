# SPDX-License-Identifier: MIT
# End-to-end tests: one ctest per tests/bats/*.bats, run by bats-core.
# They mount real FUSE filesystems; each test skips by itself where
# /dev/fuse or fusermount3 is missing.  Disabled (listed, not run) when
# bats or the FUSE front end is absent.
find_program(BATS_EXECUTABLE bats)
file(GLOB flx_bats_files CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/bats/*.bats)

if(FLEXFS_WITH_FUSE AND TARGET flexfs)
  # faults.bats: a backing file cut short under the daemon (LD_PRELOAD)
  add_library(flx_short_read MODULE ${CMAKE_CURRENT_SOURCE_DIR}/bats/lib/short_read.c)
  target_link_libraries(flx_short_read PRIVATE ${CMAKE_DL_LIBS})
  set(flx_bats_env
    "FLEXFS_BIN=$<TARGET_FILE:flexfs>"
    "FLEXFS_INSPECT=$<TARGET_FILE:flexfs-inspect>"
    "FLEXFS_SHORT_READ=$<TARGET_FILE:flx_short_read>"
    "FLEXFS_CUDA_STUB_LIB=$<TARGET_FILE:flx_stub_cuda>"
    "FLEXFS_SRC=${CMAKE_SOURCE_DIR}"
    "FLEXFS_BUILD_ROOT=${CMAKE_BINARY_DIR}"
    "FLEXFS_MPI=${FLEXFS_WITH_MPI}")
  set(flx_bats_disabled OFF)
else()
  set(flx_bats_env "FLEXFS_SRC=${CMAKE_SOURCE_DIR}")
  set(flx_bats_disabled ON)
endif()
if(NOT BATS_EXECUTABLE)
  set(BATS_EXECUTABLE bats)
  set(flx_bats_disabled ON)
endif()

# The files run again by the sanitized build (tools/test-sanitize.sh,
# label "sanitized"): each source's daemon path, the MPI backend, faults,
# limits, races and permissions.  The others spend their time in Python
# oracles over code that runs sanitized in the unit tests (test_cases*
# serves the whole case corpus through the views; test_aoa, the fuzz
# regressions and the chaos tests the compiler and the parsers); see
# docs/testing.md.
set(flx_bats_sanitized faults gather gpu hf limits manyfiles megatron
  megatron_legacy megatron_source megatron_zarr mindspore mount mpi_mount
  paddle passthrough perms push security stress usability zstd)

foreach(file ${flx_bats_files})
  get_filename_component(name ${file} NAME_WE)
  add_test(NAME e2e_${name} COMMAND ${BATS_EXECUTABLE} --tap ${file})
  set(labels e2e)
  if(name IN_LIST flx_bats_sanitized)
    list(APPEND labels sanitized)
  endif()
  set_tests_properties(e2e_${name} PROPERTIES
    ENVIRONMENT "${flx_bats_env}"
    LABELS "${labels}"
    DISABLED ${flx_bats_disabled})
endforeach()
