"""Text to token ids: the guide's standardization, the vectorizer, and the IMDB child-process reader.

Kept free of imports: `python -m inceptionlab.data.text.child_reader` must not load torch.
"""
