"""Checkpoints of GNT's official code (github.com/VITA-Group/GNT, read at commit 53e0fc3) as Pola-GNT
checkpoints: `python -m pola_gnt.convert_gnt`'s library.

GNT's `train.py` saves `{optimizer, scheduler, net_coarse, feature_net}` (+ `net_fine` when its
`single_net` is off): the state dicts of its `GNT` transformer and its `ResUNet` encoder. The converted
checkpoint is an ordinary Pola-GNT checkpoint of `model=gnt experiment=paper` at GNT's sizes with
`model.net.compat=gnt`, which `eval`, `render_video` and `init_from` read like any other, and whose
network computes GNT's forward (`pola_gnt.model.gnt`). What the weights can express, the conversion
does, exactly or up to fp32 rounding; `compat` switches only what they cannot:

    GNT's code                                      here (converted weights)
    ray attention q/k/v without bias                 to_qkv = [Wq; Wk; Wv], bias 0 (exact)
    view attention V = Wv (Wk x)                     to_v = Wv Wk (one matrix; rounding only)
    sin/cos interleaved per frequency                fusion layer's input columns permuted (exact)
    decoder concatenates [upsampled, skip]           merge conv's input channels swapped (exact)
    no read-out scores (plain mean)                  scores 0, and compat's mean over all samples
    two feature sets when `single_net` is off        64 features, the other network's columns 0 (exact)

The feature network alone has 8.9 M parameters and GNT has no width option for it; tests and the
golden fixture make seeded weights in GNT's layout instead of storing them (`seeded_gnt_checkpoint`).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from torch import Tensor

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import file_sha256, write_atomic
from pola_gnt.runs.checkpoints import TRAINING_RECORD
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import container_dict
from pola_gnt.runs.system import GNTSystem

GNT_COMMIT = "53e0fc3"  # the commit of GNT's code whose layout and forward this module follows
CHECKPOINT_KEYS = ("optimizer", "scheduler", "net_coarse", "feature_net", "net_fine")
REQUIRED_KEYS = ("net_coarse", "feature_net")
NETWORKS = ("coarse", "fine")
N_FREQS = 10  # GNT's positional code: 10 frequencies of the point and the view direction
HEADS = 4  # GNT's ray attention has 4 heads at every width
# GNT's ResUNet: the first three stages of ResNet-34 and its decoder.
ENCODER_CHANNELS = (64, 128, 256)
ENCODER_BLOCKS = (3, 4, 6)
ENCODER_FEATURES = 32  # coarse_feat_dim and fine_feat_dim (config.py)
_SHOWN_KEYS = 6  # keys named in one error line


# ---- GNT's layout --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GNTLayout:
    """The sizes of a GNT checkpoint, from its weights' shapes."""

    width: int  # netwidth
    depth: int  # trans_depth
    coarse_features: int  # feature channels net_coarse reads (the first ones of feature_net's output)
    fine_features: int  # those net_fine reads (the last ones); 0 with single_net
    feature_channels: int  # feature_net's output channels

    @property
    def single_net(self) -> bool:
        return self.fine_features == 0


