#include "support/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>

#include "src/cpu/parallel.hpp"

namespace mqa_logits::support {
namespace {

// ---- randomness --------------------------------------------------------------------------------

enum class Stream : std::uint64_t { kQ = 1, kKv, kWeights, kWindows, kLens, kBlocks, kRequests };

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// std::mt19937_64 (fully specified by the standard) seeded per (seed, stream, row), with
// distributions written out in exact arithmetic.
class Rng {
 public:
  Rng(std::uint64_t seed, Stream stream, std::uint64_t row)
      : engine_(splitmix64(splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(stream))) +
                           row)) {}

  // Uniform in [0, 1): the top 53 bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }

  // Uniform integer in [lo, hi] (the modulo bias, below 2^-40 here, does not matter for tests).
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(engine_() % span);
  }

  // Approximately N(0, 1), rounded to a bf16 value: the Irwin-Hall sum of four 16-bit uniforms
  // of one draw, centred and scaled to unit variance (range +-2*sqrt(3)).
  float normal_bf16() {
    const std::uint64_t bits = engine_();
    double sum = 0.0;
    for (int k = 0; k < 4; ++k) sum += (static_cast<double>((bits >> (16 * k)) & 0xffff) + 0.5);
    const double centred = sum * 0x1p-16 - 2.0;  // variance 4/12
    return to_bf16(static_cast<float>(centred * std::sqrt(3.0)));
  }

 private:
  static float to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
  std::mt19937_64 engine_;
};

// ---- buffers -----------------------------------------------------------------------------------

constexpr std::byte kPoison{0xff};  // NaN as e4m3, UE8M0, fp32 and bf16; -1 as int32

HostBuffer make_buffer(std::string name, std::size_t bytes, std::byte fill = std::byte{0}) {
  return {std::move(name), std::vector<std::byte>(bytes, fill)};
}

template <class T>
T* typed(HostBuffer& buffer) {
  return reinterpret_cast<T*>(buffer.bytes.data());
}
template <class T>
std::span<const T> typed_span(const HostBuffer& buffer) {
  return {reinterpret_cast<const T*>(buffer.bytes.data()), buffer.bytes.size() / sizeof(T)};
}

std::int64_t token_bytes_of(Format format, std::int64_t head_dim) {
  return format == Format::kMXFP4 ? head_dim / 2 : head_dim;
}
DType values_dtype(Format format) {
  return format == Format::kMXFP4 ? DType::kUInt8 : DType::kFloat8E4M3;
}
bool has_query_scales(Format format) { return format != Format::kFP8; }
DType key_scales_dtype(Format format) {
  return format == Format::kFP8 ? DType::kFloat32 : DType::kInt32;
}

// Draws `out.size()` bf16-representable normals.
void fill_normal(Rng& rng, std::span<float> out) {
  for (float& x : out) x = rng.normal_bf16();
}

enum class Role : std::uint8_t { kQuery, kKey };

// Quantizes one vector (a query head or a key token) into `codes` and returns the 4 bytes of its
// scale: fp32 for an FP8 key, packed UE8M0 for MX, nothing (0) for an FP8 query, whose scale is
// folded into the weights.
std::uint32_t quantize_vector(Format format, Role role, std::span<const float> x,
                              std::span<std::uint8_t> codes) {
  switch (format) {
    case Format::kFP8: {
      if (role == Role::kQuery) {
        std::transform(x.begin(), x.end(), codes.begin(), encode_e4m3);
        return 0;
      }
      const float scale = quantize_fp8_token(x, codes);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &scale, sizeof(bits));
      return bits;
    }
    case Format::kMXFP8:
      return static_cast<std::uint32_t>(quantize_mxfp8_vector(x, codes));
    case Format::kMXFP4:
      return static_cast<std::uint32_t>(quantize_mxfp4_vector(x, codes));
  }
  throw std::logic_error("unknown format");
}

// Writes `values` into a weights buffer of `dtype`: row r at element r * row_stride.
void store_weights(std::span<const float> values, std::int64_t rows, std::int64_t heads,
                   std::int64_t row_stride, DType dtype, HostBuffer& buffer) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float w = values[r * heads + h];
      if (dtype == DType::kBFloat16) {
        typed<std::uint16_t>(buffer)[r * row_stride + h] = float_to_bf16(w);
      } else {
        typed<float>(buffer)[r * row_stride + h] = w;
      }
    }
  }
}

