"""One emitter per output format: the only code that writes it, handed typed values (names,
values, argv lists), never pre-assembled text, so no caller can paste data into a format.

  POSIX sh, bash, zsh, fish, dotenv   rocforge_build/shellsafe.py, discover/envscript.py
  the bundle launcher (sh)            emit/launcher.py
  systemd units                       emit/systemd.py
  YAML (llama-swap)                   emit/yaml_swap.py (PyYAML's safe dumper)
  Containerfiles                      emit/containerfile.py
  GRUB and kernel command lines       emit/kernel_cmdline.py

tests/test_emit.py fails when a format's tokens appear in a string anywhere else.
"""
