// The C shims' side of aotpack's integer kernels: reading AOTInductor's tensor handles through torch's
// stable C API (torch/csrc/inductor/aoti_torch/c/shim.h) and allocating the output. AOTInductor checks
// nothing it passes, so every shape, dtype and stride is checked here, and a mismatch returns an error
// code (AOTInductor raises it as a RuntimeError) rather than reading out of bounds.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <vector>

#include "quant_common.h"

namespace aotpack {

struct Operand {
  void* data = nullptr;
  int32_t dtype = -1;  // torch's code (aoti_torch_dtype_*)
  int32_t kind = -1;   // Dtype, for the activation dtypes
  int64_t rows = 0, cols = 0, ld = 0, numel = 0;
  bool dense = false;  // contiguous row-major
};

// `handle` as a matrix: its last dimension the columns, every other dimension flattened into rows, which
// must sit `ld` elements apart (any row-major view of a matrix does; a transposed one is refused).
inline bool operand(AtenTensorHandle handle, Operand* o) {
  int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
  if (aoti_torch_get_dim(handle, &dim) || aoti_torch_get_sizes(handle, &sizes) ||
      aoti_torch_get_strides(handle, &strides) || aoti_torch_get_dtype(handle, &o->dtype) ||
      aoti_torch_get_data_ptr(handle, &o->data) || dim < 1)
    return false;
  int32_t device = -1;
  if (aoti_torch_get_device_type(handle, &device) || device != aoti_torch_device_type_cpu()) return false;
  o->cols = sizes[dim - 1];
  o->rows = 1;
  for (int64_t i = 0; i + 1 < dim; i++) o->rows *= sizes[i];
  o->numel = o->rows * o->cols;
  // ld: the stride of the innermost leading dimension that has more than one row; every outer one must
  // continue it (dimensions of size 1 have any stride: a (1, 1, K) view of a bigger buffer is common).
  bool rowwise = o->cols <= 1 || strides[dim - 1] == 1;
  int64_t ld = -1, expected = -1;
  for (int64_t i = dim - 2; i >= 0 && rowwise; i--) {
    if (sizes[i] == 1) continue;
    if (ld < 0) {
      ld = strides[i];
      expected = ld * sizes[i];
      continue;
    }
    rowwise = strides[i] == expected;
    expected *= sizes[i];
  }
  o->ld = ld < 0 ? o->cols : ld;
  if (!rowwise || (o->rows > 1 && o->ld < o->cols)) return false;
  o->dense = o->ld == o->cols;
  if (o->dtype == aoti_torch_dtype_float32()) o->kind = F32;
  else if (o->dtype == aoti_torch_dtype_bfloat16()) o->kind = BF16;
  else if (o->dtype == aoti_torch_dtype_float16()) o->kind = F16;
  return true;
}

// A Tensor[] argument's `len` handles (AOTInductor passes a pointer and a length) as operands; false for
// none, more than MAX_PARTS, or any that `operand` refuses.
inline bool operands(const AtenTensorHandle* handles, int64_t len, Operand* out) {
  if (len < 1 || len > MAX_PARTS) return false;
  for (int64_t i = 0; i < len; i++)
    if (!operand(handles[i], &out[i])) return false;
  return true;
}

// What each weight's tensor in one of a cat shim's operand lists must be: `dtype`, dense, and N rows of
// K / `fields` columns (fields > 0), N rows of one column a group (fields == 0), or N elements (fields < 0:
// int8's scales), N being the weight's rows in the first list and K x's columns.
struct Rule {
  int32_t dtype;
  int64_t fields;
};

// A cat shim's L operand lists (lens[l] handles each) checked weight by weight against x, the group size and
// `rules`: each list's data pointers (data[l][p]), every weight's N and their sum; false for lists of
// different lengths, or anything the kernel would misread.
template <size_t L>
bool cat_operands(const Operand& xo, const AtenTensorHandle* const (&lists)[L], const int64_t (&lens)[L],
                  const Rule (&rules)[L], int64_t group, const void* (&data)[L][MAX_PARTS], int64_t* N,
                  int64_t* total) {
  Operand o[L][MAX_PARTS];
  for (size_t l = 0; l < L; l++)
    if (lens[l] != lens[0] || !operands(lists[l], lens[l], o[l])) return false;
  *total = 0;
  for (int64_t p = 0; p < lens[0]; p++) {
    N[p] = o[0][p].rows, *total += N[p];
    for (size_t l = 0; l < L; l++) {
      const Operand& t = o[l][p];
      const int64_t fields = rules[l].fields, K = xo.cols;
      const bool shaped = fields < 0   ? t.numel == N[p]
                          : fields > 0 ? t.rows == N[p] && t.cols * fields == K
                                       : t.rows == N[p] && t.cols == K / group;
      if (t.dtype != rules[l].dtype || !t.dense || !shaped) return false;
      data[l][p] = t.data;
    }
  }
  return true;
}

// The output: x's leading shape, then N; x's dtype; contiguous.
inline bool output(AtenTensorHandle x, const Operand& xo, int64_t N, AtenTensorHandle* ret, void** data) {
  if (xo.kind < 0) return false;
  int64_t dim = 0, *sizes = nullptr;
  if (aoti_torch_get_dim(x, &dim) || aoti_torch_get_sizes(x, &sizes)) return false;
  std::vector<int64_t> shape(sizes, sizes + dim), strides(size_t(dim), 1);
  shape[size_t(dim - 1)] = N;
  for (int64_t i = dim - 2; i >= 0; i--) strides[size_t(i)] = strides[size_t(i + 1)] * shape[size_t(i + 1)];
  if (aoti_torch_empty_strided(dim, shape.data(), strides.data(), xo.dtype, aoti_torch_device_type_cpu(), 0, ret))
    return false;
  return aoti_torch_get_data_ptr(*ret, data) == AOTI_TORCH_SUCCESS;
}

// Allocates the output, runs `kernel(out)` (a Status), and frees the output again if it fails.
template <class F> AOTITorchError run_shim(AtenTensorHandle x, const Operand& xo, int64_t N, AtenTensorHandle* ret, F kernel) {
  void* out = nullptr;
  if (!output(x, xo, N, ret, &out)) return AOTI_TORCH_FAILURE;
  if (kernel(out) != OK) {
    aoti_torch_delete_tensor_object(*ret);
    return AOTI_TORCH_FAILURE;
  }
  return AOTI_TORCH_SUCCESS;
}

}  // namespace aotpack
