"""The JAX backend (JAX, Optax): translates the framework-neutral specs into one jitted training step."""
