"""Neural model: image encoder, transformer blocks, the GNT network."""

from pola_gnt.model.encoder import ImageEncoder
from pola_gnt.model.gnt import GNT, RayOutput, SourceViews

__all__ = ["GNT", "ImageEncoder", "RayOutput", "SourceViews"]
