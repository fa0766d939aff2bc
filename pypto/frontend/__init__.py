"""The kernel-writing API: tracing tensors, ops, tile shapes and @jit."""
