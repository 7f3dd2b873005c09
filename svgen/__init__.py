"""svgen: video-attention mask specs compiled to specialized Pallas TPU kernels."""