// Quantized query heads: `rows` x H vectors of D, values into buffers[values_slot] and (MX)
// scales into buffers[scales_slot]; the unquantized values go to q_float.
void make_queries(Format format, std::uint64_t seed, std::int64_t rows, std::int64_t heads,
                  std::int64_t head_dim, std::vector<float>& q_float, HostBuffer& values,
                  HostBuffer& scales) {
  const std::int64_t token_bytes = token_bytes_of(format, head_dim);
  q_float.assign(rows * heads * head_dim, 0.0f);
  cpu::parallel_for(rows, 0, [&](std::int64_t r) {
    Rng rng(seed, Stream::kQ, r);
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t vector = r * heads + h;
      const std::span<float> x(q_float.data() + vector * head_dim, head_dim);
      fill_normal(rng, x);
      const std::uint32_t scale = quantize_vector(
          format, Role::kQuery, x,
          {typed<std::uint8_t>(values) + vector * token_bytes, static_cast<std::size_t>(token_bytes)});
      if (has_query_scales(format)) typed<std::uint32_t>(scales)[vector] = scale;
    }
  });
}

void make_weights(std::uint64_t seed, std::int64_t rows, std::int64_t heads,
                  std::vector<float>& weights_float) {
  weights_float.assign(rows * heads, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    Rng rng(seed, Stream::kWeights, r);
    fill_normal(rng, std::span(weights_float).subspan(r * heads, heads));
  }
}

TensorView view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                Device device) {
  return TensorView::contiguous(data, dtype, shape, device);
}

TensorView logits_view_of(void* data, DType dtype, const OutputLayout& layout, Device device) {
  TensorView v = view(data, dtype, {layout.rows, layout.cols}, device);
  v.strides = {layout.row_stride, 1};
  return v;
}

std::size_t logits_bytes_of(const OutputLayout& layout, DType dtype) {
  return static_cast<std::size_t>(layout.rows * layout.row_stride) * dtype_size(dtype);
}

void require_slots(std::span<void* const> pointers, std::size_t slots) {
  if (pointers.size() != slots) {
    throw std::invalid_argument("workload inputs: expected " + std::to_string(slots) +
                                " pointers, got " + std::to_string(pointers.size()));
  }
}

// ---- prefill windows ---------------------------------------------------------------------------

struct RowWindow {
  std::int32_t start;
  std::int32_t end;
};

RowWindow random_window(Rng& rng, std::int64_t t) {
  const auto key = [&] { return rng.uniform_int(0, t); };
  switch (rng.uniform_int(0, 9)) {
    case 0: {  // empty
      const auto k = key();
      return {static_cast<std::int32_t>(k), static_cast<std::int32_t>(k)};
    }
    case 1: {  // inverted
      const auto k = key();
      return {static_cast<std::int32_t>(k + rng.uniform_int(1, 8)), static_cast<std::int32_t>(k)};
    }
    case 2:  // negative start
      return {static_cast<std::int32_t>(-rng.uniform_int(1, t + 1)),
              static_cast<std::int32_t>(key())};
    case 3:  // end past T
      return {static_cast<std::int32_t>(key()),
              static_cast<std::int32_t>(t + rng.uniform_int(1, t + 1))};
    case 4:
      return {0, static_cast<std::int32_t>(t)};
    default: {
      auto a = key();
      auto b = key();
      if (a > b) std::swap(a, b);
      return {static_cast<std::int32_t>(a), static_cast<std::int32_t>(b)};
    }
  }
}

