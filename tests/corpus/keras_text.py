"""A Keras subclassed model as users write one: an embedding, a 1-D convolution and pooling
over the sequence, a class per sequence. Written for gpubench's tests."""
import keras


class TextClassifier(keras.Model):
    def __init__(self, vocab, width, classes):
        super().__init__()
        self.embed = keras.layers.Embedding(vocab, width)
        self.conv = keras.layers.Conv1D(width, 3, padding="same", activation="relu")
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(classes)

    def call(self, tokens, training=False):
        return self.head(self.pool(self.conv(self.embed(tokens))))


def text_classifier(vocab=128, width=32, classes=4):
    return TextClassifier(vocab, width, classes)
