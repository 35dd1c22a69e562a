# Sourced by the scripts that run on the GPU machine (gpu-run.sh, gpu-peers.sh, gpu-profile.sh):
# the CUDA libraries on the library path (a system toolkit, or PyTorch's wheels: cuBLAS, cudart,
# curand) and `gpu_unpack NAME`, which unpacks $PACK/NAME.xz (from scripts/gpu-pack.sh,
# default target/gpu-pack) to /tmp/tandem-gpu/NAME.
for d in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# The binary is written beside and renamed into place, so a copy already running (a detached
# gpu-peers.sh PHASE=prep writing its GGUFs) keeps its file: writing over it in place made
# that run fail with "Text file busy" (2026-12-04).
gpu_unpack() {
  mkdir -p /tmp/tandem-gpu
  xz -dc "${PACK:-target/gpu-pack}/$1.xz" > "/tmp/tandem-gpu/$1.new" && chmod +x "/tmp/tandem-gpu/$1.new" \
    && mv -f "/tmp/tandem-gpu/$1.new" "/tmp/tandem-gpu/$1"
}
