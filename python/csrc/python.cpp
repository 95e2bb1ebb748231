// The module kvrope_torch._C. Importing it registers the ops (ops.cpp). Its functions are how the
// Python API (kvrope_torch/__init__.py) calls the ops: each calls its op through the C++ dispatcher,
// so autograd, dispatch modes, fake tensors and the profiler see the call of kvrope::<op> as they do
// from torch.ops, without torch.ops' own argument parsing in Python, about 5 µs a call
// (docs/benchmarks.md, "PyTorch comparison"). What only Python can see (a __torch_function__ mode or
// subclass, torch.compile's tracing) the API sends through torch.ops instead.
//
// Arguments in the schema's order, all positional: a tensor, None for an absent optional one, an int,
// a bool, a float, a str, a list (or tuple) of ints; anything else raises TypeError naming the argument.
// As torch.ops does, a call releases the GIL while the op runs (its Python kernels take it back), and the
// op's C++ warnings become
// Python warnings before any output is wrapped (a warning that the filters turn into an error then
// leaks nothing).
//
// check_forward, check_forward_, check_backward, check_append and check_mla_append take an op's arguments as
// above and run only its checks (checks.cpp), for the CPU and fake implementations (_ops.py).
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <array>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops.h"

namespace kvrope_torch {
namespace {

using Tensor = at::Tensor;
using Optional = c10::optional<at::Tensor>;

// A call's arguments, read by position; a wrong one throws TypeError (translated by HANDLE_TH_ERRORS).
class Args {
 public:
  Args(const char* op, PyObject* const* args, Py_ssize_t n, Py_ssize_t expected) : op_(op), args_(args) {
    if (n != expected)
      throw torch::TypeError(std::string(op) + " takes " + std::to_string(expected) + " arguments, not " +
                             std::to_string(n));
  }
  const Tensor& tensor(int i, const char* name) const {
    if (!THPVariable_Check(args_[i])) fail(i, name, "a tensor");
    return THPVariable_Unpack(args_[i]);
  }
  Optional optional(int i, const char* name) const {
    return args_[i] == Py_None ? Optional() : Optional(tensor(i, name));
  }
  int64_t integer(int i, const char* name) const {
    if (!PyLong_Check(args_[i]) || PyBool_Check(args_[i])) fail(i, name, "an int");
    const long long v = PyLong_AsLongLong(args_[i]);
    if (v == -1 && PyErr_Occurred()) throw python_error();  // beyond int64: OverflowError
    return v;
  }
  bool flag(int i, const char* name) const {
    if (!PyBool_Check(args_[i])) fail(i, name, "a bool");
    return args_[i] == Py_True;
  }
  double real(int i, const char* name) const {  // a float or an int, as torch.ops takes a schema's float
    if (!PyFloat_Check(args_[i]) && (!PyLong_Check(args_[i]) || PyBool_Check(args_[i]))) fail(i, name, "a float");
    const double v = PyFloat_AsDouble(args_[i]);
    if (v == -1.0 && PyErr_Occurred()) throw python_error();
    return v;
  }
  std::vector<int64_t> integers(int i, const char* name) const {  // a list or tuple of ints
    if (!PyList_Check(args_[i]) && !PyTuple_Check(args_[i])) fail(i, name, "a list of ints");
    std::vector<int64_t> out;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(args_[i]); ++k) {
      PyObject* x = PySequence_Fast_GET_ITEM(args_[i], k);
      if (!PyLong_Check(x) || PyBool_Check(x))
        throw torch::TypeError(std::string(op_) + ": " + name + " must be a list of ints, not one holding " +
                               Py_TYPE(x)->tp_name);
      out.push_back(PyLong_AsLongLong(x));
      if (out.back() == -1 && PyErr_Occurred()) throw python_error();  // beyond int64: OverflowError
    }
    return out;
  }
  std::string text(int i, const char* name) const {
    if (!PyUnicode_Check(args_[i])) fail(i, name, "a str");
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(args_[i], &size);
    if (data == nullptr) throw python_error();
    return std::string(data, static_cast<size_t>(size));
  }

