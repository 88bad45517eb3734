"""What tritonserver's Python stubs import at serve time, installed into their environment.

Tensor names and model contracts, pre/post-processing, the tokenizer, the onnxruntime runner, the
network a GPU stub runs in PyTorch (``efficientnet_lite``), and ``pipelines.backend``, the glue
between those functions and Triton. Export, client, benchmarks and tests import the same
functions; what only they need (networks for export, sample data, the reference pipeline, the
gateway's token buckets) lives beside them.
"""
