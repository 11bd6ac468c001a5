"""From datasets to batches: the sampler, the four loaders behind `make_loader`, and the decoded-image cache."""
