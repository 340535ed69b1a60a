# rocforge env --shell bash: ROCm /opt/rocm (therock 7.9.0rc20250812), target gfx1151
# rocm: therock 7.9.0rc20250812: rocBLAS has TensileLibrary files for gfx1151
# target: gfx1151 igpu (node 1, 40 CUs): rocBLAS has TensileLibrary files for gfx1151
# ROCM_PATH: the chosen therock install
export ROCM_PATH='/opt/rocm'
# HIP_PATH: HIP lives in the ROCm tree
export HIP_PATH='/opt/rocm'
# HIP_PLATFORM: AMD GPUs (hipcc and CMake's HIP language read it)
export HIP_PLATFORM='amd'
# HIP_CLANG_PATH: therock layout: clang for HIP lives in /opt/rocm/lib/llvm/bin (this tree's bin/amdclang* links are broken, as before Mar 2026)
export HIP_CLANG_PATH='/opt/rocm/lib/llvm/bin'
# HIP_DEVICE_LIB_PATH: device bitcode (oclc_isa_version_*.bc) is in /opt/rocm/lib/llvm/amdgcn/bitcode, not $ROCM_PATH/amdgcn/bitcode (TheRock layout)
export HIP_DEVICE_LIB_PATH='/opt/rocm/lib/llvm/amdgcn/bitcode'
# HSA_OVERRIDE_GFX_VERSION: not needed: the libraries carry kernels for the GPU itself
unset HSA_OVERRIDE_GFX_VERSION
# ROCBLAS_USE_HIPBLASLT: hipBLASLt has TensileLibrary files for gfx1151: rocBLAS routes GEMMs through it (seed 004: the fastest path)
export ROCBLAS_USE_HIPBLASLT='1'
# PATH: prepended unless already present (therock layout)
case ":${PATH-}:" in *:'/opt/rocm/lib/llvm/bin':*) ;; *) PATH='/opt/rocm/lib/llvm/bin'"${PATH:+:${PATH}}" ;; esac
case ":${PATH-}:" in *:'/opt/rocm/bin':*) ;; *) PATH='/opt/rocm/bin'"${PATH:+:${PATH}}" ;; esac
export PATH
# LD_LIBRARY_PATH: prepended unless already present (therock layout)
case ":${LD_LIBRARY_PATH-}:" in *:'/opt/rocm/lib/llvm/lib':*) ;; *) LD_LIBRARY_PATH='/opt/rocm/lib/llvm/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
case ":${LD_LIBRARY_PATH-}:" in *:'/opt/rocm/lib':*) ;; *) LD_LIBRARY_PATH='/opt/rocm/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
export LD_LIBRARY_PATH
# CMAKE_PREFIX_PATH: prepended unless already present (therock layout)
case ":${CMAKE_PREFIX_PATH-}:" in *:'/opt/rocm':*) ;; *) CMAKE_PREFIX_PATH='/opt/rocm'"${CMAKE_PREFIX_PATH:+:${CMAKE_PREFIX_PATH}}" ;; esac
export CMAKE_PREFIX_PATH
# PKG_CONFIG_PATH: prepended unless already present (therock layout)
case ":${PKG_CONFIG_PATH-}:" in *:'/opt/rocm/lib/pkgconfig':*) ;; *) PKG_CONFIG_PATH='/opt/rocm/lib/pkgconfig'"${PKG_CONFIG_PATH:+:${PKG_CONFIG_PATH}}" ;; esac
export PKG_CONFIG_PATH
# warning: stale HSA_OVERRIDE_GFX_VERSION=11.0.0 in the environment is unset: gfx1151 needs no override here, and a stale override crashes ROCm on native targets (kyuz0/amd-strix-halo-toolboxes #115)
# warning: /opt/rocm: /opt/rocm/bin/amdclang++ is a broken link (TheRock trees before Mar 2026); using /opt/rocm/lib/llvm/bin
