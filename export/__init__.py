"""PyTorch → ONNX export with parity checks; writes into model_repository/<model>/<version>/."""