// The window fields of a spec must fit its kind: what does not is a mistake in the caller, never
// silently ignored.
void check_windows(const PrefillSpec& spec) {
  const bool packed = spec.windows == WindowKind::kPacked;
  if (!packed && !spec.request_lengths.empty()) {
    throw std::invalid_argument(std::string("PrefillSpec::request_lengths: only with packed "
                                            "windows, got ") +
                                window_kind_name(spec.windows) + " windows");
  }
  if (spec.windows != WindowKind::kSliding && spec.sliding_window != 0) {
    throw std::invalid_argument(std::string("PrefillSpec::sliding_window: only with sliding "
                                            "windows, got ") +
                                window_kind_name(spec.windows) + " windows");
  }
  if (spec.windows == WindowKind::kSliding && spec.sliding_window <= 0) {
    throw std::invalid_argument("PrefillSpec::sliding_window: expected at least 1 key with "
                                "sliding windows, got " + std::to_string(spec.sliding_window));
  }
  if (!packed) return;
  std::int64_t total = 0;
  for (const std::int64_t length : spec.request_lengths) {
    if (length < 1) {
      throw std::invalid_argument("PrefillSpec::request_lengths: expected every request to "
                                  "hold at least 1 token, got " + std::to_string(length));
    }
    total += length;
  }
  if (total != spec.seq_len || total != spec.seq_len_kv) {
    throw std::invalid_argument(
        "PrefillSpec::request_lengths: packed requests are both the queries and the keys, so "
        "their sum must equal seq_len and seq_len_kv; got " + std::to_string(total) +
        " tokens in " + std::to_string(spec.request_lengths.size()) + " requests, seq_len " +
        std::to_string(spec.seq_len) + ", seq_len_kv " + std::to_string(spec.seq_len_kv));
  }
}

// The window of row i for the kinds where it depends on i alone (every kind but kPacked).
RowWindow prefill_window(const PrefillSpec& spec, std::int64_t i) {
  const std::int64_t s = spec.seq_len;
  const std::int64_t t = spec.seq_len_kv;
  const auto prefix = [](std::int64_t end) { return RowWindow{0, static_cast<std::int32_t>(end)}; };
  switch (spec.windows) {
    case WindowKind::kCausal:
      return prefix(t - s + i + 1);
    case WindowKind::kFull:
      return prefix(t);
    case WindowKind::kRandom: {
      Rng rng(spec.seed, Stream::kWindows, static_cast<std::uint64_t>(i));
      return random_window(rng, t);
    }
    case WindowKind::kContextParallel: {
      const std::int64_t chunk = std::max<std::int64_t>(s / 2, 1);
      const std::int64_t ranks = std::max<std::int64_t>(t / std::max<std::int64_t>(s, 1), 1);
      const std::int64_t rank = ranks / 3;
      const std::int64_t first_chunk = i < chunk ? rank : 2 * ranks - 1 - rank;
      return prefix(first_chunk * chunk + (i < chunk ? i : i - chunk) + 1);
    }
    case WindowKind::kSliding: {
      const std::int64_t end = t - s + i + 1;
      return {static_cast<std::int32_t>(std::max<std::int64_t>(end - spec.sliding_window, 0)),
              static_cast<std::int32_t>(end)};
    }
    case WindowKind::kPacked:
      break;  // a row's window depends on its request: see fill_windows
  }
  throw std::logic_error("prefill_window: no per-row window for this kind");
}

// k_start and k_end of every row of `spec`, into the workload's buffers.
void fill_windows(const PrefillSpec& spec, HostBuffer& start_buffer, HostBuffer& end_buffer) {
  check_windows(spec);
  std::int32_t* start = typed<std::int32_t>(start_buffer);
  std::int32_t* end = typed<std::int32_t>(end_buffer);
  if (spec.windows == WindowKind::kPacked) {
    std::int64_t first = 0;  // the request's first token: its keys start there
    for (const std::int64_t length : spec.request_lengths) {
      for (std::int64_t i = first; i < first + length; ++i) {
        start[i] = static_cast<std::int32_t>(first);
        end[i] = static_cast<std::int32_t>(i + 1);
      }
      first += length;
    }
    return;
  }
  for (std::int64_t i = 0; i < spec.seq_len; ++i) {
    const RowWindow window = prefill_window(spec, i);
    start[i] = window.start;
    end[i] = window.end;
  }
}

// ---- paged sequences ---------------------------------------------------------------------------

// Per output row: its sequence and the value stored in context_lens for it.
struct PagedRows {
  std::vector<std::int32_t> lens;     // the context_lens tensor ([B] or [B * N])
  std::vector<std::int32_t> indices;  // varlen only: each row's sequence
  std::int64_t sequences = 0;
};

std::int32_t draw_context(Rng& rng, const PagedSpec& spec) {
  const double lo = std::max(0.0, (1.0 - spec.context_jitter) * static_cast<double>(spec.avg_context));
  const double hi = (1.0 + spec.context_jitter) * static_cast<double>(spec.avg_context);
  return static_cast<std::int32_t>(
      rng.uniform_int(static_cast<std::int64_t>(std::llround(lo)), static_cast<std::int64_t>(std::llround(hi))));
}

