# stand-in for the triton submodule
