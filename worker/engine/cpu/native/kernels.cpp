// The worker's native MLX primitives on the CPU, in one module built once
// (worker/engine/cpu/matvec.py builds, checks and loads it):
// - `matvec`: products of a few rows of input by a weight matrix: one row through BLAS's
//   matrix-vector product (cblas_sgemv), two to kMaxRows rows through the kernel below.
//   worker/engine/cpu/matvec.py says why and routes to it. MLX's CPU backend sends every
//   float32 matmul to cblas_sgemm. OpenBLAS's sgemm packs the weight matrix before it
//   multiplies, so for a few rows the weights cross memory more than once, where these stream
//   each weight once.
// - `decode_attention`: a decode step's attention over 8-bit quantized keys and values, read
//   straight from their codes. worker/engine/cpu/quantized_attention.py says why and routes
//   to it.

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

// cblas_sgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)
using Sgemv = void (*)(int, int, int, int, float, const float*, int, const float*, int, float,
                       float*, int);
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;

// The most rows the kernel takes (matvec.py routes up to 6: from about 8, sgemm's packing pays).
constexpr int kMaxRows = 8;

// Whichever BLAS the process has loaded (a preloaded OpenBLAS, else MLX's own), found once.
Sgemv sgemv() {
  static Sgemv found = reinterpret_cast<Sgemv>(dlsym(RTLD_DEFAULT, "cblas_sgemv"));
  return found;
}

// Eight floats: the compiler maps it to one AVX register (two NEON ones on ARM).
typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// y[m + i, n + j] for i < R, j < 4: R rows of x by 4 rows of w, each w vector loaded once for
// the R rows (R x 4 accumulators stay in registers).
template <int R>
void tile(const float* x, const float* w, float* y, int n_all, int k_all, int m, int n) {
  const float* wr[4];
  for (int j = 0; j < 4; ++j) wr[j] = w + static_cast<size_t>(n + j) * k_all;
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + static_cast<size_t>(m + i) * k_all;
  v8 acc[R][4] = {};
  int k = 0;
  for (; k + 8 <= k_all; k += 8) {
    v8 q0 = load8(wr[0] + k), q1 = load8(wr[1] + k), q2 = load8(wr[2] + k), q3 = load8(wr[3] + k);
    for (int i = 0; i < R; ++i) {
      v8 a = load8(xr[i] + k);
      acc[i][0] += a * q0;
      acc[i][1] += a * q1;
      acc[i][2] += a * q2;
      acc[i][3] += a * q3;
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < 4; ++j) {
      float s = 0;
      for (int lane = 0; lane < 8; ++lane) s += acc[i][j][lane];
      for (int kk = k; kk < k_all; ++kk) s += xr[i][kk] * wr[j][kk];
      y[static_cast<size_t>(m + i) * n_all + n + j] = s;
    }
  }
}

// Rows [n0, n1) of w (n1 - n0 a multiple of 4, or the end) against all `rows` rows of x.
void rows_range(const float* x, const float* w, float* y, int rows, int n_all, int k_all, int n0,
                int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) {
    int m = 0;
    for (; m + 4 <= rows; m += 4) tile<4>(x, w, y, n_all, k_all, m, n);
    switch (rows - m) {
      case 3: tile<3>(x, w, y, n_all, k_all, m, n); break;
      case 2: tile<2>(x, w, y, n_all, k_all, m, n); break;
      case 1: tile<1>(x, w, y, n_all, k_all, m, n); break;
      default: break;
    }
  }
  for (; n < n1; ++n) {
    for (int m = 0; m < rows; ++m) {
      const float* a = x + static_cast<size_t>(m) * k_all;
      const float* b = w + static_cast<size_t>(n) * k_all;
      float s = 0;
      for (int k = 0; k < k_all; ++k) s += a[k] * b[k];
      y[static_cast<size_t>(m) * n_all + n] = s;
    }
  }
}

// The weight's rows in blocks of kBlock, taken by the OpenMP threads as they come free: a
// thread that the host preempts (the next step's graph is built meanwhile) holds up nothing.
constexpr int kBlock = 64;

