#!/usr/bin/env bash
# Sourced on the GPU machine from the repository root, before bench/flashinfer_compare.py: installs FlashInfer's
# reduced wheel (0.7.4+ropepage) and apache-tvm-ffi from peers/ (ignored by git: put the two wheels there and
# name peers in the device call's carry) into build-gpu/flashinfer/site, without downloads, and exports
# PYTHONPATH and FlashInfer's JIT settings. Both stay on a warm machine (build-gpu/ is ignored and kept between
# calls; peers/ is replaced by each carry), so a second call neither reinstalls nor rebuilds.
#   source dev/scripts/flashinfer_setup.sh && python3 bench/flashinfer_compare.py
fi_root=${FLASHINFER_ROOT:-$PWD/build-gpu/flashinfer}
fi_wheels=$(ls peers/flashinfer_python-*.whl peers/apache_tvm_ffi-*.whl 2>/dev/null)
if [[ $(echo "$fi_wheels" | wc -w) -ne 2 ]]; then
  echo "flashinfer_setup: expected peers/flashinfer_python-*.whl and peers/apache_tvm_ffi-*.whl; found: ${fi_wheels:-none}" >&2
else
  # Reinstalled only when the wheels change (their names and sizes).
  fi_stamp=$(ls -l $fi_wheels | awk '{print $5, $NF}')
  if [[ ! -f $fi_root/site/.wheels || $(cat "$fi_root/site/.wheels") != "$fi_stamp" ]]; then
    rm -rf "$fi_root/site"
    python3 -m pip install --no-deps --no-index --quiet --target "$fi_root/site" $fi_wheels &&
      echo "$fi_stamp" > "$fi_root/site/.wheels"
  fi
  export PYTHONPATH=$fi_root/site${PYTHONPATH:+:$PYTHONPATH}
  export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$fi_root}  # the JIT cache: $it/.cache/flashinfer
  export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}       # the H200 only
  python3 -c "import importlib.util as u; s = u.find_spec('flashinfer'); print('flashinfer_setup:', s and s.submodule_search_locations[0])"
fi
unset fi_root fi_wheels fi_stamp
