// DI_CPU_CLONES: build a loop-heavy function once per CPU level (AVX-512, AVX2, baseline) and
// pick the best at load time (GCC function multiversioning). Off where GCC's resolvers do not
// apply: other compilers, other architectures, and under ASan/TSan.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DI_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DI_CPU_CLONES
#endif
