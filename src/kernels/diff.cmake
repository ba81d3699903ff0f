# `deepinfer diff` core (issue 6): the comparison recorder, ranking and EP merge, built into
# deepinfer_kernels. Included (OPTIONAL) at the end of src/kernels/CMakeLists.txt.
target_sources(deepinfer_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/diff/diff_recorder.cpp)