PagedRows paged_rows(const PagedSpec& spec) {
  PagedRows rows;
  const std::int64_t n = spec.next_n;
  const bool explicit_lens = !spec.explicit_context_lens.empty();
  if (spec.varlen_indices) {
    if (explicit_lens && static_cast<std::int64_t>(spec.explicit_context_lens.size()) != spec.batch) {
      throw std::invalid_argument("PagedSpec::explicit_context_lens: expected batch values");
    }
    // Runs of 1..4 tokens share one sequence; their lengths grow by one like causal tokens.
    Rng rng(spec.seed, Stream::kLens, 0);
    for (std::int64_t r = 0; r < spec.batch;) {
      const std::int64_t run = std::min<std::int64_t>(rng.uniform_int(1, 4), spec.batch - r);
      const std::int32_t base = draw_context(rng, spec);
      for (std::int64_t k = 0; k < run; ++k, ++r) {
        rows.indices.push_back(static_cast<std::int32_t>(rows.sequences));
        rows.lens.push_back(explicit_lens ? spec.explicit_context_lens[r]
                                          : std::max<std::int32_t>(0, base - static_cast<std::int32_t>(run - k - 1)));
      }
      ++rows.sequences;
    }
    return rows;
  }
  rows.sequences = spec.batch;
  if (explicit_lens) {
    const std::int64_t expected = spec.lens_2d ? spec.batch * n : spec.batch;
    if (static_cast<std::int64_t>(spec.explicit_context_lens.size()) != expected) {
      throw std::invalid_argument("PagedSpec::explicit_context_lens: expected " +
                                  std::to_string(expected) + " values");
    }
    rows.lens = spec.explicit_context_lens;
    return rows;
  }
  for (std::int64_t b = 0; b < spec.batch; ++b) {
    Rng rng(spec.seed, Stream::kLens, b);
    const std::int32_t base = draw_context(rng, spec);
    if (!spec.lens_2d) {
      rows.lens.push_back(base);
      continue;
    }
    for (std::int64_t t = 0; t < n; ++t) {
      rows.lens.push_back(std::max<std::int32_t>(0, base - static_cast<std::int32_t>(n - 1 - t)));
    }
  }
  return rows;
}

}  // namespace

// ---- shared helpers ----------------------------------------------------------------------------

std::vector<void*> host_pointers(const std::vector<HostBuffer>& buffers) {
  std::vector<void*> pointers;
  pointers.reserve(buffers.size());
  for (const auto& buffer : buffers) {
    // The library only reads inputs; TensorView carries a mutable pointer for outputs' sake.
    pointers.push_back(const_cast<std::byte*>(buffer.bytes.data()));
  }
  return pointers;
}

double read_logit(const void* logits, DType dtype, const OutputLayout& layout, std::int64_t row,
                  std::int64_t col) {
  const std::int64_t index = row * layout.row_stride + col;
  if (dtype == DType::kBFloat16) {
    return bf16_to_float(static_cast<const std::uint16_t*>(logits)[index]);
  }
  return static_cast<const float*>(logits)[index];
}

const char* window_kind_name(WindowKind kind) {
  switch (kind) {
    case WindowKind::kCausal: return "causal";
    case WindowKind::kRandom: return "random";
    case WindowKind::kFull: return "full";
    case WindowKind::kContextParallel: return "context_parallel";
    case WindowKind::kPacked: return "packed";
    case WindowKind::kSliding: return "sliding";
  }
  return "?";
}

// ---- prefill -----------------------------------------------------------------------------------

