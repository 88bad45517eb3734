"""This repository in containers, run from the host: images, the compose stack, its engine.

``python -m containers up`` (``make up``) builds the images (``images``) and runs the compose
stack of docker/ on a CPU host (``stack``) on the container engine that docker/engine.sh
starts or finds. The tests and benchmarks that drive real containers use the same pieces.
"""
