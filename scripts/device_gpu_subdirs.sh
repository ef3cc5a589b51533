# Sourced (from the repository root) by the one-call device scripts of bench/engine and
# bench/kernels: the folders scripts/device_build.sh configures (CASCADE_SUBDIRS) for the GPU test
# binaries, engine_bench and the kernel benchmarks. Exported as the list itself, so a baseline
# tree's own device_build.sh (BASE_SRC) reads it too.
export CASCADE_SUBDIRS="common cache_service gpu_worker/model gpu_worker/engine gpu_worker/backend/cpu gpu_worker/backend/cuda tests/gpu bench/engine bench/kernels"
