"""Data: `readers.py` maps a recipe's `data.reader` to its splits (`splits.py`); `datasets/` reads the
original formats (through `io/`, and `text/` for reviews), `transforms/` augments, `loading/` batches."""
