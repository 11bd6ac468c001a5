"""The guide's small case-study networks, registered beside torchvision's models."""

from __future__ import annotations

import torch
from torch import nn

from inceptionlab.models.spec import Preprocessing

# The guide's Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)): pixels to [-1, 1], at CIFAR-10's 32 px.
CIFAR10_PREPROCESSING = Preprocessing(32, 32, "bilinear", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
# The guide's `/ 255.0` (mean 0, std 1) at Fashion-MNIST's 28 px; one grey channel.
FASHION_PREPROCESSING = Preprocessing(28, 28, "bilinear", (0.0,), (1.0,))


def cifar10_cnn(num_classes: int = 10) -> nn.Module:
    """The guide's CIFAR-10 network as described (its listing has typos): 32x32 RGB input.

    conv 3->6 5x5, ReLU, maxpool 2 -> conv 6->16 5x5, ReLU, maxpool 2 -> 16*5*5=400 -> 120 -> 84 -> classes.
    """
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes),
    )


def fashion_mlp(num_classes: int = 10, in_features: int = 28 * 28, hidden: int = 128) -> nn.Module:
    """The guide's Keras model: Flatten -> Dense 128 ReLU -> Dense 10 (logits)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class UniformMaskDropout(nn.Module):
    """Dropout whose keep mask costs a quarter of the random draws of `nn.Dropout`'s.

    Each element is kept when a uniform 15-bit integer is >= round(p * 2**15), and kept elements are
    scaled by 1 / (1 - p) as in `nn.Dropout`. One 64-bit draw of the generator yields four such
    integers, so the mask of the 32 x 250 x 16 IMDB activations takes 32,000 draws instead of
    128,000 (126 us of CPU for the draws). Mask and multiply cost 360-440 us per step against
    630-650 us for `x * (rand_like(x) >= p) * scale`, forward and backward 1,355 against 1,720 us
    (one thread, CPU time, measured here). The keep rate is 1 - round(p * 2**15) / 2**15:
    0.799988 for p = 0.2, within 1.5e-5 of 1 - p for any p.
    """

    FIELD_BITS = 15

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def keep_mask(self, x: torch.Tensor) -> torch.Tensor:
        """0 or 1 / (1 - p) per element of `x`, in x's dtype."""
        count = x.numel()
        draws = torch.empty((count + 3) // 4, dtype=torch.int64, device=x.device).random_()  # 63 random bits each
        # Each int16 of a draw holds at least 15 random low bits (the top one holds bits 48..62).
        fields = draws.view(torch.int16)[:count].view(x.shape) & (2**self.FIELD_BITS - 1)
        threshold = round(self.p * 2**self.FIELD_BITS)
        return (fields >= threshold).to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return x * self.keep_mask(x)


class TextClassifier(nn.Module):
    """The guide's IMDB model: Embedding -> Dropout -> GlobalAveragePooling1D -> Dropout -> Dense(1).

    Like Keras' GlobalAveragePooling1D without a mask, the mean runs over all positions, padding
    included. The embedding starts uniform in [-0.05, 0.05] as Keras' does (PyTorch's N(0, 1) start is
    20x larger and slows the first epochs of this small model). The lookup is an `index_select` on
    the embedding's weight: the same values and gradient as `nn.Embedding.forward`, whose dense
    backward took 615 us per batch here against 170 us for index_select's.
    """

    def __init__(self, num_classes: int = 2, vocab_size: int = 10_001, embedding_dim: int = 16, dropout: float = 0.2):
        super().__init__()
        outputs = 1 if num_classes == 2 else num_classes  # binary: one logit
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        self.dropout = UniformMaskDropout(dropout)
        self.fc = nn.Linear(embedding_dim, outputs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        vectors = self.embedding.weight.index_select(0, tokens.reshape(-1)).view(*tokens.shape, -1)
        pooled = self.dropout(vectors).mean(dim=1)
        return self.fc(self.dropout(pooled))


def text_classifier(num_classes: int = 2, vocab_size: int = 10_001, embedding_dim: int = 16, dropout: float = 0.2) -> nn.Module:
    return TextClassifier(num_classes, vocab_size, embedding_dim, dropout)


# The guide's small case-study networks by registry name, with the preprocessing each declares (what a
# recipe leaves empty falls back to; None: the model takes token ids, not images). models.registry
# serves them beside torchvision's.
SMALL_MODELS = {"cifar10_cnn": cifar10_cnn, "fashion_mlp": fashion_mlp, "text_classifier": text_classifier}
SMALL_PREPROCESSING: dict[str, Preprocessing | None] = {
    "cifar10_cnn": CIFAR10_PREPROCESSING, "fashion_mlp": FASHION_PREPROCESSING, "text_classifier": None,
}
