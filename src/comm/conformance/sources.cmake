# The collective conformance suite (`deepinfer check collectives`), part of deepinfer_comm.
# Included by src/comm/CMakeLists.txt.
list(APPEND DEEPINFER_COMM_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/conformance.cpp
  ${CMAKE_CURRENT_LIST_DIR}/patterns.cpp)
