#ifndef ROCWMMA_API_HPP
#define ROCWMMA_API_HPP
#include "internal/config.hpp"
namespace rocwmma
{
} // namespace rocwmma
#endif
