"""Builds kvrope_torch: the C++ / CUDA extension over the header-only library in ../include.

    TORCH_CUDA_ARCH_LIST="9.0" python3 -m pip install --no-build-isolation --no-deps python/

torch.utils.cpp_extension (rather than scikit-build-core over the CMake package): the extension is
eleven source files against torch's own headers and flags, so torch's builder is the shortest path,
and it refuses an nvcc whose major version differs from torch's CUDA, which is the check we want.
Without TORCH_CUDA_ARCH_LIST the project's default architectures are built (sm_90 and sm_100a)."""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
include = os.path.normpath(os.path.join(here, "..", "include"))
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0a")
# The host code's optimization (nvcc's -O leaves the device code as it is): KVROPE_TORCH_HOST_OPT=-O1 builds in
# about half the time (.ci/run), for tests rather than use.
host_opt = os.environ.get("KVROPE_TORCH_HOST_OPT", "-O3")

setup(
    name="kvrope_torch",
    version="0.1.0",
    description="kvrope's fused KV-cache update with RoPE, its backward and the serving forward, as PyTorch custom ops",
    packages=["kvrope_torch"],
    ext_modules=[
        CUDAExtension(
            "kvrope_torch._C",
            # (setuptools sorts the sources: ninja starts them in name order, whatever this list's)
            ["csrc/launch_append_bf16.cu", "csrc/launch_append_fp16.cu", "csrc/launch_append_fp32.cu",
             "csrc/launch_bf16.cu", "csrc/launch_fp16.cu", "csrc/launch_fp32.cu", "csrc/launch_mla.cu",
             "csrc/python.cpp", "csrc/ops.cpp", "csrc/checks.cpp", "csrc/ops_cuda.cpp"],
            include_dirs=[include],
            extra_compile_args={"cxx": [host_opt, "-std=c++17"],
                                "nvcc": [host_opt, "-std=c++17", "--expt-relaxed-constexpr"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.9"],
)