def gnt_transformer_shapes(width: int, depth: int, features: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """GNT's `GNT` network (transformer_network.py): key -> (shape, is a norm's parameter), in order."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {}

    def linear(name: str, out_dim: int, in_dim: int, bias: bool = True) -> None:
        shapes[f"{name}.weight"] = ((out_dim, in_dim), False)
        if bias:
            shapes[f"{name}.bias"] = ((out_dim,), False)

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = ((width,), True)
        shapes[f"{name}.bias"] = ((width,), True)

    def block_norms_and_ffn(prefix: str) -> None:
        norm(f"{prefix}.attn_norm")
        norm(f"{prefix}.ff_norm")
        linear(f"{prefix}.ff.fc1", 4 * width, width)
        linear(f"{prefix}.ff.fc2", width, 4 * width)

    linear("rgbfeat_fc.0", width, features + 3)
    linear("rgbfeat_fc.2", width, width)
    position_dim = 2 * 3 * (1 + 2 * N_FREQS)
    for i in range(depth):
        view = f"view_crosstrans.{i}"
        block_norms_and_ffn(view)
        for name in ("q_fc", "k_fc", "v_fc"):
            linear(f"{view}.attn.{name}", width, width, bias=False)
        linear(f"{view}.attn.pos_fc.0", width // 8, 4)
        linear(f"{view}.attn.pos_fc.2", width, width // 8)
        linear(f"{view}.attn.attn_fc.0", width // 8, width)
        linear(f"{view}.attn.attn_fc.2", width, width // 8)
        linear(f"{view}.attn.out_fc", width, width)
        ray = f"view_selftrans.{i}"
        block_norms_and_ffn(ray)
        for name in ("q_fc", "k_fc", "v_fc"):
            linear(f"{ray}.attn.{name}", width, width, bias=False)
        linear(f"{ray}.attn.out_fc", width, width)
        if i % 2 == 0:
            linear(f"q_fcs.{i}.0", width, width + position_dim)
            linear(f"q_fcs.{i}.2", width, width)
    norm("norm")
    linear("rgb_fc", 3, width)
    return shapes


def gnt_feature_net_shapes(out_channels: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """GNT's `ResUNet` (feature_network.py) with `out_channels` outputs: key -> (shape, is a norm's
    parameter), in order."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {}

    def conv(name: str, out_ch: int, in_ch: int, size: int, bias: bool = False) -> None:
        shapes[f"{name}.weight"] = ((out_ch, in_ch, size, size), False)
        if bias:
            shapes[f"{name}.bias"] = ((out_ch,), False)

    def norm(name: str, channels: int) -> None:
        shapes[f"{name}.weight"] = ((channels,), True)
        shapes[f"{name}.bias"] = ((channels,), True)

    conv("conv1", ENCODER_CHANNELS[0], 3, 7)
    norm("bn1", ENCODER_CHANNELS[0])
    in_ch = ENCODER_CHANNELS[0]
    for layer, (channels, blocks) in enumerate(zip(ENCODER_CHANNELS, ENCODER_BLOCKS), start=1):
        for block in range(blocks):
            prefix = f"layer{layer}.{block}"
            conv(f"{prefix}.conv1", channels, in_ch if block == 0 else channels, 3)
            norm(f"{prefix}.bn1", channels)
            conv(f"{prefix}.conv2", channels, channels, 3)
            norm(f"{prefix}.bn2", channels)
            if block == 0:  # every stage starts with stride 2
                conv(f"{prefix}.downsample.0", channels, in_ch, 1)
                norm(f"{prefix}.downsample.1", channels)
        in_ch = channels
    for level, (up_in, skip, out) in {
        3: (ENCODER_CHANNELS[2], ENCODER_CHANNELS[1], ENCODER_CHANNELS[1]),
        2: (ENCODER_CHANNELS[1], ENCODER_CHANNELS[0], out_channels),
    }.items():
        conv(f"upconv{level}.conv.conv", skip, up_in, 3, bias=True)
        norm(f"upconv{level}.conv.bn", skip)
        conv(f"iconv{level}.conv", out, 2 * skip, 3, bias=True)
        norm(f"iconv{level}.bn", out)
    conv("out_conv", out_channels, out_channels, 1, bias=True)
    return shapes


def seeded_gnt_checkpoint(seed: int, width: int = 64, depth: int = 4, single_net: bool = True) -> dict:
    """A checkpoint in the layout GNT's `train.py` saves, with weights drawn from `seed` (no optimiser
    or scheduler state): for tests and the golden fixture (`scripts/make_gnt_golden.py`), which give
    the same weights to GNT's code and to the converter. Layers `U(-1, 1) / sqrt(fan_in)` (PyTorch's
    default scale), norms `1 + U(-0.2, 0.2)` and `U(-0.2, 0.2)`, drawn key by key in layout order."""
    generator = torch.Generator().manual_seed(seed)
    fine = 0 if single_net else ENCODER_FEATURES

    def draw(shapes: dict[str, tuple[tuple[int, ...], bool]]) -> dict[str, Tensor]:
        state = {}
        for key, (shape, is_norm) in shapes.items():
            noise = torch.rand(shape, generator=generator) * 2 - 1
            if is_norm:
                state[key] = (1.0 if key.endswith("weight") else 0.0) + 0.2 * noise
            else:
                weight_shape = shapes[key.rsplit(".", 1)[0] + ".weight"][0]
                state[key] = noise / math.sqrt(math.prod(weight_shape[1:]))
        return state

    checkpoint = {
        "net_coarse": draw(gnt_transformer_shapes(width, depth, ENCODER_FEATURES)),
        "feature_net": draw(gnt_feature_net_shapes(ENCODER_FEATURES + fine)),
    }
    if not single_net:
        checkpoint["net_fine"] = draw(gnt_transformer_shapes(width, depth, fine))
    return checkpoint


