#include "backend/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "backend/ops.h"

namespace moonrun::cuda {

namespace {

std::string nccl_error(ncclResult_t r, const char* what) { return std::string(what) + ": " + ncclGetErrorString(r); }

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void bind_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void all_reduce_sum(float* data, size_t n) override {
    check(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void all_gather(const float* in, size_t n, float* out) override {
    check(ncclAllGather(in, out, n, ncclFloat32, comm_, stream_), "ncclAllGather");
  }
  void broadcast(float* data, size_t n, int root) override {
    check(ncclBroadcast(data, data, n, ncclFloat32, root, comm_, stream_), "ncclBroadcast");
  }
  void abort(const std::string& why) override {
    if (aborted_) return;
    aborted_ = true;
    std::fprintf(stderr, "aborting the NCCL communicator of rank %d: %s\n", rank_, why.c_str());
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (aborted_) throw BackendError(std::string(what) + ": the parallel group was aborted");
    if (r != ncclSuccess) throw BackendError(nccl_error(r, what));
  }

  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

std::string NcclUniqueId::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    s += digits[u >> 4];
    s += digits[u & 15];
  }
  return s;
}

Result<NcclUniqueId> NcclUniqueId::from_hex(const std::string& hex) {
  NcclUniqueId id;
  if (hex.size() != id.bytes.size() * 2) return invalid_argument("a NCCL unique id is 256 hex digits");
  auto val = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<char>(val(hex[2 * i]) * 16 + val(hex[2 * i + 1]));
  return id;
}

Result<NcclUniqueId> nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == 128, "NCCL's unique id is 128 bytes");
  ncclUniqueId raw;
  const ncclResult_t r = ncclGetUniqueId(&raw);
  if (r != ncclSuccess) return unavailable(nccl_error(r, "ncclGetUniqueId"));
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &raw, sizeof raw);
  return id;
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_comms(const NcclUniqueId& id, int size, int first_rank,
                                                                   const std::vector<int>& devices) {
  ncclUniqueId raw;
  std::memcpy(&raw, id.bytes.data(), sizeof raw);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  ncclResult_t r = ncclGroupStart();
  for (size_t i = 0; i < devices.size() && r == ncclSuccess; ++i) {
    if (cudaSetDevice(devices[i]) != cudaSuccess) {
      (void)cudaGetLastError();
      ncclGroupEnd();
      return failed_precondition("NCCL: CUDA device " + std::to_string(devices[i]) + " cannot be selected");
    }
    r = ncclCommInitRank(&comms[i], size, raw, first_rank + static_cast<int>(i));
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  if (r != ncclSuccess)
    return unavailable(nccl_error(r, "creating the NCCL communicators") +
                       " (NCCL_DEBUG=INFO says more; every rank must use the same unique id)");
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclComm>(comms[i], first_rank + static_cast<int>(i), size));
  return out;
}

}  // namespace moonrun::cuda
