#ifndef ROCWMMA_CONFIG_HPP
#define ROCWMMA_CONFIG_HPP
/// Guaranteed symbols: ROCWMMA_ARCH_GFX942 ROCWMMA_ARCH_GFX1100 ROCWMMA_ARCH_GFX1151
#if defined(__gfx942__)
#define ROCWMMA_ARCH_GFX942 __gfx942__
#elif defined(__gfx1100__)
#define ROCWMMA_ARCH_GFX1100 __gfx1100__
#elif defined(__gfx1151__)
#define ROCWMMA_ARCH_GFX1151 __gfx1151__
#endif
#endif