PrefillWorkload make_prefill_workload(const PrefillSpec& spec) {
  if (spec.weights_row_stride != 0 && spec.weights_row_stride < spec.num_heads) {
    throw std::invalid_argument("PrefillSpec::weights_row_stride: expected 0 or >= num_heads");
  }
  check_windows(spec);  // before the expensive part
  PrefillWorkload w;
  w.spec = spec;
  const std::int64_t s = spec.seq_len;
  const std::int64_t t = spec.seq_len_kv;
  const std::int64_t h = spec.num_heads;
  const std::int64_t d = spec.head_dim;
  const std::int64_t token_bytes = token_bytes_of(spec.format, d);
  const std::int64_t weights_stride = spec.weights_row_stride > 0 ? spec.weights_row_stride : h;
  const std::size_t weight_size = dtype_size(spec.weights_dtype);

  w.buffers.resize(PrefillWorkload::kNumSlots);
  w.buffers[PrefillWorkload::kQ] = make_buffer("q", s * h * token_bytes);
  w.buffers[PrefillWorkload::kQScales] =
      make_buffer("q_scales", has_query_scales(spec.format) ? s * h * 4 : 0);
  w.buffers[PrefillWorkload::kKv] = make_buffer("kv", t * token_bytes);
  w.buffers[PrefillWorkload::kKvScales] = make_buffer("kv_scales", t * 4);
  w.buffers[PrefillWorkload::kWeights] =
      make_buffer("weights", s * weights_stride * weight_size, kPoison);
  w.buffers[PrefillWorkload::kStart] = make_buffer("k_start", s * 4);
  w.buffers[PrefillWorkload::kEnd] = make_buffer("k_end", s * 4);

  make_queries(spec.format, spec.seed, s, h, d, w.q_float, w.buffers[PrefillWorkload::kQ],
               w.buffers[PrefillWorkload::kQScales]);

  w.kv_float.assign(t * d, 0.0f);
  cpu::parallel_for(t, 0, [&](std::int64_t j) {
    Rng rng(spec.seed, Stream::kKv, j);
    const std::span<float> x(w.kv_float.data() + j * d, d);
    fill_normal(rng, x);
    typed<std::uint32_t>(w.buffers[PrefillWorkload::kKvScales])[j] = quantize_vector(
        spec.format, Role::kKey, x,
        {typed<std::uint8_t>(w.buffers[PrefillWorkload::kKv]) + j * token_bytes,
         static_cast<std::size_t>(token_bytes)});
  });

  make_weights(spec.seed, s, h, w.weights_float);
  store_weights(w.weights_float, s, h, weights_stride, spec.weights_dtype,
                w.buffers[PrefillWorkload::kWeights]);

  fill_windows(spec, w.buffers[PrefillWorkload::kStart], w.buffers[PrefillWorkload::kEnd]);

  w.layout = mqa_logits_output_layout(s, t, spec.max_seqlen_k, spec.logits_dtype);
  return w;
}

void rewrite_windows(PrefillWorkload& workload) {
  const auto rows = static_cast<std::size_t>(workload.spec.seq_len);
  if (workload.buffers[PrefillWorkload::kStart].bytes.size() != rows * sizeof(std::int32_t)) {
    throw std::invalid_argument("rewrite_windows: spec.seq_len differs from the workload's");
  }
  fill_windows(workload.spec, workload.buffers[PrefillWorkload::kStart],
               workload.buffers[PrefillWorkload::kEnd]);
}

std::vector<std::int64_t> uneven_request_lengths(std::int64_t count, std::int64_t total,
                                                 std::uint64_t seed, std::int64_t min_length,
                                                 std::int64_t max_length) {
  if (count < 0 || min_length < 1 || max_length < min_length || total < count * min_length ||
      total > count * max_length) {
    throw std::invalid_argument(
        "uneven_request_lengths: expected 1 <= min_length <= max_length and count * min_length "
        "<= total <= count * max_length; got " + std::to_string(count) + " requests of " +
        std::to_string(min_length) + " to " + std::to_string(max_length) + " tokens, total " +
        std::to_string(total));
  }
  if (count == 0) return {};
  std::int64_t octaves = 1;
  while ((min_length << octaves) < max_length) ++octaves;
  Rng rng(seed, Stream::kRequests, 0);
  std::vector<std::int64_t> lengths(count);
  std::int64_t drawn = 0;
  for (std::int64_t& length : lengths) {
    const std::int64_t lo = min_length << rng.uniform_int(0, octaves - 1);
    length = rng.uniform_int(lo, std::min(max_length, 2 * lo));
    drawn += length;
  }
  std::int64_t left = total;  // tokens not yet given to a request (negative: too many given)
  for (std::int64_t& length : lengths) {
    length = std::clamp(length * total / drawn, min_length, max_length);
    left -= length;
  }
  // Each pass offers every request an equal share of what is left, as far as its bounds allow: a
  // pass that saturates no request settles the rest, so at most count + 1 passes.
  while (left != 0) {
    const std::int64_t share = (std::abs(left) + count - 1) / count;
    for (std::int64_t& length : lengths) {
      const std::int64_t room = left > 0 ? max_length - length : length - min_length;
      const std::int64_t step = std::min({share, room, std::abs(left)});
      length += left > 0 ? step : -step;
      left -= left > 0 ? step : -step;
    }
  }
  return lengths;
}

