"""The head of the tests' training scripts whose DataLoader reads through worker processes: one
slow sample at a time, so that workers are busy when a stop arrives. Indented like the scripts
that start with it (``runs.script`` dedents the whole)."""

SLOW_LOADER_HEAD = """
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from trainguard import Checkpointer

    class Slow(Dataset):
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.tensor([float(i)])
"""
