# SPDX-License-Identifier: MIT
# Loading the CUDA backend: a stub of libflexfs-cuda.so drives the
# loader's fallbacks (missing library, no device, driver error, ABI) on
# machines without a GPU; the real object too when it was built.
add_library(flx_stub_cuda MODULE unit/stub_cuda.c)
target_include_directories(flx_stub_cuda PRIVATE ${PROJECT_SOURCE_DIR}/gpu)
flx_unit(test_gpu_load flx_gpu)
if(TARGET flexfs-cuda)
  set(flx_real_cuda "$<TARGET_FILE:flexfs-cuda>")
  add_dependencies(test_gpu_load flexfs-cuda)
else()
  set(flx_real_cuda "")
endif()
add_dependencies(test_gpu_load flx_stub_cuda)
# its content depends on the build (the real CUDA object where built):
# the full build runs it again (tools/test.sh)
set_tests_properties(test_gpu_load PROPERTIES LABELS features)
target_compile_definitions(test_gpu_load PRIVATE
  "STUB_PATH=\"$<TARGET_FILE:flx_stub_cuda>\""
  "CUDA_PATH=\"${flx_real_cuda}\"")