PrefillInputs PrefillWorkload::inputs(std::span<void* const> p, Device device) const {
  require_slots(p, kNumSlots);
  const std::int64_t s = spec.seq_len;
  const std::int64_t t = spec.seq_len_kv;
  const std::int64_t h = spec.num_heads;
  const std::int64_t token_bytes = token_bytes_of(spec.format, spec.head_dim);
  const DType values = values_dtype(spec.format);

  PrefillInputs in;
  in.q.values = view(p[kQ], values, {s, h, token_bytes}, device);
  if (has_query_scales(spec.format)) in.q.scales = view(p[kQScales], DType::kInt32, {s, h}, device);
  in.kv.values = view(p[kKv], values, {t, token_bytes}, device);
  in.kv.scales = view(p[kKvScales], key_scales_dtype(spec.format), {t}, device);
  in.weights = view(p[kWeights], spec.weights_dtype, {s, h}, device);
  in.weights.strides = {spec.weights_row_stride > 0 ? spec.weights_row_stride : h, 1};
  in.k_start = view(p[kStart], DType::kInt32, {s}, device);
  in.k_end = view(p[kEnd], DType::kInt32, {s}, device);
  in.options.clean_logits = spec.clean_logits;
  in.options.max_seqlen_k = spec.max_seqlen_k;
  return in;
}

PrefillInputs PrefillWorkload::host_inputs() const { return inputs(host_pointers(buffers), {}); }

std::size_t PrefillWorkload::logits_bytes() const {
  return logits_bytes_of(layout, spec.logits_dtype);
}

TensorView PrefillWorkload::logits_view(void* data, Device device) const {
  return logits_view_of(data, spec.logits_dtype, layout, device);
}

std::span<const std::int32_t> PrefillWorkload::k_start() const {
  return typed_span<std::int32_t>(buffers[kStart]);
}
std::span<const std::int32_t> PrefillWorkload::k_end() const {
  return typed_span<std::int32_t>(buffers[kEnd]);
}

// ---- paged -------------------------------------------------------------------------------------

namespace {

void store_context_lens(const PagedRows& rows, PagedWorkload& w) {
  w.buffers[PagedWorkload::kContextLens] = make_buffer("context_lens", rows.lens.size() * 4);
  std::memcpy(w.buffers[PagedWorkload::kContextLens].bytes.data(), rows.lens.data(),
              rows.lens.size() * 4);
}

// Everything sized by the rows (B * N) rather than by the keys: queries, weights, output layout.
void make_paged_queries(PagedWorkload& w) {
  const PagedSpec& spec = w.spec;
  const std::int64_t h = spec.num_heads;
  w.buffers[PagedWorkload::kQ] = make_buffer("q", w.num_rows * h * w.token_bytes);
  w.buffers[PagedWorkload::kQScales] =
      make_buffer("q_scales", has_query_scales(spec.format) ? w.num_rows * h * 4 : 0);
  make_queries(spec.format, spec.seed, w.num_rows, h, spec.head_dim, w.q_float,
               w.buffers[PagedWorkload::kQ], w.buffers[PagedWorkload::kQScales]);

  w.buffers[PagedWorkload::kWeights] =
      make_buffer("weights", w.num_rows * h * dtype_size(spec.weights_dtype));
  make_weights(spec.seed, w.num_rows, h, w.weights_float);
  store_weights(w.weights_float, w.num_rows, h, h, spec.weights_dtype,
                w.buffers[PagedWorkload::kWeights]);

  w.layout = paged_mqa_logits_output_layout(w.num_rows, w.max_context_len, spec.logits_dtype);
}

}  // namespace