def _names(keys) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:_SHOWN_KEYS])
    return shown + (f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else "")


def _check_state(path: Path, name: str, state: object, shapes: Mapping[str, tuple[tuple[int, ...], bool]]) -> None:
    """One line naming the unknown, missing or misshapen keys of GNT's state dict `name`."""
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise UserError(f"{path}: {name} is not a state dict of tensors")
    unknown, missing = set(state) - set(shapes), set(shapes) - set(state)
    if unknown or missing:
        parts = [
            f"unknown keys {_names(unknown)}" if unknown else "",
            f"missing keys {_names(missing)}" if missing else "",
        ]
        raise UserError(f"{path}: {name} is not GNT's layout: {'; '.join(p for p in parts if p)}")
    wrong = [f"{key} {tuple(state[key].shape)} (expected {shape})" for key, (shape, _) in shapes.items()
             if tuple(state[key].shape) != shape]  # fmt: skip
    if wrong:
        raise UserError(f"{path}: {name} has shapes that do not fit GNT's layout: {_names(wrong)}")


def gnt_layout(checkpoint: Mapping, path: Path) -> GNTLayout:
    """The sizes of GNT checkpoint `checkpoint` (read from `path`), every key and shape checked
    against GNT's layout at those sizes; one `UserError` line naming what does not fit."""
    unknown = set(checkpoint) - set(CHECKPOINT_KEYS)
    missing = set(REQUIRED_KEYS) - set(checkpoint)
    if unknown or missing:
        parts = [
            f"unknown keys {_names(unknown)}" if unknown else "",
            f"missing keys {_names(missing)}" if missing else "",
        ]
        raise UserError(
            f"{path}: not a checkpoint of GNT's train.py ({'; '.join(p for p in parts if p)}; expected "
            f"{', '.join(REQUIRED_KEYS)}, optionally {', '.join(k for k in CHECKPOINT_KEYS if k not in REQUIRED_KEYS)})"
        )
    nets = {name: checkpoint[name] for name in ("net_coarse", "net_fine") if name in checkpoint}
    for name, net in nets.items():
        if not isinstance(net, Mapping) or not isinstance(net.get("rgbfeat_fc.0.weight"), Tensor):
            raise UserError(f"{path}: {name} is not GNT's layout: missing keys rgbfeat_fc.0.weight")
    feature_net = checkpoint["feature_net"]
    out_conv = feature_net.get("out_conv.weight") if isinstance(feature_net, Mapping) else None
    if not isinstance(out_conv, Tensor):
        raise UserError(f"{path}: feature_net is not GNT's layout: missing keys out_conv.weight")
    coarse = nets["net_coarse"]["rgbfeat_fc.0.weight"]
    width = int(coarse.shape[0])
    depth = len({key.split(".")[1] for key in nets["net_coarse"] if key.startswith("view_crosstrans.")})
    features = {name: int(net["rgbfeat_fc.0.weight"].shape[1]) - 3 for name, net in nets.items()}
    layout = GNTLayout(
        width=width,
        depth=depth,
        coarse_features=features["net_coarse"],
        fine_features=features.get("net_fine", 0),
        feature_channels=int(out_conv.shape[0]),
    )
    if width < 8 or width % 8 or depth < 1:
        raise UserError(f"{path}: net_coarse has width {width} and {depth} blocks; GNT's are multiples of 8, >= 1")
    expected_channels = layout.coarse_features + layout.fine_features
    if layout.feature_channels != expected_channels:
        raise UserError(
            f"{path}: feature_net gives {layout.feature_channels} feature channels but the networks read "
            f"{expected_channels} ({', '.join(f'{name} {count}' for name, count in features.items())})"
        )
    for name, net in nets.items():
        _check_state(path, name, net, gnt_transformer_shapes(width, depth, features[name]))
    _check_state(path, "feature_net", feature_net, gnt_feature_net_shapes(layout.feature_channels))
    return layout


# ---- GNT's config file ----------------------------------------------------------------------------


def read_gnt_config(path: Path) -> dict[str, str]:
    """GNT's config file (configargparse: `key = value` lines, `#` comments) as raw strings."""
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read GNT's config file ({err.strerror or err})") from None
    values = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, equals, value = line.partition("=")
        if not equals or not key.strip():
            raise UserError(f"{path}:{number}: not a `key = value` line of GNT's config: {line!r}")
        values[key.strip()] = value.strip()
    return values


