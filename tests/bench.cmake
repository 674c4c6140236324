# SPDX-License-Identifier: MIT
# The benchmark's quick mode as a test: a tiny checkpoint written by torch's
# own DCP writer (1.13, and 2.6 when the /opt/trixie chroot exists and we
# are root), one pass over every figure, and every byte read through flexfs
# compared with the ground truth and with torch's own loader.  No timing is
# asserted.  Skips (77) only where /dev/fuse is missing.
# Include from tests/CMakeLists.txt:  include(${CMAKE_CURRENT_SOURCE_DIR}/bench.cmake OPTIONAL)
if(FLEXFS_WITH_FUSE AND TARGET flexfs)
  add_test(NAME bench_quick
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/../tools/bench/flexfs-bench --quick
      --workdir ${CMAKE_CURRENT_BINARY_DIR}/bench-quick
      --json ${CMAKE_CURRENT_BINARY_DIR}/bench-quick.json)
  set_tests_properties(bench_quick PROPERTIES
    ENVIRONMENT "FLEXFS_BIN=$<TARGET_FILE:flexfs>"
    LABELS bench
    SKIP_RETURN_CODE 77
    TIMEOUT 600)
endif()