void few_rows(const float* x, const float* w, float* y, int rows, int n_all, int k_all) {
  int blocks = (n_all + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int b = 0; b < blocks; ++b) {
    rows_range(x, w, y, rows, n_all, k_all, b * kBlock, std::min(n_all, (b + 1) * kBlock));
  }
}

class FewRowsTimesWeight : public mx::UnaryPrimitive {
 public:
  explicit FewRowsTimesWeight(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& row = inputs[0];
    const mx::array& weight = inputs[1];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(row);
    encoder.set_input_array(weight);
    encoder.set_output_array(out);
    int n = weight.shape(0);
    int k = weight.shape(1);
    int rows = static_cast<int>(row.size() / k);
    encoder.dispatch([x = row.data<float>(), w = weight.data<float>(), y = out.data<float>(), n,
                      k, rows]() {
      if (rows == 1) {
        sgemv()(kRowMajor, kNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
      } else {
        few_rows(x, w, y, rows, n, k);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("matvec: CPU only");
  }

  const char* name() const override { return "FewRowsTimesWeight"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }
};

// `row` ([..., k], 1 to kMaxRows rows) times `weight.T` ([n, k]): what `row @ weight.T` gives.
mx::array matvec(const mx::array& row, const mx::array& weight) {
  if (row.dtype() != mx::float32 || weight.dtype() != mx::float32 || weight.ndim() != 2 ||
      row.ndim() == 0 || row.shape(-1) != weight.shape(1) ||
      row.size() > static_cast<size_t>(kMaxRows) * weight.shape(1)) {
    throw std::invalid_argument("matvec: 1 to 8 float32 rows [..., k] and a float32 weight [n, k]");
  }
  if (sgemv() == nullptr) {
    throw std::runtime_error("matvec: no cblas_sgemv in this process");
  }
  mx::Stream stream = mx::default_stream(mx::Device::cpu);
  mx::Shape shape = row.shape();
  shape.back() = weight.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<FewRowsTimesWeight>(stream),
                   {mx::contiguous(row, false, stream), mx::contiguous(weight, false, stream)});
}


// ---- A decode step's attention over 8-bit codes ----
//
// A quantized position of one head is, group by group, `scale * codes + bias`, so a query's
// score against it is `scale * (query . codes) + bias * sum(query)` per group, and the weighted
// sum of values is `sum_p (w_p * scale_p) * codes_p + sum_p w_p * bias_p`. The codes are turned
// into floats eight at a time in registers: no float copy of the keys or values is written, so
// the step reads a quarter of the bytes float KV takes.

constexpr int kMaxRepeat = 16;  // query heads per KV head the kernel takes
constexpr int kMaxDim = 256;    // head dimension the kernel takes

typedef unsigned char u8x8 __attribute__((vector_size(8)));

inline v8 codes8(const uint8_t* p) {
  u8x8 c;
  std::memcpy(&c, p, sizeof(c));
  return __builtin_convertvector(c, v8);
}

inline float sum8(v8 v) {
  float s = 0;
  for (int lane = 0; lane < 8; ++lane) s += v[lane];
  return s;
}

// Element (b, h, p, i) of a [rows, heads, positions, n] array at
// data + b * row + h * head + p * pos + i * inner (strides in elements).
template <typename T>
struct Strided {
  const T* data;
  int64_t row, head, pos, inner;
  const T* at(int b, int h, int p) const { return data + b * row + h * head + p * pos; }
};

template <typename T>
Strided<T> strided(const T* data, const mx::Strides& s) {
  return {data, s[0], s[1], s[2], s[3]};
}

// One call's inputs, read inside the dispatched task.
struct Attend {
  const float* queries;  // [b, heads, 1, dim], row-contiguous
  Strided<uint8_t> key_codes, value_codes;  // bytes; `inner` is 1 (packed if it was not)
  Strided<float> key_scales, key_biases, value_scales, value_biases;
  const bool* mask;  // [b or 1, 1, 1, positions], row-contiguous; nullptr: every position
  int64_t mask_row;  // positions, or 0 for one mask for every row
  float* out;        // [b, heads, 1, dim]
  int heads, kv_heads, positions, dim, group_size;
  float scale;
};

// The scores of one row's `repeat` query heads (scaled) against every position of KV head h;
// masked positions get -inf. `q` holds the scaled queries, `qsum` their sums per group.
void head_scores(const Attend& a, int b, int h, int repeat, const float (*q)[kMaxDim],
                 const float (*qsum)[kMaxDim / 8], float* scores) {
  int groups = a.dim / a.group_size;
  int vectors = a.group_size / 8;
  const bool* allowed = a.mask ? a.mask + b * a.mask_row : nullptr;
  for (int p = 0; p < a.positions; ++p) {
    if (allowed && !allowed[p]) {
      for (int r = 0; r < repeat; ++r) scores[r * a.positions + p] = -INFINITY;
      continue;
    }
    const uint8_t* codes = a.key_codes.at(b, h, p);
    const float* scales = a.key_scales.at(b, h, p);
    const float* biases = a.key_biases.at(b, h, p);
    float s[kMaxRepeat] = {};
    for (int g = 0; g < groups; ++g) {
      v8 acc[kMaxRepeat] = {};
      for (int v = 0; v < vectors; ++v) {
        int i = g * a.group_size + v * 8;
        v8 k = codes8(codes + i);
        for (int r = 0; r < repeat; ++r) acc[r] += k * load8(q[r] + i);
      }
      float scale = scales[g * a.key_scales.inner], bias = biases[g * a.key_biases.inner];
      for (int r = 0; r < repeat; ++r) s[r] += scale * sum8(acc[r]) + bias * qsum[r][g];
    }
    for (int r = 0; r < repeat; ++r) scores[r * a.positions + p] = s[r];
  }
}

// Each query head's scores turned into weights in place (not yet divided by their sum: the
// output is, once); the sums. A row whose positions are all masked gets weights 0, sum 1.
void exponentiate(float* scores, int positions, int repeat, float* sums) {
  for (int r = 0; r < repeat; ++r) {
    float* s = scores + r * positions;
    float top = -INFINITY;
    for (int p = 0; p < positions; ++p) top = std::max(top, s[p]);
    float sum = 0;
    if (top == -INFINITY) {
      std::fill(s, s + positions, 0.0f);
    } else {
      for (int p = 0; p < positions; ++p) {
        s[p] = std::exp(s[p] - top);
        sum += s[p];
      }
    }
    sums[r] = sum > 0 ? sum : 1.0f;
  }
}

// out[r] = sum_p weights[r][p] * value_p / sums[r], the values read from their codes.
void weighted_values(const Attend& a, int b, int h, int repeat, const float* weights,
                     const float* sums) {
  int groups = a.dim / a.group_size;
  int vectors = a.group_size / 8;
  v8 acc[kMaxRepeat][kMaxDim / 8] = {};
  float bias_acc[kMaxRepeat][kMaxDim / 8] = {};
  const bool* allowed = a.mask ? a.mask + b * a.mask_row : nullptr;
  for (int p = 0; p < a.positions; ++p) {
    if (allowed && !allowed[p]) continue;  // weight 0
    const uint8_t* codes = a.value_codes.at(b, h, p);
    const float* scales = a.value_scales.at(b, h, p);
    const float* biases = a.value_biases.at(b, h, p);
    for (int g = 0; g < groups; ++g) {
      float scale = scales[g * a.value_scales.inner], bias = biases[g * a.value_biases.inner];
      float ws[kMaxRepeat];
      for (int r = 0; r < repeat; ++r) {
        float w = weights[r * a.positions + p];
        ws[r] = w * scale;
        bias_acc[r][g] += w * bias;
      }
      for (int v = 0; v < vectors; ++v) {
        int j = (g * a.group_size) / 8 + v;
        v8 c = codes8(codes + j * 8);
        for (int r = 0; r < repeat; ++r) acc[r][j] += ws[r] * c;
      }
    }
  }
  for (int r = 0; r < repeat; ++r) {
    float* out = a.out + (static_cast<int64_t>(b) * a.heads + h * repeat + r) * a.dim;
    float inverse = 1.0f / sums[r];
    for (int i = 0; i < a.dim; ++i) {
      out[i] = (acc[r][i / 8][i % 8] + bias_acc[r][i / a.group_size]) * inverse;
    }
  }
}

// Row b, KV head h: its `repeat` query heads' attention.
void attend_head(const Attend& a, int b, int h, std::vector<float>& scores) {
  int repeat = a.heads / a.kv_heads;
  float q[kMaxRepeat][kMaxDim];
  float qsum[kMaxRepeat][kMaxDim / 8] = {};
  for (int r = 0; r < repeat; ++r) {
    const float* src = a.queries + (static_cast<int64_t>(b) * a.heads + h * repeat + r) * a.dim;
    for (int i = 0; i < a.dim; ++i) {
      q[r][i] = src[i] * a.scale;
      qsum[r][i / a.group_size] += q[r][i];
    }
  }
  scores.resize(static_cast<size_t>(repeat) * a.positions);
  head_scores(a, b, h, repeat, q, qsum, scores.data());
  float sums[kMaxRepeat];
  exponentiate(scores.data(), a.positions, repeat, sums);
  weighted_values(a, b, h, repeat, scores.data(), sums);
}

// Every (row, KV head) in turn, on the calling thread (MLX's CPU stream), not in OpenMP
// threads as the products are: between a step's products OpenBLAS's threads spin on both cores,
// and a parallel region waits for whichever of its threads the host preempts. Measured on the
// default model, 16 rows of 2,000 positions, median decode step (2 cores, load about 2.5): in
// OpenMP threads 376 ms, on one thread 275 ms, float KV 369 ms.
void attend(const Attend& a, int rows) {
  std::vector<float> scores;
  for (int b = 0; b < rows; ++b) {
    for (int h = 0; h < a.kv_heads; ++h) attend_head(a, b, h, scores);
  }
}

// A codes array's bytes, strided; its last axis packed into `spare` first if it is not
// contiguous (MLX's slices of the KV buffers keep it contiguous: this is a safeguard).
struct Codes {
  const uint32_t* data;
  mx::Shape shape;
  mx::Strides strides;
};

Strided<uint8_t> code_bytes(const Codes& c, std::vector<uint32_t>& spare) {
  const mx::Shape& n = c.shape;
  mx::Strides s = c.strides;
  const uint32_t* data = c.data;
  if (n[3] > 1 && s[3] != 1) {
    spare.resize(static_cast<size_t>(n[0]) * n[1] * n[2] * n[3]);
    size_t k = 0;
    for (int i = 0; i < n[0]; ++i)
      for (int j = 0; j < n[1]; ++j)
        for (int p = 0; p < n[2]; ++p)
          for (int w = 0; w < n[3]; ++w)
            spare[k++] = data[i * s[0] + j * s[1] + p * s[2] + w * s[3]];
    data = spare.data();
    s = {int64_t{n[1]} * n[2] * n[3], int64_t{n[2]} * n[3], n[3], 1};
  }
  return {reinterpret_cast<const uint8_t*>(data), s[0] * 4, s[1] * 4, s[2] * 4, 1};
}

class QuantizedDecodeAttention : public mx::UnaryPrimitive {
 public:
  QuantizedDecodeAttention(mx::Stream stream, float scale, int group_size)
      : mx::UnaryPrimitive(stream), scale_(scale), group_size_(group_size) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& input : inputs) encoder.set_input_array(input);
    encoder.set_output_array(out);
    const mx::array& q = inputs[0];
    bool masked = inputs.size() == 8;
    Attend a{};
    a.queries = q.data<float>();
    a.key_scales = strided(inputs[2].data<float>(), inputs[2].strides());
    a.key_biases = strided(inputs[3].data<float>(), inputs[3].strides());
    a.value_scales = strided(inputs[5].data<float>(), inputs[5].strides());
    a.value_biases = strided(inputs[6].data<float>(), inputs[6].strides());
    a.mask = masked ? inputs[7].data<bool>() : nullptr;
    a.mask_row = masked && inputs[7].shape(0) > 1 ? inputs[7].shape(3) : 0;
    a.out = out.data<float>();
    a.heads = q.shape(1);
    a.kv_heads = inputs[1].shape(1);
    a.positions = inputs[1].shape(2);
    a.dim = q.shape(3);
    a.group_size = group_size_;
    a.scale = scale_;
    Codes keys{inputs[1].data<uint32_t>(), inputs[1].shape(), inputs[1].strides()};
    Codes values{inputs[4].data<uint32_t>(), inputs[4].shape(), inputs[4].strides()};
    encoder.dispatch([a, keys, values, rows = q.shape(0)]() mutable {
      std::vector<uint32_t> spare_keys, spare_values;
      a.key_codes = code_bytes(keys, spare_keys);
      a.value_codes = code_bytes(values, spare_values);
      attend(a, rows);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("decode_attention: CPU only");
  }

  const char* name() const override { return "QuantizedDecodeAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedDecodeAttention&>(other);
    return scale_ == o.scale_ && group_size_ == o.group_size_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float scale_;
  int group_size_;
};

void check_triple(const mx::array& codes, const mx::array& scales, const mx::array& biases,
                  int rows, int kv_heads, int positions, int dim, int group_size) {
  mx::Shape packed = {rows, kv_heads, positions, dim / 4};
  mx::Shape per_group = {rows, kv_heads, positions, dim / group_size};
  if (codes.dtype() != mx::uint32 || codes.shape() != packed || scales.dtype() != mx::float32 ||
      scales.shape() != per_group || biases.dtype() != mx::float32 ||
      biases.shape() != per_group) {
    throw std::invalid_argument(
        "decode_attention: 8-bit codes [b, kv heads, positions, dim / 4] (uint32) and float32 "
        "scales and biases [b, kv heads, positions, dim / group_size]");
  }
}

// Scaled dot-product attention of one query position per row, `queries` [b, heads, 1, dim]
// (float32), over 8-bit `mx.quantize` triples of keys and values [b, kv heads, positions, ...]
// (grouped-query heads: query head i reads KV head i / (heads / kv heads)); `mask`: None, or
// booleans [b or 1, 1, 1, positions] (true: attend). What quantized_attention.py computes.
mx::array decode_attention(const mx::array& queries, const mx::array& key_codes,
                           const mx::array& key_scales, const mx::array& key_biases,
                           const mx::array& value_codes, const mx::array& value_scales,
                           const mx::array& value_biases, float scale, int group_size,
                           const std::optional<mx::array>& mask) {
  if (queries.dtype() != mx::float32 || queries.ndim() != 4 || queries.shape(2) != 1 ||
      key_codes.ndim() != 4) {
    throw std::invalid_argument("decode_attention: float32 queries [b, heads, 1, dim]");
  }
  int rows = queries.shape(0), heads = queries.shape(1), dim = queries.shape(3);
  int kv_heads = key_codes.shape(1), positions = key_codes.shape(2);
  if (kv_heads == 0 || heads % kv_heads || heads / kv_heads > kMaxRepeat || dim > kMaxDim ||
      group_size <= 0 || group_size % 8 || dim % group_size) {
    throw std::invalid_argument("decode_attention: heads, head dimension or group size");
  }
  check_triple(key_codes, key_scales, key_biases, rows, kv_heads, positions, dim, group_size);
  check_triple(value_codes, value_scales, value_biases, rows, kv_heads, positions, dim,
               group_size);
  mx::Stream stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs = {mx::contiguous(queries, false, stream), key_codes, key_scales,
                                   key_biases, value_codes, value_scales, value_biases};
  if (mask) {
    const mx::array& m = *mask;
    if (m.dtype() != mx::bool_ || m.ndim() != 4 || (m.shape(0) != 1 && m.shape(0) != rows) ||
        m.shape(1) != 1 || m.shape(2) != 1 || m.shape(3) != positions) {
      throw std::invalid_argument("decode_attention: a boolean mask [b or 1, 1, 1, positions]");
    }
    inputs.push_back(mx::contiguous(m, false, stream));
  }
  return mx::array(queries.shape(), mx::float32,
                   std::make_shared<QuantizedDecodeAttention>(stream, scale, group_size),
                   std::move(inputs));
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.def("matvec", &matvec, nb::arg("row"), nb::arg("weight"));
  m.def("decode_attention", &decode_attention, nb::arg("queries"), nb::arg("key_codes"),
        nb::arg("key_scales"), nb::arg("key_biases"), nb::arg("value_codes"),
        nb::arg("value_scales"), nb::arg("value_biases"), nb::arg("scale"),
        nb::arg("group_size"), nb::arg("mask") = nb::none());
}
