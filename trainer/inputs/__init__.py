"""What the trainer trains on: examples tokenized and packed into rows, and the built-in tiny model and
data, made on a first run."""