PagedWorkload make_paged_workload(const PagedSpec& spec) {
  if (spec.varlen_indices && spec.next_n != 1) {
    throw std::invalid_argument("PagedSpec::next_n: expected 1 with varlen_indices");
  }
  if (spec.extra_block_stride_bytes < 0 || spec.extra_block_stride_bytes % 4 != 0) {
    throw std::invalid_argument("PagedSpec::extra_block_stride_bytes: expected a multiple of 4");
  }
  PagedWorkload w;
  w.spec = spec;
  const std::int64_t n = spec.next_n;
  const std::int64_t d = spec.head_dim;
  const std::int64_t bkv = spec.block_kv;
  w.num_rows = spec.batch * n;
  w.token_bytes = token_bytes_of(spec.format, d);
  w.block_stride_bytes = bkv * (w.token_bytes + 4) + spec.extra_block_stride_bytes;

  const PagedRows rows = paged_rows(spec);
  w.table_rows = spec.batch;
  w.buffers.resize(PagedWorkload::kNumSlots);
  store_context_lens(rows, w);
  w.buffers[PagedWorkload::kIndices] = make_buffer("indices", rows.indices.size() * 4);
  std::memcpy(w.buffers[PagedWorkload::kIndices].bytes.data(), rows.indices.data(),
              rows.indices.size() * 4);

  // Keys each sequence's block-table entries must address: the longest of its rows.
  std::vector<std::int64_t> needed(rows.sequences, 0);
  std::int64_t longest = 0;
  for (std::int64_t r = 0; r < w.num_rows; ++r) {
    const std::int64_t len = std::max<std::int64_t>(0, w.context_length(r));
    needed[w.sequence(r)] = std::max(needed[w.sequence(r)], len);
    longest = std::max(longest, len);
  }
  w.max_context_len = spec.max_context_len > 0 ? spec.max_context_len : longest;

  // Block ids: a random permutation, the first `used` of which are handed out in sequence order,
  // sequence s taking ids [first_id[s], first_id[s] + its blocks).
  std::int64_t used = 0;
  std::vector<std::int64_t> first_id;
  first_id.reserve(needed.size());
  for (const std::int64_t len : needed) {
    const std::int64_t blocks = (len + bkv - 1) / bkv;
    w.max_blocks = std::max(w.max_blocks, blocks);
    first_id.push_back(used);
    used += blocks;
  }
  w.max_blocks = std::max<std::int64_t>(w.max_blocks, 1);
  w.num_blocks = used + used / 4 + 1;
  std::vector<std::int32_t> ids(w.num_blocks);
  for (std::int64_t k = 0; k < w.num_blocks; ++k) ids[k] = static_cast<std::int32_t>(k);
  Rng shuffle_rng(spec.seed, Stream::kBlocks, 0);
  for (std::int64_t k = w.num_blocks - 1; k > 0; --k) {
    std::swap(ids[k], ids[shuffle_rng.uniform_int(0, k)]);
  }
  w.buffers[PagedWorkload::kBlockTable] =
      make_buffer("block_table", w.table_rows * w.max_blocks * 4, kPoison);
  auto* table = typed<std::int32_t>(w.buffers[PagedWorkload::kBlockTable]);
  // A table row per sequence, or per token in the varlen form: its sequence's entries.
  for (std::int64_t row = 0; row < w.table_rows; ++row) {
    const std::int64_t sequence = spec.varlen_indices ? rows.indices[row] : row;
    for (std::int64_t k = 0; k * bkv < needed[sequence]; ++k) {
      table[row * w.max_blocks + k] = ids[first_id[sequence] + k];
    }
  }

  // Fused cache: unused blocks and padding stay poisoned; every slot of a used block gets a key.
  w.buffers[PagedWorkload::kKvCache] =
      make_buffer("kv_cache", w.num_blocks * w.block_stride_bytes, kPoison);
  w.kv_float.assign(w.num_blocks * bkv * d, 0.0f);
  auto* cache = typed<std::uint8_t>(w.buffers[PagedWorkload::kKvCache]);
  cpu::parallel_for(used, 0, [&](std::int64_t u) {
    const std::int64_t block = ids[u];
    std::uint8_t* base = cache + block * w.block_stride_bytes;
    for (std::int64_t slot = 0; slot < bkv; ++slot) {
      Rng rng(spec.seed, Stream::kKv, block * bkv + slot);
      const std::span<float> x(w.kv_float.data() + (block * bkv + slot) * d, d);
      fill_normal(rng, x);
      const std::uint32_t scale = quantize_vector(
          spec.format, Role::kKey, x,
          {base + slot * w.token_bytes, static_cast<std::size_t>(w.token_bytes)});
      std::memcpy(base + bkv * w.token_bytes + slot * 4, &scale, 4);
    }
  });

  make_paged_queries(w);
  return w;
}

