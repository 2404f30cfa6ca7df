"""``gpubench advise``: the training practices measured on one config, ranked, the best combination measured."""
