// Products of a few rows of input by a weight matrix, as an MLX primitive: one row through
// BLAS's matrix-vector product (cblas_sgemv), two to kMaxRows rows through the kernel below.
// worker/engine/matvec.py says why, builds this file and routes to it.
//
// MLX's CPU backend sends every float32 matmul to cblas_sgemm. OpenBLAS's sgemm packs the
// weight matrix before it multiplies, so for a few rows the weights cross memory more than once,
// where these stream each weight once.

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>

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

}  // namespace

NB_MODULE(_matvec, m) {
  m.def("matvec", &matvec, nb::arg("row"), nb::arg("weight"));
}