void rewrite_next_n(PagedWorkload& workload, std::int64_t next_n) {
  PagedWorkload& w = workload;
  if (w.spec.varlen_indices || !w.spec.explicit_context_lens.empty() || next_n < 1) {
    throw std::invalid_argument(
        "rewrite_next_n: expected generated 2-D or 1-D context lengths and next_n >= 1");
  }
  w.spec.next_n = next_n;
  w.num_rows = w.spec.batch * next_n;
  const PagedRows rows = paged_rows(w.spec);
  store_context_lens(rows, w);
  // Every sequence's longest row is its drawn context whatever next_n is, so the blocks the table
  // hands out (and the cache) stay right; checked rather than assumed.
  const auto table = w.block_table();
  std::int64_t longest = 0;
  for (std::int64_t r = 0; r < w.num_rows; ++r) {
    const std::int64_t len = std::max<std::int64_t>(0, w.context_length(r));
    longest = std::max(longest, len);
    const std::int64_t last_block = (len + w.spec.block_kv - 1) / w.spec.block_kv - 1;
    const bool held = last_block < 0 || (last_block < w.max_blocks &&
                                         table[w.table_row(r) * w.max_blocks + last_block] >= 0);
    if (!held) {
      throw std::logic_error("rewrite_next_n: a row needs a block the table does not hold");
    }
  }
  if (w.spec.max_context_len <= 0) w.max_context_len = longest;
  make_paged_queries(w);
}

PagedInputs PagedWorkload::inputs(std::span<void* const> p, Device device) const {
  require_slots(p, kNumSlots);
  const std::int64_t b = spec.batch;
  const std::int64_t n = spec.next_n;
  const std::int64_t h = spec.num_heads;

  PagedInputs in;
  in.q.values = view(p[kQ], values_dtype(spec.format), {b, n, h, token_bytes}, device);
  if (has_query_scales(spec.format)) in.q.scales = view(p[kQScales], DType::kInt32, {b, n, h}, device);
  in.kv_cache = view(p[kKvCache], DType::kUInt8, {num_blocks, spec.block_kv, 1, token_bytes + 4},
                     device);
  in.kv_cache.strides[0] = block_stride_bytes;
  in.weights = view(p[kWeights], spec.weights_dtype, {num_rows, h}, device);
  const bool lens_2d = spec.lens_2d && !spec.varlen_indices;
  in.context_lens = lens_2d ? view(p[kContextLens], DType::kInt32, {b, n}, device)
                            : view(p[kContextLens], DType::kInt32, {b}, device);
  in.block_table = view(p[kBlockTable], DType::kInt32, {table_rows, max_blocks}, device);
  in.options.clean_logits = spec.clean_logits;
  if (spec.varlen_indices) in.options.indices = view(p[kIndices], DType::kInt32, {b}, device);
  return in;
}

PagedInputs PagedWorkload::host_inputs() const { return inputs(host_pointers(buffers), {}); }

std::size_t PagedWorkload::logits_bytes() const {
  return logits_bytes_of(layout, spec.logits_dtype);
}

TensorView PagedWorkload::logits_view(void* data, Device device) const {
  return logits_view_of(data, spec.logits_dtype, layout, device);
}

std::span<const std::int32_t> PagedWorkload::context_lens() const {
  return typed_span<std::int32_t>(buffers[kContextLens]);
}
std::span<const std::int32_t> PagedWorkload::block_table() const {
  return typed_span<std::int32_t>(buffers[kBlockTable]);
}
std::span<const std::int32_t> PagedWorkload::indices() const {
  return typed_span<std::int32_t>(buffers[kIndices]);
}
const std::uint8_t* PagedWorkload::kv_cache() const {
  return reinterpret_cast<const std::uint8_t*>(buffers[kKvCache].bytes.data());
}

std::int64_t PagedWorkload::table_row(std::int64_t row) const {
  return spec.varlen_indices ? row : row / spec.next_n;
}

std::int64_t PagedWorkload::sequence(std::int64_t row) const {
  return spec.varlen_indices ? indices()[row] : row / spec.next_n;
}

std::int64_t PagedWorkload::context_length(std::int64_t row) const {
  const std::int64_t n = spec.next_n;
  if (spec.lens_2d || spec.varlen_indices) return context_lens()[row];
  return static_cast<std::int64_t>(context_lens()[row / n]) - n + row % n + 1;
}

}  // namespace mqa_logits::support