def _config_int(config: Mapping[str, str], key: str, path: Path | None) -> int | None:
    if key not in config:
        return None
    try:
        return int(config[key])
    except ValueError:
        raise UserError(f"{path}: {key} = {config[key]!r} is not an integer") from None


def _config_list(value: str) -> list[str]:
    return [item for item in re.split(r"[\s,\[\]]+", value) if item]


def training_scenes(config: Mapping[str, str]) -> list[str]:
    """The scenes GNT's config trained on, when they are named: single-scene LLFF (`llff_test`) names
    them in `train_scenes`; the generalizable datasets hold the evaluation scenes out."""
    if config.get("train_dataset") == "llff_test":
        return _config_list(config.get("train_scenes", ""))
    return []


# ---- conversion -----------------------------------------------------------------------------------


def _position_columns(width: int) -> Tensor:
    """For each input column of GNT's fusion layer (`q_fcs.i.0`), the column of ours that gets it:
    GNT's code interleaves `[x, sin(f0 x), cos(f0 x), sin(f1 x), ...]`, ours is `[x, sin(f x) for
    every f, cos(f x) for every f]` (`model.gnt.sinusoidal_encoding`); the token columns stay."""
    columns = list(range(width))
    code = 3 * (1 + 2 * N_FREQS)
    for offset in (width, width + code):  # the point's code, then the view direction's
        columns += [offset + d for d in range(3)]
        for j in range(3, code):
            frequency, part, d = (j - 3) // 6, (j - 3) % 6 // 3, (j - 3) % 3
            columns.append(offset + 3 + part * 3 * N_FREQS + 3 * frequency + d)
    return torch.tensor(columns)


def _transformer_weights(net: Mapping[str, Tensor], layout: GNTLayout, features: slice) -> dict[str, Tensor]:
    """GNT's `GNT` state dict -> the transformer part of our `GNT` module's (`model.gnt`); `features`:
    which of the feature network's output channels this network reads (the others get zero weights)."""
    width = layout.width
    ours: dict[str, Tensor] = {}
    first = net["rgbfeat_fc.0.weight"]
    token_weight = first.new_zeros(width, 3 + layout.feature_channels)
    token_weight[:, :3] = first[:, :3]
    token_weight[:, 3 + features.start : 3 + features.stop] = first[:, 3:]
    ours["view_token_mlp.0.weight"] = token_weight
    ours["view_token_mlp.0.bias"] = net["rgbfeat_fc.0.bias"]
    ours["view_token_mlp.2.weight"] = net["rgbfeat_fc.2.weight"]
    ours["view_token_mlp.2.bias"] = net["rgbfeat_fc.2.bias"]
    columns = _position_columns(width)

    def copy(gnt_key: str, our_key: str) -> None:
        for suffix in ("weight", "bias"):
            if f"{gnt_key}.{suffix}" in net:
                ours[f"{our_key}.{suffix}"] = net[f"{gnt_key}.{suffix}"]

    for i in range(layout.depth):
        for gnt_block, our_block in ((f"view_crosstrans.{i}", f"blocks.{i}.view_block"),
                                     (f"view_selftrans.{i}", f"blocks.{i}.ray_block")):  # fmt: skip
            copy(f"{gnt_block}.attn_norm", f"{our_block}.attention_norm")
            copy(f"{gnt_block}.ff_norm", f"{our_block}.ffn_norm")
            copy(f"{gnt_block}.ff.fc1", f"{our_block}.ffn.0")
            copy(f"{gnt_block}.ff.fc2", f"{our_block}.ffn.2")
        view, ours_view = f"view_crosstrans.{i}.attn", f"blocks.{i}.view_block.attention"
        for name in ("q", "k"):
            ours[f"{ours_view}.to_{name}.weight"] = net[f"{view}.{name}_fc.weight"]
        # GNT's values are Wv (Wk x): one matrix Wv Wk.
        ours[f"{ours_view}.to_v.weight"] = net[f"{view}.v_fc.weight"] @ net[f"{view}.k_fc.weight"]
        for name in ("pos_fc.0", "pos_fc.2", "attn_fc.0", "attn_fc.2", "out_fc"):
            copy(f"{view}.{name}", f"{ours_view}.{name}")
        ray, ours_ray = f"view_selftrans.{i}.attn", f"blocks.{i}.ray_block.attention"
        qkv = torch.cat([net[f"{ray}.{name}_fc.weight"] for name in ("q", "k", "v")])
        ours[f"{ours_ray}.to_qkv.weight"] = qkv
        ours[f"{ours_ray}.to_qkv.bias"] = qkv.new_zeros(3 * width)  # GNT's have none
        copy(f"{ray}.out_fc", f"{ours_ray}.proj")
        if i % 2 == 0:
            fusion = net[f"q_fcs.{i}.0.weight"]
            permuted = torch.empty_like(fusion)
            permuted[:, columns] = fusion
            ours[f"blocks.{i}.position_fusion.0.weight"] = permuted
            ours[f"blocks.{i}.position_fusion.0.bias"] = net[f"q_fcs.{i}.0.bias"]
            copy(f"q_fcs.{i}.2", f"blocks.{i}.position_fusion.2")
    copy("norm", "readout.norm")
    copy("rgb_fc", "readout.to_rgb")
    ours["readout.score.weight"] = first.new_zeros(1, width)  # GNT's mean: no scores
    ours["readout.score.bias"] = first.new_zeros(1)
    return ours


