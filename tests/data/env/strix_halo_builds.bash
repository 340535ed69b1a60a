# rocforge env --shell bash: ROCm /opt/rocm (therock 7.9.0rc20250812), target gfx1151
# rocm: therock 7.9.0rc20250812: rocBLAS has TensileLibrary files for gfx1151
# target: gfx1151 igpu (node 1, 40 CUs): rocBLAS has TensileLibrary files for gfx1151
# builds: used for gfx1151: aotriton 0.11.1 (hip) built for gfx1151 at $BUILDS/aotriton-gfx1151-hip, hipblaslt 1.1.0 (hip) built for gfx1151 at $BUILDS/hipblaslt-gfx1151-hip, rocblas 5.1.0 (hip) built for gfx1151 at $BUILDS/rocblas-gfx1151-hip; not for this target: llama-cpp at $BUILDS/llama-cpp-gfx1100-hip (built for gfx1100)
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
# AOTRITON_INSTALLED_PREFIX: aotriton 0.11.1 (hip) built for gfx1151 at $BUILDS/aotriton-gfx1151-hip: aotriton exports AOTRITON_INSTALLED_PREFIX
export AOTRITON_INSTALLED_PREFIX='$BUILDS/aotriton-gfx1151-hip'
# HIPBLASLT_TENSILE_LIBPATH: hipblaslt 1.1.0 (hip) built for gfx1151 at $BUILDS/hipblaslt-gfx1151-hip: hipblaslt exports HIPBLASLT_TENSILE_LIBPATH
export HIPBLASLT_TENSILE_LIBPATH='$BUILDS/hipblaslt-gfx1151-hip/lib/hipblaslt/library'
# ROCBLAS_TENSILE_LIBPATH: rocblas 5.1.0 (hip) built for gfx1151 at $BUILDS/rocblas-gfx1151-hip: rocblas exports ROCBLAS_TENSILE_LIBPATH
export ROCBLAS_TENSILE_LIBPATH='$BUILDS/rocblas-gfx1151-hip/lib/rocblas/library'
# TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL: aotriton 0.11.1 (hip) built for gfx1151 at $BUILDS/aotriton-gfx1151-hip: aotriton exports TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL
export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL='1'
# PATH: prepended unless already present (therock layout)
case ":${PATH-}:" in *:'/opt/rocm/lib/llvm/bin':*) ;; *) PATH='/opt/rocm/lib/llvm/bin'"${PATH:+:${PATH}}" ;; esac
case ":${PATH-}:" in *:'/opt/rocm/bin':*) ;; *) PATH='/opt/rocm/bin'"${PATH:+:${PATH}}" ;; esac
export PATH
# LD_LIBRARY_PATH: rocforge builds for gfx1151 first; then the ROCm's: prepended unless already present (therock layout)
case ":${LD_LIBRARY_PATH-}:" in *:'/opt/rocm/lib/llvm/lib':*) ;; *) LD_LIBRARY_PATH='/opt/rocm/lib/llvm/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
case ":${LD_LIBRARY_PATH-}:" in *:'/opt/rocm/lib':*) ;; *) LD_LIBRARY_PATH='/opt/rocm/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
case ":${LD_LIBRARY_PATH-}:" in *:'$BUILDS/rocblas-gfx1151-hip/lib':*) ;; *) LD_LIBRARY_PATH='$BUILDS/rocblas-gfx1151-hip/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
case ":${LD_LIBRARY_PATH-}:" in *:'$BUILDS/hipblaslt-gfx1151-hip/lib':*) ;; *) LD_LIBRARY_PATH='$BUILDS/hipblaslt-gfx1151-hip/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
case ":${LD_LIBRARY_PATH-}:" in *:'$BUILDS/aotriton-gfx1151-hip/lib':*) ;; *) LD_LIBRARY_PATH='$BUILDS/aotriton-gfx1151-hip/lib'"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;; esac
export LD_LIBRARY_PATH
# CMAKE_PREFIX_PATH: rocforge builds for gfx1151 first; then the ROCm's: prepended unless already present (therock layout)
case ":${CMAKE_PREFIX_PATH-}:" in *:'/opt/rocm':*) ;; *) CMAKE_PREFIX_PATH='/opt/rocm'"${CMAKE_PREFIX_PATH:+:${CMAKE_PREFIX_PATH}}" ;; esac
case ":${CMAKE_PREFIX_PATH-}:" in *:'$BUILDS/rocblas-gfx1151-hip':*) ;; *) CMAKE_PREFIX_PATH='$BUILDS/rocblas-gfx1151-hip'"${CMAKE_PREFIX_PATH:+:${CMAKE_PREFIX_PATH}}" ;; esac
case ":${CMAKE_PREFIX_PATH-}:" in *:'$BUILDS/hipblaslt-gfx1151-hip':*) ;; *) CMAKE_PREFIX_PATH='$BUILDS/hipblaslt-gfx1151-hip'"${CMAKE_PREFIX_PATH:+:${CMAKE_PREFIX_PATH}}" ;; esac
case ":${CMAKE_PREFIX_PATH-}:" in *:'$BUILDS/aotriton-gfx1151-hip':*) ;; *) CMAKE_PREFIX_PATH='$BUILDS/aotriton-gfx1151-hip'"${CMAKE_PREFIX_PATH:+:${CMAKE_PREFIX_PATH}}" ;; esac
export CMAKE_PREFIX_PATH
# PKG_CONFIG_PATH: prepended unless already present (therock layout)
case ":${PKG_CONFIG_PATH-}:" in *:'/opt/rocm/lib/pkgconfig':*) ;; *) PKG_CONFIG_PATH='/opt/rocm/lib/pkgconfig'"${PKG_CONFIG_PATH:+:${PKG_CONFIG_PATH}}" ;; esac
export PKG_CONFIG_PATH
# warning: /opt/rocm: /opt/rocm/bin/amdclang++ is a broken link (TheRock trees before Mar 2026); using /opt/rocm/lib/llvm/bin
