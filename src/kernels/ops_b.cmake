# Ops B (norm, rope, swiglu, attention, router, sampling): dispatchers, host reference, cpu SIMD.
# Read by src/kernels/CMakeLists.txt; paths relative to src/kernels.
set(DEEPINFER_KERNELS_B_SOURCES
  norm.cpp host/norm.cpp cpu/norm.cpp
  rope.cpp host/rope.cpp cpu/rope.cpp
  swiglu.cpp host/swiglu.cpp cpu/swiglu.cpp
  attention.cpp host/attention.cpp cpu/attention.cpp
  router.cpp host/router.cpp cpu/router.cpp
  sampling.cpp host/sampling.cpp cpu/sampling.cpp)
set(DEEPINFER_KERNELS_B_TESTING_SOURCES
  testing/cases_norm.cpp testing/cases_attention.cpp testing/cases_router.cpp)
