"""Dataset formats, one module per original format: each reads the files as their authors publish them."""
