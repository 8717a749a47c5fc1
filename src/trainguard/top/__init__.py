"""`trainguard top`: a live view of this machine's runs, GPUs and host."""
