"""Training augmentation: per image on the host (`host.py`), or batched on the device (`device.py`)."""
