# Ops-B unit tests (host vs closed forms / hand-computed values / fp64, plus properties).
set(DEEPINFER_KERNELS_B_TESTS
  test_elementwise_b_host.cpp
  test_rope_b_host.cpp
  test_attention_b_host.cpp
  test_router_b_host.cpp
  test_sampling_b_host.cpp)
