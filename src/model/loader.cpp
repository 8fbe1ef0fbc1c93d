#include "model/loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "common/dtype.h"
#include "common/log.h"

namespace moonrun {

namespace {

// Elements moved per read: 8 Mi elements is 16-32 MiB of source and as much converted.
constexpr int64_t kChunkElements = int64_t{8} << 20;

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

// n elements of `from` at src -> `to` at dst (a float conversion, or a copy).
void convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size_bytes(from));
    return;
  }
  auto load = [&](int64_t i) -> float {
    if (from == DType::F32) {
      float f;
      std::memcpy(&f, static_cast<const char*>(src) + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(src) + 2 * i, 2);
    return from == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  };
  if (to == DType::F32) {
    float* out = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = load(i);
  } else {
    MR_CHECK(to == DType::BF16) << "weights are held in F32 or BF16, not " << dtype_name(to);
    uint16_t* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(load(i));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct WeightLoader::Impl {
  Ops& ops;
  const Checkpoint& ckpt;
  const ModelConfig& cfg;
  LoadOptions options;
  TensorNames names;
  Status error = Status::ok();
  std::map<std::string, int> fds;            // open shard files, by path
  std::vector<char> staging, converted;      // the bounded host buffers
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double last_progress_s = 0;
  uint64_t total_bytes = 0;

  Impl(Ops& o, const Checkpoint& c, const ModelConfig& m, const LoadOptions& opt)
      : ops(o), ckpt(c), cfg(m), options(opt), names(m) {}
  ~Impl() {
    for (auto& [path, fd] : fds) ::close(fd);
  }

  bool ok() const { return error.is_ok(); }
  void fail(Status st) {
    if (error.is_ok()) error = std::move(st);
  }

  // The stored tensor, checked against what the listing expects. Float tensors may be stored
  // in any float dtype (test checkpoints keep fp32 everywhere); integer tensors must match.
  const TensorInfo* tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    auto stored = ckpt.get(name);
    if (!stored) return fail(stored.status()), nullptr;
    DType want_dtype = dtype;
    if (is_float_dtype(dtype) && is_float_dtype((*stored)->dtype)) want_dtype = (*stored)->dtype;
    std::vector<int64_t> want_shape = shape;
    const TensorSpec spec{name, dtype, shape};
    if ((*stored)->shape != shape && is_alternative_shape(spec, (*stored)->shape)) want_shape = (*stored)->shape;
    auto checked = ckpt.get(name, want_dtype, want_shape);
    if (!checked) return fail(checked.status()), nullptr;
    return *checked;
  }

  // Bytes [offset, offset + n) of a stored tensor into dst.
  bool read(const TensorInfo* t, uint64_t offset, size_t n, void* dst, LoadStats& stats) {
    auto it = fds.find(t->file);
    if (it == fds.end()) {
      const int fd = ::open(t->file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return fail(data_loss(t->file + ": cannot open: " + std::strerror(errno))), false;
      it = fds.emplace(t->file, fd).first;
    }
    char* p = static_cast<char*>(dst);
    uint64_t pos = t->offset_bytes + offset;
    while (n > 0) {
      const ssize_t got = ::pread(it->second, p, n, static_cast<off_t>(pos));
      if (got <= 0) {
        return fail(data_loss(t->file + ": reading tensor " + t->name + " failed at byte " + std::to_string(pos) +
                              ": " + (got == 0 ? std::string("unexpected end of file") : std::strerror(errno)))),
               false;
      }
      p += got;
      pos += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
      stats.bytes_read += static_cast<uint64_t>(got);
    }
    return true;
  }

  // Elements [first, first + n) of a stored tensor (dtype `t->dtype`) -> dst tensor elements
  // from dst_first, converted to dst's dtype, through the staging buffers.
  void stream(const TensorInfo* t, int64_t first, int64_t n, const Tensor& dst, int64_t dst_first,
              LoadStats& stats) {
    const size_t src_size = dtype_size_bytes(t->dtype), dst_size = dtype_size_bytes(dst.dtype);
    while (n > 0 && ok()) {
      const int64_t m = std::min(n, kChunkElements);
      staging.resize(static_cast<size_t>(kChunkElements) * 4);
      if (!read(t, static_cast<uint64_t>(first) * src_size, static_cast<size_t>(m) * src_size, staging.data(), stats))
        return;
      const void* host = staging.data();
      if (t->dtype != dst.dtype) {
        converted.resize(static_cast<size_t>(kChunkElements) * 4);
        convert(staging.data(), t->dtype, converted.data(), dst.dtype, m);
        host = converted.data();
      }
      ops.upload(dst, static_cast<size_t>(dst_first) * dst_size, host, static_cast<size_t>(m) * dst_size);
      first += m;
      dst_first += m;
      n -= m;
      progress(stats);
    }
  }

  // Rows [r0, r1) and columns [c0, c1) of a stored [rows, cols] tensor into dst [r1-r0, c1-c0]
  // starting at element dst_first of dst.
  void stream_block(const TensorInfo* t, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                    const Tensor& dst, LoadStats& stats, int64_t dst_first = 0) {
    if (c0 == 0 && c1 == cols) return stream(t, r0 * cols, (r1 - r0) * cols, dst, dst_first, stats);
    for (int64_t r = r0; r < r1 && ok(); ++r)
      stream(t, r * cols + c0, c1 - c0, dst, dst_first + (r - r0) * (c1 - c0), stats);
  }

  // This rank's part of a [rows, cols] tensor under `rule` (weight_spec.h: the same
  // function `plan` counts with).
  bool shard_range(const std::string& name, ShardRule rule, int64_t rows, int64_t cols, int64_t& r0, int64_t& r1,
                   int64_t& c0, int64_t& c1) {
    auto b = dense_shard(name, rule, rows, cols, ParallelRank{options.rank, options.world_size, options.ep_size, options.dp_attention});
    if (!b.is_ok()) return fail(b.status()), false;
    r0 = b->r0, r1 = b->r1, c0 = b->c0, c1 = b->c1;
    return true;
  }

  void progress(LoadStats& stats) {
    if (!options.log_progress) return;
    const double s = seconds_since(t0);
    if (s - last_progress_s < 2.0) return;
    last_progress_s = s;
    const double gb = stats.bytes_read / 1e9, rate = s > 0 ? gb / s : 0;
    std::string line = "Loading weights: " + fmt(gb);
    if (total_bytes > 0) {
      const double total_gb = total_bytes / 1e9;
      const double eta = rate > 0 ? (total_gb - gb) / rate : 0;
      line += " / " + fmt(total_gb) + " GB (" + fmt(100.0 * gb / total_gb) + "%), " + fmt(rate) + " GB/s, ETA " +
              fmt(eta) + " s";
    } else {
      line += " GB, " + fmt(rate) + " GB/s";
    }
    MR_LOG(INFO) << line;
  }
  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
  }
};

WeightLoader::WeightLoader(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& options)
    : impl_(new Impl(ops, ckpt, cfg, options)) {
  stats_.staging_bytes = static_cast<size_t>(kChunkElements) * 4 * 2;
}

WeightLoader::~WeightLoader() { delete impl_; }

void WeightLoader::set_total_bytes(uint64_t bytes) { impl_->total_bytes = bytes; }

void WeightLoader::matrix(Matrix& dst, const std::string& name, int out, int in, ShardRule rule) {
  Impl& m = *impl_;
  if (!m.ok()) return;
  const TensorInfo* t = m.tensor(name, DType::BF16, {out, in});
  int64_t r0, r1, c0, c1;
  if (!t || !m.shard_range(name, rule, out, in, r0, r1, c0, c1)) return;
  try {
    dst.w = m.ops.alloc(r1 - r0, c1 - c0, m.ops.weight_dtype(), name.c_str());
    dst.out = static_cast<int>(r1 - r0);
    dst.in = static_cast<int>(c1 - c0);
    m.stream_block(t, in, r0, r1, c0, c1, dst.w, stats_);
  } catch (const BackendError& e) {
    m.fail(resource_exhausted(std::string("loading ") + name + ": " + e.what()));
  }
}

void WeightLoader::f32(Tensor& dst, const std::string& name, DType stored, const std::vector<int64_t>& shape,
                       int64_t rows, int64_t cols, ShardRule rule) {
  Impl& m = *impl_;
  if (!m.ok()) return;
  const TensorInfo* t = m.tensor(name, stored, shape);
  int64_t r0, r1, c0, c1;
  if (!t || !m.shard_range(name, rule, rows, cols, r0, r1, c0, c1)) return;
  try {
    dst = m.ops.alloc(r1 - r0, c1 - c0, DType::F32, name.c_str());
    m.stream_block(t, cols, r0, r1, c0, c1, dst, stats_);
  } catch (const BackendError& e) {
    m.fail(resource_exhausted(std::string("loading ") + name + ": " + e.what()));
  }
}

void WeightLoader::experts(ExpertMatrices& dst, int layer, ExpertMatrix which, int num_experts, int out, int in) {
  Impl& m = *impl_;
  if (!m.ok()) return;
  // SGLang's layout: the W ranks form ep_size expert groups of W / ep_size ranks; a group
  // holds num_experts / ep_size whole experts, and its ranks split each expert's
  // intermediate dimension (w1, w3: output rows; w2: input columns), as tensor parallelism
  // splits a dense MLP.
  const int W = m.options.world_size, ep = std::max(1, m.options.ep_size);
  const std::string where = "layer " + std::to_string(layer) + ": ";
  if (W % ep != 0) {
    m.fail(invalid_argument("--ep-size " + std::to_string(ep) + " must divide the " + std::to_string(W) + " ranks"));
    return;
  }
  if (num_experts % ep != 0) {
    m.fail(invalid_argument(where + std::to_string(num_experts) + " experts do not split evenly over " +
                            std::to_string(ep) + " expert-parallel groups"));
    return;
  }
  const ParallelRank pr{m.options.rank, W, ep, m.options.dp_attention};  // weight_spec.h: the layout plan counts with
  const int moe_tp = pr.moe_tp(), ep_rank = pr.ep_rank(), moe_tp_rank = pr.moe_tp_rank();
  const int local = num_experts / ep, first = ep_rank * local;
  const bool split_out = which != ExpertMatrix::w2;  // w1, w3: [inter, io] rows; w2: [io, inter] columns
  const int split_extent = split_out ? out : in;
  if (split_extent % moe_tp != 0) {
    m.fail(invalid_argument(where + "the experts' intermediate size " + std::to_string(split_extent) +
                            " does not split over " + std::to_string(moe_tp) +
                            " ranks per expert (--tp-size / --ep-size); use a larger --ep-size"));
    return;
  }
  const int64_t r0 = split_out ? static_cast<int64_t>(moe_tp_rank) * out / moe_tp : 0;
  const int64_t r1 = split_out ? r0 + out / moe_tp : out;
  const int64_t c0 = split_out ? 0 : static_cast<int64_t>(moe_tp_rank) * in / moe_tp;
  const int64_t c1 = split_out ? in : c0 + in / moe_tp;
  const int out_l = static_cast<int>(r1 - r0), in_l = static_cast<int>(c1 - c0);
  const auto parts = expert_parts(m.cfg.expert_quant);
  dst.num_experts = local;
  dst.first_expert = first;
  dst.stacked.out = out_l;
  dst.stacked.in = in_l;
  try {
    const std::string what = m.names.expert(layer, first, which, parts[0]);
    if (m.cfg.expert_quant == ExpertQuant::none) {
      dst.stacked.w = m.ops.alloc(static_cast<int64_t>(local) * out_l, in_l, m.ops.weight_dtype(), what.c_str());
      for (int e = 0; e < local && m.ok(); ++e) {
        const TensorInfo* t = m.tensor(m.names.expert(layer, first + e, which, parts[0]), DType::BF16, {out, in});
        if (t) m.stream_block(t, in, r0, r1, c0, c1, dst.stacked.w, stats_, static_cast<int64_t>(e) * out_l * in_l);
      }
      return;
    }
    const bool int4 = m.cfg.expert_quant == ExpertQuant::int4_g32_sym;
    if (in % 32 != 0 || c0 % 32 != 0 || in_l % 32 != 0) {
      m.fail(invalid_argument(what + (int4 ? ": INT4" : ": MXFP4") + " rows of " + std::to_string(in_l) +
                              " elements per rank (a multiple of 32 is needed: one scale per 32)"));
      return;
    }
    if (int4) {
      // compressed-tensors pack-quantized (backend/cpu/int4.h): the words and bf16 scales as
      // stored, sharded exactly as MXFP4's codes and scales (eight values per word).
      dst.stacked.format = WeightFormat::int4_g32_sym;
      dst.stacked.w = m.ops.alloc(static_cast<int64_t>(local) * out_l, in_l / 8, DType::I32, what.c_str());
      dst.stacked.scales = m.ops.alloc(static_cast<int64_t>(local) * out_l, in_l / 32, DType::BF16, what.c_str());
      for (int e = 0; e < local && m.ok(); ++e) {
        const TensorInfo* words = m.tensor(m.names.expert(layer, first + e, which, parts[0]), DType::I32, {out, in / 8});
        const TensorInfo* scales =
            m.tensor(m.names.expert(layer, first + e, which, parts[1]), DType::BF16, {out, in / 32});
        const std::string shape_name = m.names.expert(layer, first + e, which, parts[2]);
        const TensorInfo* shape = m.tensor(shape_name, DType::I64, {2});
        if (!words || !scales || !shape) return;
        int64_t stored_shape[2] = {0, 0};
        if (!m.read(shape, 0, sizeof stored_shape, stored_shape, stats_)) return;
        if (stored_shape[0] != out || stored_shape[1] != in) {
          m.fail(failed_precondition(shape_name + " says [" + std::to_string(stored_shape[0]) + ", " +
                                     std::to_string(stored_shape[1]) + "], expected [" + std::to_string(out) + ", " +
                                     std::to_string(in) + "] (from config.json)"));
          return;
        }
        m.stream_block(words, in / 8, r0, r1, c0 / 8, c1 / 8, dst.stacked.w, stats_,
                       static_cast<int64_t>(e) * out_l * (in_l / 8));
        m.stream_block(scales, in / 32, r0, r1, c0 / 32, c1 / 32, dst.stacked.scales, stats_,
                       static_cast<int64_t>(e) * out_l * (in_l / 32));
      }
      if (m.ok()) m.ops.repack_experts(dst);
      return;
    }
    dst.stacked.format = WeightFormat::mxfp4_g32;
    dst.stacked.w = m.ops.alloc(static_cast<int64_t>(local) * out_l, in_l / 2, DType::U8, what.c_str());
    dst.stacked.scales = m.ops.alloc(static_cast<int64_t>(local) * out_l, in_l / 32, DType::U8, what.c_str());
    const bool gpt_oss = m.cfg.expert_quant == ExpertQuant::mxfp4_gpt_oss;
    const std::vector<int64_t> codes_shape =
        gpt_oss ? std::vector<int64_t>{out, in / 32, 16} : std::vector<int64_t>{out, in / 2};
    for (int e = 0; e < local && m.ok(); ++e) {
      const TensorInfo* codes = m.tensor(m.names.expert(layer, first + e, which, parts[0]), DType::U8, codes_shape);
      const TensorInfo* scales = m.tensor(m.names.expert(layer, first + e, which, parts[1]), DType::U8, {out, in / 32});
      if (!codes || !scales) return;
      // Codes are two per byte, scales one per 32 values: the same block in their units.
      m.stream_block(codes, in / 2, r0, r1, c0 / 2, c1 / 2, dst.stacked.w, stats_,
                     static_cast<int64_t>(e) * out_l * (in_l / 2));
      m.stream_block(scales, in / 32, r0, r1, c0 / 32, c1 / 32, dst.stacked.scales, stats_,
                     static_cast<int64_t>(e) * out_l * (in_l / 32));
    }
    if (m.ok()) m.ops.repack_experts(dst);  // every expert's codes are in place
  } catch (const BackendError& e) {
    m.fail(resource_exhausted("loading the experts of layer " + std::to_string(layer) + ": " + e.what()));
  }
}

Status WeightLoader::finish() {
  stats_.seconds = seconds_since(impl_->t0);
  stats_.bytes_on_backend = impl_->ops.allocated_bytes();
  return impl_->error;
}

}  // namespace moonrun
