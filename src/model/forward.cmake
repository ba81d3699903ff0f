list(APPEND DEEPINFER_MODEL_SOURCES kv_cache.cpp deepseek.cpp)