def _encoder_weights(feature_net: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """GNT's `ResUNet` state dict -> our `ImageEncoder`'s (`model.encoder`)."""
    ours: dict[str, Tensor] = {}
    ours["stem.0.weight"] = feature_net["conv1.weight"]  # on [0, 1] input, not centred (compat)
    ours["stem.1.weight"], ours["stem.1.bias"] = feature_net["bn1.weight"], feature_net["bn1.bias"]
    names = {"conv1": "conv1", "bn1": "norm1", "conv2": "conv2", "bn2": "norm2", "downsample": "shortcut"}
    for key, value in feature_net.items():
        match = re.fullmatch(r"layer(\d)\.(\d+)\.(conv1|bn1|conv2|bn2|downsample)\.(.*)", key)
        if match:
            layer, block, name, rest = match.groups()
            ours[f"stages.{int(layer) - 1}.{block}.{names[name]}.{rest}"] = value
    for level, up_block in ((3, 0), (2, 1)):
        for suffix in ("weight", "bias"):
            ours[f"up_blocks.{up_block}.up_conv.0.{suffix}"] = feature_net[f"upconv{level}.conv.conv.{suffix}"]
            ours[f"up_blocks.{up_block}.up_conv.1.{suffix}"] = feature_net[f"upconv{level}.conv.bn.{suffix}"]
            ours[f"up_blocks.{up_block}.merge_conv.1.{suffix}"] = feature_net[f"iconv{level}.bn.{suffix}"]
        # GNT concatenates [upsampled, skip], ours [skip, upsampled] (equal channel counts).
        merge = feature_net[f"iconv{level}.conv.weight"]
        ours[f"up_blocks.{up_block}.merge_conv.0.weight"] = torch.cat(merge.chunk(2, dim=1)[::-1], dim=1)
        ours[f"up_blocks.{up_block}.merge_conv.0.bias"] = feature_net[f"iconv{level}.conv.bias"]
    ours["out_conv.weight"], ours["out_conv.bias"] = feature_net["out_conv.weight"], feature_net["out_conv.bias"]
    return ours


def converted_network_weights(checkpoint: Mapping, layout: GNTLayout, network: str = "coarse") -> dict[str, Tensor]:
    """GNT checkpoint -> the state dict of our `GNT` module (`compat: gnt`) computing GNT's `network`
    (`coarse`: net_coarse on the first feature channels; `fine`: net_fine on the last ones)."""
    if network not in NETWORKS:
        raise ValueError(f"network: {network!r}, expected one of {NETWORKS}")
    if network == "fine":
        if layout.single_net:
            raise UserError("--network fine: the checkpoint has no net_fine (GNT's single_net)")
        net, features = checkpoint["net_fine"], slice(layout.coarse_features, layout.feature_channels)
    else:
        net, features = checkpoint["net_coarse"], slice(0, layout.coarse_features)
    weights = {f"encoder.{key}": value for key, value in _encoder_weights(checkpoint["feature_net"]).items()}
    weights |= _transformer_weights(net, layout, features)
    return {key: value.detach().float().contiguous() for key, value in weights.items()}


def converted_run_config(layout: GNTLayout, gnt_config: Mapping[str, str], path: Path | None = None) -> dict:
    """The run config of a converted checkpoint: `model=gnt experiment=paper` at the checkpoint's sizes
    with `model.net.compat=gnt`, GNT's config's samples and source views when it gives them."""
    overrides = [
        "model=gnt",
        "experiment=paper",
        f"model.net.width={layout.width}",
        f"model.net.n_blocks={layout.depth}",
        f"model.net.heads={HEADS}",
        f"model.net.n_freqs={N_FREQS}",
        "model.net.compat=gnt",
        "model.net.encoder_input_scale=1.0",
        "model.net.readout_consistency_prior=0.0",
        "model.net.readout_source_colour=false",
        f"model.net.encoder.stage_channels=[{','.join(map(str, ENCODER_CHANNELS))}]",
        f"model.net.encoder.stage_blocks=[{','.join(map(str, ENCODER_BLOCKS))}]",
        f"model.net.encoder.feature_channels={layout.feature_channels}",
    ]
    for gnt_key, key in (("N_samples", "render.n_samples"), ("num_source_views", "data.num_source_views")):
        value = _config_int(gnt_config, gnt_key, path)
        if value is not None:
            overrides.append(f"{key}={value}")
    for gnt_key, size in (("netwidth", layout.width), ("trans_depth", layout.depth)):
        value = _config_int(gnt_config, gnt_key, path)
        if value is not None and value != size:
            raise UserError(f"{path}: {gnt_key} = {value}, but the checkpoint's network has {size}")
    config = container_dict(compose_config(*overrides))
    read_run_settings(config)  # what eval will read: checked now
    return config


def _flat(node: Mapping, prefix: str) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in node.items():
        flat |= _flat(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value}
    return flat


def _override_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"[{','.join(map(_override_value, value))}]"
    return str(value)


def finetune_command(config: Mapping, path: Path) -> str:
    """The command that fine-tunes converted checkpoint `path` (run config `config`): `init_from` wants
    the network of the checkpoint, so every `model.net` key where `experiment=finetune` differs."""
    finetune = _flat(container_dict(compose_config("model=gnt", "experiment=finetune"))["model"]["net"], "model.net.")
    converted = _flat(config["model"]["net"], "model.net.")
    keys = [f"{key}={_override_value(value)}" for key, value in converted.items() if finetune.get(key) != value]
    return " ".join(["python -m pola_gnt.train", f"init_from={path}", "experiment=finetune", "model=gnt", *keys])


@dataclass(frozen=True)
class ConvertedCheckpoint:
    path: Path
    layout: GNTLayout
    network: str
    global_step: int
    config: dict  # the run config stored in it


def convert_gnt_checkpoint(
    source: Path, target: Path, gnt_config_path: Path | None = None, network: str = "coarse"
) -> ConvertedCheckpoint:
    """Convert GNT checkpoint `source` (and its config file, optional) into Pola-GNT checkpoint `target`."""
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=False)
    except Exception as err:
        raise UserError(f"{source}: cannot read GNT checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{source}: not a checkpoint of GNT's train.py (a {type(checkpoint).__name__}, not a dict)")
    layout = gnt_layout(checkpoint, source)
    gnt_config = read_gnt_config(gnt_config_path) if gnt_config_path is not None else {}
    config = converted_run_config(layout, gnt_config, gnt_config_path)
    system = GNTSystem(read_run_settings(config), config)
    # Strict: every parameter of ours comes from GNT's checkpoint, nothing is left at random.
    system.net.load_state_dict(converted_network_weights(checkpoint, layout, network), strict=True)
    scheduler = checkpoint.get("scheduler")
    step = scheduler.get("last_epoch", 0) if isinstance(scheduler, dict) else 0
    converted = {
        "state_dict": system.state_dict(),
        "hyper_parameters": {"config": config},
        "global_step": int(step),
        "epoch": 0,
        "pytorch-lightning_version": version("pytorch-lightning"),
        TRAINING_RECORD: {
            "training_scenes": training_scenes(gnt_config),
            "init_from": None,
            "converted_from": {
                "gnt_checkpoint": str(source.resolve()),
                "sha256": file_sha256(source),
                "gnt_config": str(gnt_config_path.resolve()) if gnt_config_path else None,
                "network": network,
                "gnt_code": GNT_COMMIT,
            },
        },
    }
    buffer = io.BytesIO()
    torch.save(converted, buffer)
    write_atomic(target, buffer.getvalue())
    return ConvertedCheckpoint(path=target, layout=layout, network=network, global_step=int(step), config=config)
