"""PyTorch → ONNX export with parity checks; artifacts land in model_repository/<model>/<version>/."""