 private:
  [[noreturn]] void fail(int i, const char* name, const char* what) const {
    throw torch::TypeError(std::string(op_) + ": " + name + " must be " + what + ", not " + Py_TYPE(args_[i])->tp_name);
  }
  const char* op_;
  PyObject* const* args_;
};

struct GilReleased {  // as torch.ops runs an op: other Python threads go on meanwhile
  PyThreadState* state = PyEval_SaveThread();
  ~GilReleased() { PyEval_RestoreThread(state); }
};

template <typename... Ts>
PyObject* wrap(const std::tuple<Ts...>& outs) {  // a new tuple; throws python_error with the error set
  const auto xs = std::apply([](const auto&... x) { return std::array<const Tensor*, sizeof...(Ts)>{&x...}; }, outs);
  THPObjectPtr t(PyTuple_New(sizeof...(Ts)));
  if (!t) throw python_error();
  for (size_t i = 0; i < xs.size(); ++i) {
    PyObject* x = THPVariable_Wrap(*xs[i]);
    if (x == nullptr) throw python_error();
    PyTuple_SET_ITEM(t.get(), i, x);
  }
  return t.release();
}

// Calls the op: the GIL released, its warnings raised (or turned into errors) on return, before the
// caller wraps what it returns.
template <typename Signature, typename... Ts>
auto run(const c10::TypedOperatorHandle<Signature>& op, const Ts&... args) {
  torch::PyWarningHandler warnings;
  try {
    const GilReleased released;
    return op.call(args...);
  } catch (...) {
    warnings.set_in_exception();  // (its destructor must not throw while this propagates)
    throw;
  }
}

using Tensors3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensors4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using Tensors6 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using ForwardSig = Tensors3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, int64_t, int64_t);
using ForwardInPlaceSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Optional&, const Optional&, const Optional&, const Optional&, const Optional&,
                               const Optional&, const Optional&, const Optional&, int64_t, int64_t);
using AppendSig = void(const Optional&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Optional&, const Optional&, bool, const Optional&,
                       const Optional&, double, bool, c10::string_view, const Optional&, const Optional&,
                       const Optional&, int64_t, int64_t, const Optional&, bool, c10::IntArrayRef, bool,
                       const Optional&, const Optional&);
using MlaAppendSig = void(const Optional&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Optional&, const Optional&, const Optional&, c10::string_view,
                          const Optional&, const Optional&, const Optional&, int64_t, bool);
template <typename Out>
using BackwardSig = Out(const Tensor&, const Tensor&, const Optional&, const Tensor&, const Tensor&, const Tensor&,
                        int64_t, int64_t, bool);

PyObject* forward(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  static const auto call = typed_op<ForwardSig>("kvrope::forward");
  const Args a("kvrope.forward", args, n, 9);
  return wrap(run(call, a.tensor(0, "key_states"), a.tensor(1, "value_states"), a.tensor(2, "key_cache"),
                  a.tensor(3, "value_cache"), a.tensor(4, "cache_position"), a.tensor(5, "cos"), a.tensor(6, "sin"),
                  a.integer(7, "rotary_dim"), a.integer(8, "style")));
  END_HANDLE_TH_ERRORS
}

