"""TensorFlow/Keras 3 backend (imports tensorflow lazily)."""
