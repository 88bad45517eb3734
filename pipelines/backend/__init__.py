"""The Python-backend glue: what runs inside tritonserver's Python stub around pipelines' code.

Only these modules import Triton (``triton_python_backend_utils``): ``batching`` (the adapter
every ``model.py`` uses), ``torch_io`` (an instance's torch device, tensors through DLPack),
``metrics`` (the steps' own metrics), and the runners that serve model files in a Python model
(``onnx_model``, ``torch_model``, ``runtime``).
"""