PyObject* forward_(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  static const auto call = typed_op<ForwardInPlaceSig>("kvrope::forward_");
  const Args a("kvrope.forward_", args, n, 15);
  run(call, a.tensor(0, "key_states"), a.tensor(1, "value_states"), a.tensor(2, "key_cache"),
      a.tensor(3, "value_cache"), a.tensor(4, "cache_position"), a.optional(5, "cos"), a.optional(6, "sin"),
      a.optional(7, "cos_sin_cache"), a.optional(8, "position_ids"), a.optional(9, "query"),
      a.optional(10, "query_out"), a.optional(11, "key_out"), a.optional(12, "error_flag"), a.integer(13, "rotary_dim"),
      a.integer(14, "style"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* rope_append_(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  static const auto call = typed_op<AppendSig>("kvrope::rope_append_");
  const Args a("kvrope.rope_append_", args, n, 27);
  const std::string kv_cache_dtype = a.text(15, "kv_cache_dtype");
  const std::vector<int64_t> mrope_section = a.integers(23, "mrope_section");
  run(call, a.optional(0, "query"), a.tensor(1, "key"), a.tensor(2, "value"), a.tensor(3, "positions"),
      a.tensor(4, "cos_sin_cache"), a.tensor(5, "key_cache"), a.tensor(6, "value_cache"), a.tensor(7, "slot_mapping"),
      a.optional(8, "query_out"), a.optional(9, "key_out"), a.flag(10, "key_in_place"),
      a.optional(11, "query_norm_weight"), a.optional(12, "key_norm_weight"), a.real(13, "norm_eps"),
      a.flag(14, "norm_weight_plus_one"), c10::string_view(kv_cache_dtype), a.optional(16, "k_scale"),
      a.optional(17, "v_scale"), a.optional(18, "error_flag"), a.integer(19, "rotary_dim"), a.integer(20, "style"),
      a.optional(21, "q_scale"), a.flag(22, "enable_pdl"), c10::IntArrayRef(mrope_section),
      a.flag(24, "mrope_interleaved"), a.optional(25, "key_cache_sf"), a.optional(26, "value_cache_sf"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* mla_append_(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  static const auto call = typed_op<MlaAppendSig>("kvrope::mla_append_");
  const Args a("kvrope.mla_append_", args, n, 16);
  const std::string kv_cache_dtype = a.text(10, "kv_cache_dtype");
  run(call, a.optional(0, "query_pe"), a.tensor(1, "kv_c"), a.tensor(2, "k_pe"), a.tensor(3, "positions"),
      a.tensor(4, "cos_sin_cache"), a.tensor(5, "latent_cache"), a.tensor(6, "slot_mapping"),
      a.optional(7, "rope_cache"), a.optional(8, "query_nope"), a.optional(9, "query_out"),
      c10::string_view(kv_cache_dtype), a.optional(11, "kv_scale"), a.optional(12, "q_scale"),
      a.optional(13, "error_flag"), a.integer(14, "style"), a.flag(15, "enable_pdl"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

template <typename Out>
PyObject* backward_any(const char* schema, const char* name, PyObject* const* args, Py_ssize_t n) {
  static const auto call = typed_op<BackwardSig<Out>>(schema);
  const Args a(name, args, n, 9);
  return wrap(run(call, a.tensor(0, "grad_key_cache"), a.tensor(1, "grad_value_cache"), a.optional(2, "key_states"),
                  a.tensor(3, "cos"), a.tensor(4, "sin"), a.tensor(5, "cache_position"), a.integer(6, "rotary_dim"),
                  a.integer(7, "style"), a.flag(8, "table_grads")));
}

PyObject* backward(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  return backward_any<Tensors6>("kvrope::backward", "kvrope.backward", args, n);
  END_HANDLE_TH_ERRORS
}

PyObject* backward_(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  return backward_any<Tensors4>("kvrope::backward_", "kvrope.backward_", args, n);
  END_HANDLE_TH_ERRORS
}

// --- the checks alone: kvrope_torch._C.check_<op>, the ops' arguments as above --------------------------
// The CPU and fake ops (_ops.py) check with the CUDA ops' checks (checks.cpp): one copy, one set of messages.
// A tensor of symbolic sizes (torch.compile's dynamic shapes, in a fake op) cannot give the sizes they
// read: its call is not checked at its trace (the op checks it when it runs).

template <typename... Ts>
bool symbolic(const Ts&... xs) {
  auto one = [](const auto& x) {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, Optional>) {
      return x.has_value() && x->unsafeGetTensorImpl()->has_symbolic_sizes_strides();
    } else {
      return x.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
    }
  };
  return (one(xs) || ...);
}

bool symbolic(const ForwardTensors& t) {
  return symbolic(t.key_states, t.value_states, t.key_cache, t.value_cache, t.cache_position, t.cos, t.sin,
                  t.cos_sin_cache, t.position_ids, t.query, t.query_out, t.key_out, t.error_flag);
}

// kvrope::forward's checks; None.
PyObject* check_forward_functional(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const Args a("kvrope.forward", args, n, 9);
  ForwardTensors t{a.tensor(0, "key_states"),  a.tensor(1, "value_states"),   a.tensor(2, "key_cache"),
                   a.tensor(3, "value_cache"), a.tensor(4, "cache_position"), a.tensor(5, "cos"),
                   a.tensor(6, "sin")};
  t.rotary_dim = a.integer(7, "rotary_dim");
  t.style = a.integer(8, "style");
  if (!symbolic(t)) check_forward(t);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// kvrope::forward_'s checks; None.
PyObject* check_forward_inplace(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const Args a("kvrope.forward_", args, n, 15);
  const ForwardTensors t{a.tensor(0, "key_states"),    a.tensor(1, "value_states"),    a.tensor(2, "key_cache"),
                         a.tensor(3, "value_cache"),   a.tensor(4, "cache_position"),  a.optional(5, "cos"),
                         a.optional(6, "sin"),         a.optional(7, "cos_sin_cache"), a.optional(8, "position_ids"),
                         a.optional(9, "query"),       a.optional(10, "query_out"),    a.optional(11, "key_out"),
                         a.optional(12, "error_flag"), a.integer(13, "rotary_dim"),    a.integer(14, "style")};
  if (!symbolic(t)) check_forward(t);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// kvrope::backward's and backward_'s checks; None.
PyObject* check_backward_any(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const Args a("kvrope.backward", args, n, 9);
  const Tensor &gk = a.tensor(0, "grad_key_cache"), &gv = a.tensor(1, "grad_value_cache"), &cos = a.tensor(3, "cos"),
               &sin = a.tensor(4, "sin"), &pos = a.tensor(5, "cache_position");
  const Optional key_states = a.optional(2, "key_states");
  const int64_t rotary_dim = a.integer(6, "rotary_dim"), style = a.integer(7, "style");
  const bool table_grads = a.flag(8, "table_grads");
  if (!symbolic(gk, gv, key_states, cos, sin, pos))
    check_backward(gk, gv, key_states, cos, sin, pos, rotary_dim, style, table_grads);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// kvrope::rope_append_'s checks (its arguments but enable_pdl); the caches' type, an int (CacheType: 0 the
// query's dtype, 1 fp8 e4m3, 2 fp8 e5m2, 3 NVFP4), or None where not checked.
PyObject* check_append_any(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const Args a("kvrope.rope_append_", args, n, 26);
  AppendTensors t;
  t.query = a.optional(0, "query");
  t.key = a.tensor(1, "key");
  t.value = a.tensor(2, "value");
  t.positions = a.tensor(3, "positions");
  t.cos_sin_cache = a.tensor(4, "cos_sin_cache");
  t.key_cache = a.tensor(5, "key_cache");
  t.value_cache = a.tensor(6, "value_cache");
  t.slot_mapping = a.tensor(7, "slot_mapping");
  t.query_out = a.optional(8, "query_out");
  t.key_out = a.optional(9, "key_out");
  t.key_in_place = a.flag(10, "key_in_place");
  t.query_norm_weight = a.optional(11, "query_norm_weight");
  t.key_norm_weight = a.optional(12, "key_norm_weight");
  t.norm_eps = a.real(13, "norm_eps");
  t.norm_weight_plus_one = a.flag(14, "norm_weight_plus_one");
  t.kv_cache_dtype = a.text(15, "kv_cache_dtype");
  t.k_scale = a.optional(16, "k_scale");
  t.v_scale = a.optional(17, "v_scale");
  t.error_flag = a.optional(18, "error_flag");
  t.rotary_dim = a.integer(19, "rotary_dim");
  t.style = a.integer(20, "style");
  t.q_scale = a.optional(21, "q_scale");
  t.mrope_section = a.integers(22, "mrope_section");
  t.mrope_interleaved = a.flag(23, "mrope_interleaved");
  t.key_cache_sf = a.optional(24, "key_cache_sf");
  t.value_cache_sf = a.optional(25, "value_cache_sf");
  if (symbolic(t.query, t.key, t.value, t.positions, t.cos_sin_cache, t.key_cache, t.value_cache, t.slot_mapping,
               t.query_out, t.key_out, t.query_norm_weight, t.key_norm_weight, t.k_scale, t.v_scale, t.error_flag,
               t.q_scale, t.key_cache_sf, t.value_cache_sf))
    Py_RETURN_NONE;
  return PyLong_FromLong(static_cast<long>(check_append(t)));
  END_HANDLE_TH_ERRORS
}

// kvrope::mla_append_'s checks (its arguments but enable_pdl); the caches' type as check_append's (0, 1 or 2),
// or None where not checked.
PyObject* check_mla_append_any(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const Args a("kvrope.mla_append_", args, n, 15);
  MlaTensors t;
  t.query_pe = a.optional(0, "query_pe");
  t.kv_c = a.tensor(1, "kv_c");
  t.k_pe = a.tensor(2, "k_pe");
  t.positions = a.tensor(3, "positions");
  t.cos_sin_cache = a.tensor(4, "cos_sin_cache");
  t.latent_cache = a.tensor(5, "latent_cache");
  t.slot_mapping = a.tensor(6, "slot_mapping");
  t.rope_cache = a.optional(7, "rope_cache");
  t.query_nope = a.optional(8, "query_nope");
  t.query_out = a.optional(9, "query_out");
  t.kv_cache_dtype = a.text(10, "kv_cache_dtype");
  t.kv_scale = a.optional(11, "kv_scale");
  t.q_scale = a.optional(12, "q_scale");
  t.error_flag = a.optional(13, "error_flag");
  t.style = a.integer(14, "style");
  if (symbolic(t.query_pe, t.kv_c, t.k_pe, t.positions, t.cos_sin_cache, t.latent_cache, t.slot_mapping, t.rope_cache,
               t.query_nope, t.query_out, t.kv_scale, t.q_scale, t.error_flag))
    Py_RETURN_NONE;
  return PyLong_FromLong(static_cast<long>(check_mla_append(t)));
  END_HANDLE_TH_ERRORS
}

#define KVROPE_FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))
PyMethodDef methods[] = {
    {"forward", KVROPE_FASTCALL(forward), METH_FASTCALL, "kvrope::forward through the dispatcher"},
    {"forward_", KVROPE_FASTCALL(forward_), METH_FASTCALL, "kvrope::forward_ through the dispatcher"},
    {"backward", KVROPE_FASTCALL(backward), METH_FASTCALL, "kvrope::backward through the dispatcher"},
    {"backward_", KVROPE_FASTCALL(backward_), METH_FASTCALL, "kvrope::backward_ through the dispatcher"},
    {"rope_append_", KVROPE_FASTCALL(rope_append_), METH_FASTCALL, "kvrope::rope_append_ through the dispatcher"},
    {"mla_append_", KVROPE_FASTCALL(mla_append_), METH_FASTCALL, "kvrope::mla_append_ through the dispatcher"},
    {"check_forward", KVROPE_FASTCALL(check_forward_functional), METH_FASTCALL, "kvrope::forward's checks"},
    {"check_forward_", KVROPE_FASTCALL(check_forward_inplace), METH_FASTCALL, "kvrope::forward_'s checks"},
    {"check_backward", KVROPE_FASTCALL(check_backward_any), METH_FASTCALL, "kvrope::backward(_)'s checks"},
    {"check_append", KVROPE_FASTCALL(check_append_any), METH_FASTCALL,
     "kvrope::rope_append_'s checks; the caches' type (0 the query's dtype, 1 fp8 e4m3, 2 fp8 e5m2, 3 NVFP4)"},
    {"check_mla_append", KVROPE_FASTCALL(check_mla_append_any), METH_FASTCALL,
     "kvrope::mla_append_'s checks; the caches' type (0 kv_c's dtype, 1 fp8 e4m3, 2 fp8 e5m2)"},
    {nullptr, nullptr, 0, nullptr}};
#undef KVROPE_FASTCALL

}  // namespace
}  // namespace kvrope_torch

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kvrope_torch::methods};
  return PyModule_Create(&module);
}
