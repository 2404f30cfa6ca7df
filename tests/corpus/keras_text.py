"""A Keras subclassed model as users write one: an embedding, a 1-D convolution and pooling
over the sequence, a class per sequence; given its inputs with the targets, ``(tokens,
targets)`` as Keras' one input, (logits, loss) as well. Written for gpubench's tests."""
import keras


class TextClassifier(keras.Model):
    def __init__(self, vocab, width, classes):
        super().__init__()
        self.embed = keras.layers.Embedding(vocab, width)
        self.conv = keras.layers.Conv1D(width, 3, padding="same", activation="relu")
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(classes)

    def call(self, inputs, training=False):
        tokens, targets = inputs if isinstance(inputs, (tuple, list)) else (inputs, None)
        logits = self.head(self.pool(self.conv(self.embed(tokens))))
        if targets is None:
            return logits
        loss = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        return logits, keras.ops.mean(loss)


def text_classifier(vocab=128, width=32, classes=4):
    return TextClassifier(vocab, width, classes)
