# rocforge env --shell fish: ROCm /usr (debian 5.2.3), target none
# rocm: debian 5.2.3
# target: no GPU detected (no KFD topology in this root) and no --target given
# ROCM_PATH: the chosen debian install
set -gx ROCM_PATH '/usr'
# HIP_PATH: debian installs HIP under /usr
set -gx HIP_PATH '/usr'
# HIP_PLATFORM: AMD GPUs (hipcc and CMake's HIP language read it)
set -gx HIP_PLATFORM 'amd'
# HIP_CLANG_PATH: debian layout: clang for HIP lives in /usr/bin (Debian's hipcc calls $HIP_CLANG_PATH/clang++-N, found only in /usr/bin)
set -gx HIP_CLANG_PATH '/usr/bin'
# HIP_DEVICE_LIB_PATH: device bitcode (oclc_isa_version_*.bc) is in /usr/lib/x86_64-linux-gnu/amdgcn/bitcode
set -gx HIP_DEVICE_LIB_PATH '/usr/lib/x86_64-linux-gnu/amdgcn/bitcode'
