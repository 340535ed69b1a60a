# Sourced by the benchmarks/gpu scripts: the Debian 12 Vulkan packages carried in $D/debs, unpacked
# as the lent machine needs — every package into the private root
# /tmp/vk (headers, glslc, loader), only the runtime libraries into / (never a -dev package there) —
# and the NVIDIA ICD named.  vulkan_unpack exports nothing else; vulkan_use_sdk points builds and
# programs at /tmp/vk.
VK_RUNTIME_DEBS="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libffi8"

vulkan_unpack() {  # DEBS_DIR
  mkdir -p /tmp/vk
  for f in "$1"/*.deb; do dpkg -x "$f" /tmp/vk; done
  for p in $VK_RUNTIME_DEBS; do dpkg -x "$1"/${p}_*.deb /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
}

vulkan_use_sdk() {
  export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu
  export VULKAN_SDK=/tmp/vk/usr PATH=$PATH:/tmp/vk/usr/bin
}
