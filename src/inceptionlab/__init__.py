"""inceptionlab: Inception v3 and the ROCm Deep Learning Guide's case studies on one engine."""

__version__ = "0.1.0"
