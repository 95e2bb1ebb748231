// The module kvrope_torch._C. Importing it registers the ops (ops.cpp). Its functions are how the
// Python API (kvrope_torch/__init__.py) calls the ops: each calls its op through the C++ dispatcher,
// so autograd, dispatch modes, fake tensors and the profiler see the call of kvrope::<op> as they do
// from torch.ops, without torch.ops' own argument parsing in Python, about 5 µs a call
// (docs/benchmarks.md, "PyTorch comparison"). What only Python can see (a __torch_function__ mode or
// subclass, torch.compile's tracing) the API sends through torch.ops instead.
//
// Arguments in the schema's order, all positional: a tensor, None for an absent optional one, an int,
// a bool, a float, a str; anything else raises TypeError naming the argument. As torch.ops does, a call
// releases the GIL while the op runs (its Python kernels take it back), and the op's C++ warnings become
// Python warnings before any output is wrapped (a warning that the filters turn into an error then
// leaks nothing).
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <array>
#include <string>
#include <tuple>

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
                       const Optional&, int64_t, int64_t, const Optional&);
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
  const Args a("kvrope.rope_append_", args, n, 22);
  const std::string kv_cache_dtype = a.text(15, "kv_cache_dtype");
  run(call, a.optional(0, "query"), a.tensor(1, "key"), a.tensor(2, "value"), a.tensor(3, "positions"),
      a.tensor(4, "cos_sin_cache"), a.tensor(5, "key_cache"), a.tensor(6, "value_cache"), a.tensor(7, "slot_mapping"),
      a.optional(8, "query_out"), a.optional(9, "key_out"), a.flag(10, "key_in_place"),
      a.optional(11, "query_norm_weight"), a.optional(12, "key_norm_weight"), a.real(13, "norm_eps"),
      a.flag(14, "norm_weight_plus_one"), c10::string_view(kv_cache_dtype), a.optional(16, "k_scale"),
      a.optional(17, "v_scale"), a.optional(18, "error_flag"), a.integer(19, "rotary_dim"), a.integer(20, "style"),
      a.optional(21, "q_scale"));
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

#define KVROPE_FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))
PyMethodDef methods[] = {
    {"forward", KVROPE_FASTCALL(forward), METH_FASTCALL, "kvrope::forward through the dispatcher"},
    {"forward_", KVROPE_FASTCALL(forward_), METH_FASTCALL, "kvrope::forward_ through the dispatcher"},
    {"backward", KVROPE_FASTCALL(backward), METH_FASTCALL, "kvrope::backward through the dispatcher"},
    {"backward_", KVROPE_FASTCALL(backward_), METH_FASTCALL, "kvrope::backward_ through the dispatcher"},
    {"rope_append_", KVROPE_FASTCALL(rope_append_), METH_FASTCALL, "kvrope::rope_append_ through the dispatcher"},
    {nullptr, nullptr, 0, nullptr}};
#undef KVROPE_FASTCALL

}  // namespace
}  // namespace kvrope_torch

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kvrope_torch::methods};
  return PyModule_Create(&module);
}
