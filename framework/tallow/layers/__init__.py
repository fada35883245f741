"""Public building blocks for model plugins."""

from .attention import (
    Attention, AttentionLayer, AttentionMetadata, ForwardContext, forward_context,
    get_forward_context,
)
from .model import ArchConfig, BuildContext
