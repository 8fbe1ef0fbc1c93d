#pragma once
// The one place for the serving defaults that several layers would otherwise each pick
// (the server's flags, the engine's limits, `generate`, the benchmarks).
namespace moonrun::defaults {

inline constexpr int kMaxRunningRequests = 64;      // sequences in a step (--max-running-requests)
inline constexpr int kChunkedPrefillTokens = 8192;  // token budget per step (--chunked-prefill-size)
inline constexpr int kPageSizeTokens = 16;          // tokens per KV page (--page-size)
inline constexpr int kMaxQueuedRequests = 1024;     // waiting requests before 503 (--max-queued-requests)
inline constexpr double kCudaMemFractionStatic = 0.88;  // of the GPU: weights + caches (+ scratch)
inline constexpr double kCpuMemFractionStatic = 0.05;   // of available RAM: the CPU caches
inline constexpr int kPrefixBlockTokens = 256;      // prefix-cache snapshot granularity
inline constexpr double kDistTimeoutSeconds = 60;   // a node silent this long is gone (--dist-timeout)

}  // namespace moonrun::defaults
